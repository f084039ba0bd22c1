"""Snapshots (docs/architecture.md, "Snapshots"): each snapshot's handoff, tables and chunk
plan, the rows read per chunk, and the chunks' first reads while a sink lacks them
(tidegate.chunk_reads)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..positions import Position
from .checkpoints import Checkpoints
from .leases import Leases
from .records import CheckpointRecord, SnapshotRecord, now_iso, pos_text, pos_value, ts_text
from .tx import Backend, Role

SNAPSHOT_COLS = ("pipeline, snapshot_id, kind, handoff, tables, chunks, ts_ms, status, rows, reason, who, "
                 "run_id, started_at, finished_at")


class Snapshots(Role):
    def __init__(self, backend: Backend, leases: Leases, checkpoints: Checkpoints) -> None:
        super().__init__(backend)
        self._leases, self._checkpoints = leases, checkpoints

    def begin(self, snap: SnapshotRecord, positions: Mapping[str, Position], *, epoch: int,
              reason: str | None = None, who: str | None = None,
              control: Mapping[str, Any] | None = None) -> dict[str, CheckpointRecord]:
        """Record a planned snapshot and move the sinks of ``positions`` to it (new checkpoint
        versions of kind ``snap.kind``, owing ``control``), in one transaction under ``epoch``.
        A snapshot of the pipeline still running is marked ``superseded``."""
        with self._tx(write=True) as tx:
            self._leases.check_epoch(tx, snap.pipeline, epoch)
            tx.exec("UPDATE tidegate_snapshots SET status = ?, finished_at = ? WHERE pipeline = ? AND "
                    "status = ?", ("superseded", now_iso(), snap.pipeline, "running"))
            tx.exec("DELETE FROM tidegate_snapshot_chunk_reads WHERE pipeline = ?", (snap.pipeline,))
            tx.exec(f"INSERT INTO tidegate_snapshots ({SNAPSHOT_COLS}) VALUES "
                    "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (snap.pipeline, snap.snapshot_id, snap.kind, pos_text(snap.handoff),
                     json.dumps(snap.tables, sort_keys=True), json.dumps(snap.chunks, sort_keys=True),
                     snap.ts_ms, "running", None, snap.reason, snap.who, snap.run_id, now_iso(), None))
            append = self._checkpoints.append
            return {sid: append(tx, snap.pipeline, sid, pos, run_id=snap.run_id, epoch=epoch,
                                kind=snap.kind, reason=reason, who=who, control=control)
                    for sid, pos in positions.items()}

    def get(self, pipeline: str, snapshot_id: str) -> SnapshotRecord | None:
        with self._tx() as tx:
            row = tx.one(f"SELECT {SNAPSHOT_COLS} FROM tidegate_snapshots WHERE pipeline = ? AND "
                         "snapshot_id = ?", (pipeline, snapshot_id))
        return None if row is None else _snapshot(row)

    def all(self, pipeline: str) -> list[SnapshotRecord]:
        """Every snapshot of a pipeline, oldest first."""
        with self._tx() as tx:
            rows = tx.all(f"SELECT {SNAPSHOT_COLS} FROM tidegate_snapshots WHERE pipeline = ? "
                          "ORDER BY started_at, snapshot_id", (pipeline,))
        return [_snapshot(r) for r in rows]

    def record_chunk_rows(self, pipeline: str, snapshot_id: str, chunk: int, rows: int) -> None:
        """How many rows the last read of a chunk gave (a resumed snapshot re-reads a chunk)."""
        with self._tx(write=True) as tx:
            tx.exec("INSERT INTO tidegate_snapshot_chunks (pipeline, snapshot_id, chunk, rows, read_at) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (pipeline, snapshot_id, chunk) DO UPDATE SET "
                    "rows = excluded.rows, read_at = excluded.read_at",
                    (pipeline, snapshot_id, chunk, rows, now_iso()))

    def chunk_rows(self, pipeline: str, snapshot_id: str) -> dict[int, int]:
        with self._tx() as tx:
            rows = tx.all("SELECT chunk, rows FROM tidegate_snapshot_chunks WHERE pipeline = ? AND "
                          "snapshot_id = ?", (pipeline, snapshot_id))
        return {int(c): int(n) for c, n in rows}

    def keep_read(self, pipeline: str, snapshot_id: str, chunk: int, upper: Position, items: bytes) -> None:
        """Keep a chunk's first read (its upper bound and its encoded items); a read kept already stays."""
        with self._tx(write=True) as tx:
            tx.exec("INSERT INTO tidegate_snapshot_chunk_reads (pipeline, snapshot_id, chunk, upper, items, "
                    "read_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (pipeline, snapshot_id, chunk) "
                    "DO NOTHING",
                    (pipeline, snapshot_id, chunk, pos_text(upper), items, now_iso()))

    def kept_read(self, pipeline: str, snapshot_id: str, chunk: int) -> tuple[Position, bytes] | None:
        with self._tx() as tx:
            row = tx.one("SELECT upper, items FROM tidegate_snapshot_chunk_reads WHERE pipeline = ? AND "
                         "snapshot_id = ? AND chunk = ?", (pipeline, snapshot_id, chunk))
        return None if row is None else (pos_value(row[0]), bytes(row[1]))

    def kept_chunks(self, pipeline: str) -> dict[str, list[int]]:
        """The chunks whose first read is kept, by snapshot."""
        with self._tx() as tx:
            rows = tx.all("SELECT snapshot_id, chunk FROM tidegate_snapshot_chunk_reads WHERE pipeline = ? "
                          "ORDER BY snapshot_id, chunk", (pipeline,))
        out: dict[str, list[int]] = {}
        for sid, chunk in rows:
            out.setdefault(sid, []).append(int(chunk))
        return out

    def kept_uppers(self, pipeline: str, snapshot_id: str) -> dict[int, Position]:
        """The upper bound of each chunk whose first read is kept."""
        with self._tx() as tx:
            rows = tx.all("SELECT chunk, upper FROM tidegate_snapshot_chunk_reads WHERE pipeline = ? AND "
                          "snapshot_id = ?", (pipeline, snapshot_id))
        return {int(c): pos_value(u) for c, u in rows}

    def move(self, pipeline: str, snapshot_id: str, handoff: Position,
             uppers: Mapping[int, Position]) -> None:
        """Put a snapshot's log positions (its handoff, its kept reads' upper bounds) on another
        server, in one transaction: a GTID failover places them there as it places the checkpoints."""
        with self._tx(write=True) as tx:
            tx.exec("UPDATE tidegate_snapshots SET handoff = ? WHERE pipeline = ? AND snapshot_id = ?",
                    (pos_text(handoff), pipeline, snapshot_id))
            for chunk, upper in uppers.items():
                tx.exec("UPDATE tidegate_snapshot_chunk_reads SET upper = ? WHERE pipeline = ? AND "
                        "snapshot_id = ? AND chunk = ?", (pos_text(upper), pipeline, snapshot_id, chunk))

    def forget_reads(self, pipeline: str, snapshot_id: str, through: int) -> None:
        """Let the kept reads of chunks 1..``through`` go (every sink holds them)."""
        with self._tx(write=True) as tx:
            tx.exec("DELETE FROM tidegate_snapshot_chunk_reads WHERE pipeline = ? AND snapshot_id = ? AND "
                    "chunk <= ?", (pipeline, snapshot_id, through))

    def forget_read(self, pipeline: str, snapshot_id: str, chunk: int) -> None:
        with self._tx(write=True) as tx:
            tx.exec("DELETE FROM tidegate_snapshot_chunk_reads WHERE pipeline = ? AND snapshot_id = ? AND "
                    "chunk = ?", (pipeline, snapshot_id, chunk))

    def finish(self, pipeline: str, snapshot_id: str) -> SnapshotRecord | None:
        """Mark a running snapshot completed (every sink is past its handoff), with its rows."""
        with self._tx(write=True) as tx:
            total = tx.one("SELECT COALESCE(SUM(rows), 0) FROM tidegate_snapshot_chunks WHERE "
                           "pipeline = ? AND snapshot_id = ?", (pipeline, snapshot_id))[0]
            tx.exec("UPDATE tidegate_snapshots SET status = ?, rows = ?, finished_at = ? WHERE "
                    "pipeline = ? AND snapshot_id = ? AND status = ?",
                    ("completed", int(total), now_iso(), pipeline, snapshot_id, "running"))
            tx.exec("DELETE FROM tidegate_snapshot_chunk_reads WHERE pipeline = ? AND snapshot_id = ?",
                    (pipeline, snapshot_id))
        return self.get(pipeline, snapshot_id)


def _snapshot(r: tuple) -> SnapshotRecord:
    return SnapshotRecord(r[0], r[1], r[2], pos_value(r[3]), json.loads(r[4]), json.loads(r[5]), int(r[6]),
                          r[7], None if r[8] is None else int(r[8]), r[9], r[10], r[11], ts_text(r[12]),
                          ts_text(r[13]))
