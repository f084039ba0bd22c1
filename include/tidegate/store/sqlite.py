"""SQLite backend: the embedded default.

WAL mode with ``synchronous=NORMAL``: a commit is durable once it is in the WAL, which
survives a SIGKILL of any process (the OS has the pages); only a power loss can drop the last
commits, and never corrupts the file. One connection per store; writers take the database
lock up front (``BEGIN IMMEDIATE``) so the epoch check and the write are one atomic step,
and wait up to ``busy_timeout_s`` for another process's writer.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .base import CheckpointStore
from .tx import StoreError


class SqliteStore(CheckpointStore):
    dialect = "sqlite"
    paramstyle = "qmark"

    def __init__(self, path: str | os.PathLike, *, busy_timeout_s: float = 30.0):
        super().__init__()
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None,
                                         check_same_thread=False)
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = NORMAL")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the SQLite checkpoint store {self.path}: {exc}") from None

    @property
    def url(self) -> str:
        return "sqlite:///" + self.path

    @contextlib.contextmanager
    def _transaction(self, write: bool) -> Iterator[Any]:
        cur = self._conn.cursor()
        cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            yield cur
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
        else:
            cur.execute("COMMIT")
        finally:
            cur.close()

    def close(self) -> None:
        with self._lock:
            self._conn.close()
