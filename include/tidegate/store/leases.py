"""Leases and fencing: who may move a pipeline's checkpoints.

A run takes the pipeline's lease (a new epoch); every earlier holder's epoch is stale at once.
Writes that must be fenced lock the lease row and compare the writer's epoch in their own
transaction (:meth:`Leases.check_epoch`), so a zombie can never move a checkpoint, even in a race.
"""

from __future__ import annotations

from typing import Any

from ..errors import StaleEpochError
from .records import now_iso, ts_text
from .tx import Role, Tx


class Leases(Role):
    def acquire(self, pipeline: str, run_id: str) -> int:
        """Take the pipeline's lease for a run; returns the new fencing epoch (1, 2, ...).
        Every earlier holder's epoch becomes stale at once."""
        with self._tx(write=True) as tx:
            return self.bump_epoch(tx, pipeline, run_id)

    @staticmethod
    def bump_epoch(tx: Tx, pipeline: str, run_id: str) -> int:
        """Take the lease inside the caller's transaction ``tx``; returns the new epoch."""
        return tx.one(
            "INSERT INTO tidegate_leases (pipeline, epoch, run_id, acquired_at) VALUES (?, 1, ?, ?) "
            "ON CONFLICT (pipeline) DO UPDATE SET epoch = tidegate_leases.epoch + 1, "
            "run_id = excluded.run_id, acquired_at = excluded.acquired_at RETURNING epoch",
            (pipeline, run_id, now_iso()))[0]

    def epoch(self, pipeline: str) -> int | None:
        with self._tx() as tx:
            row = tx.one("SELECT epoch FROM tidegate_leases WHERE pipeline = ?", (pipeline,))
        return None if row is None else row[0]

    def get(self, pipeline: str) -> dict[str, Any] | None:
        with self._tx() as tx:
            row = tx.one("SELECT epoch, run_id, acquired_at FROM tidegate_leases WHERE pipeline = ?",
                         (pipeline,))
        return None if row is None else {"epoch": row[0], "run_id": row[1], "acquired_at": ts_text(row[2])}

    def check_epoch(self, tx: Tx, pipeline: str, epoch: int) -> None:
        """Refuse a write under ``epoch`` unless it is the lease's current epoch. Runs inside the
        writer's transaction ``tx`` and locks the lease row (SQLite: the writer's ``BEGIN
        IMMEDIATE``; Postgres: ``FOR UPDATE``), so no lease can change before the write commits."""
        row = tx.one(f"SELECT epoch FROM tidegate_leases WHERE pipeline = ?{self._backend._for_update()}",
                     (pipeline,))
        current = None if row is None else row[0]
        if current != epoch:
            raise StaleEpochError(
                f"pipeline {pipeline!r}: refused a checkpoint write under epoch {epoch}; the "
                f"current lease epoch is {current} (another run took the lease: this writer is stale)")
