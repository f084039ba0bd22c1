"""Postgres backend, for deployments with several Airflow workers.

Checkpoint writes lock the pipeline's lease row (``SELECT ... FOR UPDATE``) and check the
epoch in the same transaction, so writes of one pipeline are serialized and fenced; other
pipelines do not wait. Migrations hold a transaction-level advisory lock.

Every connection attempt and every transaction is bounded by ``TIDEGATE_STORE_TIMEOUT_S``
(default 30 s): a server that hangs rather than dies (stopped, not gone) would otherwise hold
a run forever (see :mod:`tidegate.watchdog`). Past it the store raises a :class:`StoreError`
naming the setting, and the run fails: Airflow retries it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..watchdog import Watchdog, seconds_from_env
from .base import CheckpointStore
from .tx import StoreError, Tx

# Arbitrary, fixed: the advisory lock key all tidegate migrators agree on.
MIGRATION_LOCK_KEY = 0x7469646567617465  # "tidegate"
TIMEOUT_ENV = "TIDEGATE_STORE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 30.0


def redact(dsn: str) -> str:
    """A URL or libpq DSN with the password removed (for messages and `status`)."""
    if "://" in dsn:
        p = urlsplit(dsn)
        host = p.hostname or ""
        netloc = (f"{p.username}@" if p.username else "") + host + (f":{p.port}" if p.port else "")
        return urlunsplit((p.scheme, netloc, p.path, "", ""))
    return " ".join(kv for kv in dsn.split() if not kv.lower().startswith("password="))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class PostgresStore(CheckpointStore):
    dialect = "postgres"
    paramstyle = "format"

    def __init__(self, dsn: str):
        super().__init__()
        self._dsn = dsn
        self._timeout_s = seconds_from_env(TIMEOUT_ENV, DEFAULT_TIMEOUT_S, StoreError)
        self._conn = self._connect()

    def _connect(self) -> Any:
        import psycopg2  # imported here: the SQLite default needs no Postgres driver

        try:
            # connect_timeout bounds the whole start-up, also against a stopped server whose
            # kernel completes the TCP handshake (libpq counts whole seconds, at least 2).
            conn = psycopg2.connect(self._dsn, application_name="tidegate",
                                    connect_timeout=max(2, round(self._timeout_s)))
        except psycopg2.Error as exc:
            # libpq messages do not contain the password; the DSN is shown redacted.
            raise StoreError(f"cannot connect to the Postgres checkpoint store {self.url} "
                             f"({TIMEOUT_ENV}={self._timeout_s:g}s): {_first_line(exc)}") from None
        conn.autocommit = False
        return conn

    @property
    def url(self) -> str:
        return redact(self._dsn)

    @contextlib.contextmanager
    def _transaction(self, write: bool) -> Iterator[Any]:
        import psycopg2  # a SQLite store's process never loads libpq

        if self._conn.closed:  # the server went away since the last call: reconnect once
            self._conn = self._connect()
        conn = self._conn
        try:
            # commits on success, rolls back on error; severed if the server does not answer
            with Watchdog(conn, self._timeout_s) as dog, conn, conn.cursor() as cur:
                yield cur
        except psycopg2.Error as exc:
            if dog.fired:
                raise StoreError(
                    f"the Postgres checkpoint store {self.url} did not answer within "
                    f"{TIMEOUT_ENV}={self._timeout_s:g}s (the server hangs, or the network drops "
                    f"packets): the run stops here and the next one starts from what the store "
                    f"holds. Raise {TIMEOUT_ENV} if the server is only slow") from None
            if conn.closed:
                # The rollback on the way out fails too ("connection already closed") and hides
                # the error that says why: report that one.
                why = exc.__context__ if isinstance(exc, psycopg2.InterfaceError) and exc.__context__ else exc
                raise StoreError(f"the Postgres checkpoint store {self.url} went away: "
                                 f"{_first_line(why)}") from exc
            raise

    def _lock_migrations(self, tx: Tx) -> None:
        tx.exec("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK_KEY,))

    def _for_update(self) -> str:
        return " FOR UPDATE"

    def close(self) -> None:
        with self._lock:
            self._conn.close()
