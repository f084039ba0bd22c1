"""Processes held with SIGSTOP for the length of a ``with`` block: a server that hangs without
ending, as a stalled disk or a paused VM leaves it.

Every test that stops a server shares one lane's servers with the tests after it, so whatever
was stopped is woken when the block ends, however it ends (an assertion, a timeout, a kill).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable, Iterator
from contextlib import contextmanager


@contextmanager
def stopped(pids: Iterable[int]) -> Iterator[list[int]]:
    """SIGSTOP each of ``pids`` in order, yield those stopped, SIGCONT them in reverse on leaving.
    A process that ended between its listing and its signal (a PostgreSQL backend whose client
    left) is passed over, on the way in and on the way out."""
    held: list[int] = []
    try:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                continue
            held.append(pid)
        yield held
    finally:
        for pid in reversed(held):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
