"""The checkpoint store: one implementation over SQL, two backends (SQLite, Postgres).

A store is its backend (connection, transactions, migrations) and one object per role, each
the SQL of its own tables: ``store.checkpoints`` (versions, pipelines, source identity),
``store.leases``, ``store.incidents``, ``store.runs`` (journal and run records),
``store.snapshots`` and ``store.columns``. The roles share the backend's transactions.

Everything a run commits goes through one short database transaction. Checkpoint writes and
rewinds lock the pipeline's lease row first (SQLite: ``BEGIN IMMEDIATE``; Postgres:
``SELECT ... FOR UPDATE``) and compare the writer's epoch in that same transaction, so a
zombie whose lease was taken over can never move a checkpoint, even in a race.
"""

from __future__ import annotations

import abc
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from . import migrations
from .checkpoints import Checkpoints
from .columns import Columns
from .incidents import Incidents
from .leases import Leases
from .records import now_iso
from .runs import Runs
from .snapshots import Snapshots
from .tx import StoreError, Tx

__all__ = ["CheckpointStore", "StoreError"]


class CheckpointStore(abc.ABC):
    dialect: str = ""
    paramstyle: str = "qmark"

    def __init__(self) -> None:
        # One connection per store; the lock makes a store safe to share between threads.
        self._lock = threading.RLock()
        # The roles; the ones that must be atomic with another are handed it (tx shared).
        self.leases = Leases(self)
        self.checkpoints = Checkpoints(self, self.leases)
        self.snapshots = Snapshots(self, self.leases, self.checkpoints)
        self.incidents = Incidents(self)
        self.runs = Runs(self)
        self.columns = Columns(self)

    # ------------------------------------------------------------------ backend hooks

    @abc.abstractmethod
    def _transaction(self, write: bool) -> contextlib.AbstractContextManager[Any]:
        """A cursor in a transaction: committed on exit, rolled back on error."""

    def _lock_migrations(self, tx: Tx) -> None:  # noqa: B027 - Postgres overrides
        """Serialize concurrent migrators (SQLite's BEGIN IMMEDIATE already does)."""

    def _for_update(self) -> str:
        return ""

    @abc.abstractmethod
    def close(self) -> None: ...

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """Where the store lives, without any password."""

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _tx(self, write: bool = False) -> Iterator[Tx]:
        with self._lock, self._transaction(write) as cur:
            yield Tx(cur, self.paramstyle)

    # ------------------------------------------------------------------ migrations

    def migrate(self) -> int:
        """Apply the migrations this store lacks; returns the schema version."""
        with self._tx(write=True) as tx:
            self._lock_migrations(tx)
            tx.exec(migrations.render(migrations.VERSION_TABLE, self.dialect))
            applied = {r[0] for r in tx.all("SELECT version FROM tidegate_schema_version")}
            if applied and max(applied) > migrations.LATEST:
                raise StoreError(f"checkpoint store schema version {max(applied)} is newer than this "
                                 f"tidegate understands ({migrations.LATEST}): upgrade tidegate")
            # By membership, not "above the highest": migrations written on branches at the same
            # time may land in a store in either order.
            for version, description, statements in migrations.MIGRATIONS:
                if version not in applied:
                    for sql in statements:
                        tx.exec(migrations.render(sql, self.dialect))
                    tx.exec("INSERT INTO tidegate_schema_version VALUES (?, ?, ?)",
                            (version, description, now_iso()))
        return self.schema_version()

    def schema_version(self) -> int:
        with self._tx() as tx:
            return tx.one("SELECT COALESCE(MAX(version), 0) FROM tidegate_schema_version")[0]
