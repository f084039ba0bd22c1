"""A deadline for the blocking calls of a database client that has none of its own.

A server that hangs (its processes stopped, not dead) still has a kernel that accepts
connections and acknowledges what is sent: no connection breaks, TCP keepalives are answered,
and a server-side ``statement_timeout`` never fires. libpq then waits for the answer forever.
:class:`Watchdog` severs the connection's socket (``shutdown``) once the deadline passes: the
blocked call sees the connection end and fails, and the caller raises an error that names the
setting whose deadline it was.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any


class Watchdog:
    """``with Watchdog(conn, seconds) as dog:`` severs ``conn`` (anything with ``fileno()``)
    if the block is still running after ``seconds``; ``dog.fired`` says whether it did."""

    def __init__(self, conn: Any, seconds: float):
        self.fired = False
        self._conn = conn
        self._timer = threading.Timer(seconds, self._sever)
        self._timer.daemon = True

    def __enter__(self) -> Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def _sever(self) -> None:
        self.fired = True
        try:
            # shutdown() acts on the socket, not on a descriptor: shutting down a duplicate
            # wakes the call blocked on the client's own descriptor.
            with socket.socket(fileno=os.dup(self._conn.fileno())) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except Exception:  # noqa: BLE001, S110 - closed meanwhile: nothing left to sever
            pass


def seconds_from_env(name: str, default: float, error: type[Exception]) -> float:
    """A positive number of seconds from the environment variable ``name`` (``default`` when
    unset); anything else raises ``error`` naming the variable."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise error(f"{name}={raw!r} is not a positive number of seconds (e.g. {default:g})")
    return value
