"""Postgres backend, for deployments with several Airflow workers.

Checkpoint writes lock the pipeline's lease row (``SELECT ... FOR UPDATE``) and check the
epoch in the same transaction, so writes of one pipeline are serialized and fenced; other
pipelines do not wait. Migrations hold a transaction-level advisory lock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .base import CheckpointStore
from .tx import StoreError, Tx

# Arbitrary, fixed: the advisory lock key all tidegate migrators agree on.
MIGRATION_LOCK_KEY = 0x7469646567617465  # "tidegate"


def redact(dsn: str) -> str:
    """A URL or libpq DSN with the password removed (for messages and `status`)."""
    if "://" in dsn:
        p = urlsplit(dsn)
        host = p.hostname or ""
        netloc = (f"{p.username}@" if p.username else "") + host + (f":{p.port}" if p.port else "")
        return urlunsplit((p.scheme, netloc, p.path, "", ""))
    return " ".join(kv for kv in dsn.split() if not kv.lower().startswith("password="))


class PostgresStore(CheckpointStore):
    dialect = "postgres"
    paramstyle = "format"

    def __init__(self, dsn: str):
        super().__init__()
        self._dsn = dsn
        self._conn = self._connect()

    def _connect(self) -> Any:
        import psycopg2  # imported here: the SQLite default needs no Postgres driver

        try:
            conn = psycopg2.connect(self._dsn, application_name="tidegate")
        except psycopg2.Error as exc:
            # libpq messages do not contain the password; the DSN is shown redacted.
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreError(f"cannot connect to the Postgres checkpoint store {self.url}: {first}") from None
        conn.autocommit = False
        return conn

    @property
    def url(self) -> str:
        return redact(self._dsn)

    @contextlib.contextmanager
    def _transaction(self, write: bool) -> Iterator[Any]:
        if self._conn.closed:  # the server went away since the last call: reconnect once
            self._conn = self._connect()
        with self._conn, self._conn.cursor() as cur:  # commits on success, rolls back on error
            yield cur

    def _lock_migrations(self, tx: Tx) -> None:
        tx.exec("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK_KEY,))

    def _for_update(self) -> str:
        return " FOR UPDATE"

    def close(self) -> None:
        with self._lock:
            self._conn.close()
