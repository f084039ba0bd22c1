"""How long a source read may wait on its server: ``TIDEGATE_SOURCE_READ_TIMEOUT_S``.

A source server that hangs (stopped, not dead) keeps its connections open: its kernel accepts
and acknowledges, so neither a broken connection nor TCP keepalives ever end the wait. Every
read of a source's log, and every statement on its control connection, therefore waits at
most this long for the server to send anything; past it the read fails naming the setting,
and the run fails (Airflow retries it). A read that keeps receiving is never cut short.
"""

from __future__ import annotations

from ..errors import SourceError
from ..watchdog import seconds_from_env

READ_TIMEOUT_ENV = "TIDEGATE_SOURCE_READ_TIMEOUT_S"
DEFAULT_READ_TIMEOUT_S = 300.0


def read_timeout_s() -> float:
    """The setting's value in seconds (a bad value raises a :class:`SourceError` naming it)."""
    return seconds_from_env(READ_TIMEOUT_ENV, DEFAULT_READ_TIMEOUT_S, SourceError)
