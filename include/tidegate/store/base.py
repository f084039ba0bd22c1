"""The checkpoint store: one implementation over SQL, two backends (SQLite, Postgres).

Everything a run commits goes through one short database transaction. Checkpoint writes and
rewinds lock the pipeline's lease row first (SQLite: ``BEGIN IMMEDIATE``; Postgres:
``SELECT ... FOR UPDATE``) and compare the writer's epoch in that same transaction, so a
zombie whose lease was taken over can never move a checkpoint, even in a race.
"""

from __future__ import annotations

import abc
import contextlib
import json
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import StaleEpochError, TidegateError
from ..positions import Position
from . import migrations
from .records import (
    CheckpointRecord,
    Incident,
    JournalEntry,
    JournalSink,
    SnapshotRecord,
    TableColumns,
    checkpoint_key,
    now_iso,
    pos_text,
    pos_value,
    ts_text,
)

CKPT_COLS = ("pipeline, sink_id, version, position, run_id, epoch, written_at, kind, reason, who, "
             "source_version, control")
SNAPSHOT_COLS = ("pipeline, snapshot_id, kind, handoff, tables, chunks, ts_ms, status, rows, reason, who, "
                 "run_id, started_at, finished_at")
INCIDENT_COLS = ("id, pipeline, kind, from_position, to_position, detected_at, detail, run_id, "
                 "resolved, resolution, resolved_by, reason, resolved_at")


class StoreError(TidegateError):
    """The checkpoint store cannot be opened or used as asked."""


class _Tx:
    """A cursor inside one database transaction; SQL uses ``?`` placeholders everywhere."""

    def __init__(self, cur: Any, paramstyle: str):
        self.cur = cur
        self.paramstyle = paramstyle

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.paramstyle == "format" else sql

    def exec(self, sql: str, params: tuple = ()) -> Any:
        self.cur.execute(self._sql(sql), params)
        return self.cur

    def one(self, sql: str, params: tuple = ()) -> tuple | None:
        # fetchall: a half-read RETURNING statement would keep SQLite from committing.
        rows = self.exec(sql, params).fetchall()
        return rows[0] if rows else None

    def all(self, sql: str, params: tuple = ()) -> list[tuple]:
        return self.exec(sql, params).fetchall()


class CheckpointStore(abc.ABC):
    dialect: str = ""
    paramstyle: str = "qmark"

    def __init__(self) -> None:
        # One connection per store; the lock makes a store safe to share between threads.
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ backend hooks

    @abc.abstractmethod
    def _transaction(self, write: bool) -> contextlib.AbstractContextManager[Any]:
        """A cursor in a transaction: committed on exit, rolled back on error."""

    def _lock_migrations(self, tx: _Tx) -> None:  # noqa: B027 - Postgres overrides
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
    def _tx(self, write: bool = False) -> Iterator[_Tx]:
        with self._lock, self._transaction(write) as cur:
            yield _Tx(cur, self.paramstyle)

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

    # ------------------------------------------------------------------ lease / fencing

    def acquire_lease(self, pipeline: str, run_id: str) -> int:
        """Take the pipeline's lease for a run; returns the new fencing epoch (1, 2, ...).
        Every earlier holder's epoch becomes stale at once."""
        with self._tx(write=True) as tx:
            return self._bump_epoch(tx, pipeline, run_id)

    @staticmethod
    def _bump_epoch(tx: _Tx, pipeline: str, run_id: str) -> int:
        return tx.one(
            "INSERT INTO tidegate_leases (pipeline, epoch, run_id, acquired_at) VALUES (?, 1, ?, ?) "
            "ON CONFLICT (pipeline) DO UPDATE SET epoch = tidegate_leases.epoch + 1, "
            "run_id = excluded.run_id, acquired_at = excluded.acquired_at RETURNING epoch",
            (pipeline, run_id, now_iso()))[0]

    def current_epoch(self, pipeline: str) -> int | None:
        with self._tx() as tx:
            row = tx.one("SELECT epoch FROM tidegate_leases WHERE pipeline = ?", (pipeline,))
        return None if row is None else row[0]

    def lease(self, pipeline: str) -> dict[str, Any] | None:
        with self._tx() as tx:
            row = tx.one("SELECT epoch, run_id, acquired_at FROM tidegate_leases WHERE pipeline = ?",
                         (pipeline,))
        return None if row is None else {"epoch": row[0], "run_id": row[1], "acquired_at": ts_text(row[2])}

    def _check_epoch(self, tx: _Tx, pipeline: str, epoch: int) -> None:
        row = tx.one(f"SELECT epoch FROM tidegate_leases WHERE pipeline = ?{self._for_update()}",
                     (pipeline,))
        current = None if row is None else row[0]
        if current != epoch:
            raise StaleEpochError(
                f"pipeline {pipeline!r}: refused a checkpoint write under epoch {epoch}; the "
                f"current lease epoch is {current} (another run took the lease: this writer is stale)")

    # ------------------------------------------------------------------ checkpoints

    def write_checkpoint(self, pipeline: str, sink_id: str, position: Position, *,
                         run_id: str | None, epoch: int) -> CheckpointRecord:
        """Record a new version of one sink's checkpoint (refused under a stale epoch)."""
        return self.write_checkpoints(pipeline, {sink_id: position}, run_id=run_id, epoch=epoch)[sink_id]

    def write_checkpoints(self, pipeline: str, positions: Mapping[str, Position], *,
                          run_id: str | None, epoch: int, kind: str = "write",
                          reason: str | None = None, who: str | None = None,
                          control: Mapping[str, Any] | None = None) -> dict[str, CheckpointRecord]:
        """Record new versions of several sinks' checkpoints in one transaction. ``kind`` says
        what moved them: ``write`` (a delivery), ``adopt`` (a sink-side record), ``head``
        (placed at the head), ``skip`` (a range with nothing to deliver), or a move that is not
        a delivery (``failover``, ``accept_gap``, ``rewind``, ``resnapshot``). ``control``: a
        control message (JSON) each of these versions owes its sink (delivered by the next run
        before anything after the position)."""
        if any(p is None for p in positions.values()):
            raise ValueError("a checkpoint position cannot be None")
        with self._tx(write=True) as tx:
            self._check_epoch(tx, pipeline, epoch)
            return {sid: self._append(tx, pipeline, sid, pos, run_id=run_id, epoch=epoch, kind=kind,
                                      reason=reason, who=who, control=control)
                    for sid, pos in positions.items()}

    def _append(self, tx: _Tx, pipeline: str, sink_id: str, position: Position, **kw: Any
                ) -> CheckpointRecord:
        key = checkpoint_key(pipeline, sink_id)
        version = tx.one("SELECT COALESCE(MAX(version), 0) FROM tidegate_checkpoints WHERE ckpt_key = ?",
                         (key,))[0] + 1
        control = kw.get("control")
        rec = CheckpointRecord(pipeline, sink_id, version, position, kw.get("run_id"), kw.get("epoch"),
                               now_iso(), kw.get("kind", "write"), kw.get("reason"), kw.get("who"),
                               kw.get("source_version"), dict(control) if control else None)
        tx.exec(f"INSERT INTO tidegate_checkpoints (ckpt_key, {CKPT_COLS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (key, pipeline, sink_id, version, pos_text(position), rec.run_id, rec.epoch,
                 rec.written_at, rec.kind, rec.reason, rec.who, rec.source_version,
                 json.dumps(rec.control, sort_keys=True) if rec.control else None))
        return rec

    def get_checkpoint(self, pipeline: str, sink_id: str) -> CheckpointRecord | None:
        """The current (highest) version of a sink's checkpoint; None when it has none."""
        with self._tx() as tx:
            row = tx.one(f"SELECT {CKPT_COLS} FROM tidegate_checkpoints WHERE ckpt_key = ? "
                         "ORDER BY version DESC LIMIT 1", (checkpoint_key(pipeline, sink_id),))
        return None if row is None else _ckpt(row)

    def checkpoints(self, pipeline: str) -> dict[str, CheckpointRecord]:
        """The current checkpoint of every sink of a pipeline that has one."""
        with self._tx() as tx:
            rows = tx.all(
                f"SELECT {CKPT_COLS} FROM tidegate_checkpoints c WHERE pipeline = ? AND version = "
                "(SELECT MAX(version) FROM tidegate_checkpoints m WHERE m.ckpt_key = c.ckpt_key) "
                "ORDER BY sink_id", (pipeline,))
        return {r[1]: _ckpt(r) for r in rows}

    def checkpoint_history(self, pipeline: str, sink_id: str, *, since: str | None = None
                           ) -> list[CheckpointRecord]:
        """Every version of a sink's checkpoint, oldest first; with ``since`` (an ISO-8601 UTC
        time as :func:`now_iso` writes it) only the versions the checkpoint had from then on:
        the one current at ``since`` and every later one."""
        key = checkpoint_key(pipeline, sink_id)
        sql = f"SELECT {CKPT_COLS} FROM tidegate_checkpoints WHERE ckpt_key = ?"
        params: tuple = (key,)
        if since is not None:
            sql += (" AND version >= COALESCE((SELECT MAX(version) FROM tidegate_checkpoints WHERE "
                    "ckpt_key = ? AND written_at <= ?), 0)")
            params = (key, key, since)
        with self._tx() as tx:
            rows = tx.all(sql + " ORDER BY version", params)
        return [_ckpt(r) for r in rows]

    def checkpoint_version(self, pipeline: str, sink_id: str, version: int) -> CheckpointRecord | None:
        with self._tx() as tx:
            row = tx.one(f"SELECT {CKPT_COLS} FROM tidegate_checkpoints WHERE ckpt_key = ? AND version = ?",
                         (checkpoint_key(pipeline, sink_id), version))
        return None if row is None else _ckpt(row)

    def rewind_checkpoint(self, pipeline: str, sink_id: str, to_version: int, *, reason: str,
                          who: str | None = None) -> CheckpointRecord:
        """Restore the position of an earlier version as a new version (history is kept).

        A rewind also takes the lease (bumps the epoch): a run in flight would otherwise
        overwrite the rewind with its next write; now that write is refused as stale."""
        if not (reason or "").strip():
            raise ValueError("a rewind needs a reason")
        with self._tx(write=True) as tx:
            row = tx.one(f"SELECT {CKPT_COLS} FROM tidegate_checkpoints WHERE ckpt_key = ? AND version = ?",
                         (checkpoint_key(pipeline, sink_id), to_version))
            if row is None:
                raise StoreError(f"{checkpoint_key(pipeline, sink_id)} has no version {to_version}")
            epoch = self._bump_epoch(tx, pipeline, f"rewind:{who or 'operator'}")
            return self._append(tx, pipeline, sink_id, _ckpt(row).position, run_id=None, epoch=epoch,
                                kind="rewind", reason=reason, who=who, source_version=to_version)

    def pipelines(self) -> list[str]:
        """Every pipeline the store knows (checkpoints, leases or incidents)."""
        with self._tx() as tx:
            rows = tx.all("SELECT pipeline FROM tidegate_checkpoints UNION SELECT pipeline FROM "
                          "tidegate_leases UNION SELECT pipeline FROM tidegate_incidents")
        return sorted({r[0] for r in rows})

    # ------------------------------------------------------------------ source identity

    def get_source_identity(self, pipeline: str) -> dict[str, Any] | None:
        with self._tx() as tx:
            row = tx.one("SELECT identity FROM tidegate_source_identity WHERE pipeline = ?", (pipeline,))
        return None if row is None else json.loads(row[0])

    def set_source_identity(self, pipeline: str, identity: Mapping[str, Any], *,
                            epoch: int | None = None) -> None:
        """Store the identity of the server the checkpoints belong to (fenced when ``epoch``)."""
        with self._tx(write=True) as tx:
            if epoch is not None:
                self._check_epoch(tx, pipeline, epoch)
            tx.exec("INSERT INTO tidegate_source_identity (pipeline, identity, updated_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (pipeline) DO UPDATE SET identity = excluded.identity, "
                    "updated_at = excluded.updated_at",
                    (pipeline, json.dumps(dict(identity), sort_keys=True, default=str), now_iso()))

    # ------------------------------------------------------------------ incidents

    def record_incident(self, pipeline: str, kind: str, from_position: Position | None,
                        to_position: Position | None, *, detail: str | None = None,
                        run_id: str | None = None, resolved: bool = False,
                        resolution: str | None = None, who: str | None = None,
                        reason: str | None = None) -> Incident:
        """Record a continuity incident. Unresolved incidents halt the pipeline; an incident
        that needed no operator (GTID failover) is recorded already resolved."""
        now = now_iso()
        with self._tx(write=True) as tx:
            iid = tx.one(
                "INSERT INTO tidegate_incidents (pipeline, kind, from_position, to_position, detail, "
                "run_id, detected_at, resolved, resolution, resolved_by, reason, resolved_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (pipeline, kind, pos_text(from_position), pos_text(to_position), detail, run_id, now,
                 bool(resolved), resolution, who, reason, now if resolved else None))[0]
        return self.incident(iid)

    def incident(self, incident_id: int) -> Incident:
        with self._tx() as tx:
            row = tx.one(f"SELECT {INCIDENT_COLS} FROM tidegate_incidents WHERE id = ?", (incident_id,))
        if row is None:
            raise StoreError(f"no incident {incident_id}")
        return _incident(row)

    def incidents(self, pipeline: str | None = None, *, unresolved_only: bool = False) -> list[Incident]:
        where, params = [], []
        if pipeline is not None:
            where.append("pipeline = ?")
            params.append(pipeline)
        if unresolved_only:
            where.append("resolved = ?")
            params.append(False)
        sql = f"SELECT {INCIDENT_COLS} FROM tidegate_incidents"
        sql += (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
        with self._tx() as tx:
            return [_incident(r) for r in tx.all(sql, tuple(params))]

    def resolve_incident(self, incident_id: int, *, resolution: str, who: str, reason: str) -> Incident:
        if not (reason or "").strip():
            raise ValueError("resolving an incident needs a reason")
        with self._tx(write=True) as tx:
            n = tx.exec("UPDATE tidegate_incidents SET resolved = ?, resolution = ?, resolved_by = ?, "
                        "reason = ?, resolved_at = ? WHERE id = ? AND resolved = ?",
                        (True, resolution, who, reason, now_iso(), incident_id, False)).rowcount
        if n != 1:
            raise StoreError(f"incident {incident_id} does not exist or is already resolved")
        return self.incident(incident_id)

    def is_halted(self, pipeline: str) -> bool:
        """A pipeline is halted while it has an unresolved incident."""
        return bool(self.incidents(pipeline, unresolved_only=True))

    # ------------------------------------------------------------------ table columns

    def record_table_columns(self, pipeline: str, schema: str, table: str, position: Position,
                             columns: list[dict[str, str]]) -> None:
        """Remember that the table had ``columns`` as of ``position``. A fact about the source
        log, not progress: not fenced, and recording the same fact again changes nothing."""
        with self._tx(write=True) as tx:
            tx.exec("INSERT INTO tidegate_table_columns (pipeline, schema_name, table_name, position, "
                    "columns, seen_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (pipeline, schema, table, pos_text(position), json.dumps(columns), now_iso()))

    def table_columns(self, pipeline: str) -> list[TableColumns]:
        """Every column set remembered for the pipeline's tables, oldest record first."""
        with self._tx() as tx:
            rows = tx.all("SELECT pipeline, schema_name, table_name, position, columns, seen_at FROM "
                          "tidegate_table_columns WHERE pipeline = ? ORDER BY seen_at", (pipeline,))
        return [TableColumns(r[0], r[1], r[2], pos_value(r[3]), json.loads(r[4]), ts_text(r[5]))
                for r in rows]

    # ------------------------------------------------------------------ snapshots
    # (docs/architecture.md, "Snapshots")

    def begin_snapshot(self, snap: SnapshotRecord, positions: Mapping[str, Position], *, epoch: int,
                       reason: str | None = None, who: str | None = None,
                       control: Mapping[str, Any] | None = None) -> dict[str, CheckpointRecord]:
        """Record a planned snapshot and move the sinks of ``positions`` to it (new checkpoint
        versions of kind ``snap.kind``, owing ``control``), in one transaction under ``epoch``.
        A snapshot of the pipeline still running is marked ``superseded``."""
        with self._tx(write=True) as tx:
            self._check_epoch(tx, snap.pipeline, epoch)
            tx.exec("UPDATE tidegate_snapshots SET status = ?, finished_at = ? WHERE pipeline = ? AND "
                    "status = ?", ("superseded", now_iso(), snap.pipeline, "running"))
            tx.exec(f"INSERT INTO tidegate_snapshots ({SNAPSHOT_COLS}) VALUES "
                    "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (snap.pipeline, snap.snapshot_id, snap.kind, pos_text(snap.handoff),
                     json.dumps(snap.tables, sort_keys=True), json.dumps(snap.chunks, sort_keys=True),
                     snap.ts_ms, "running", None, snap.reason, snap.who, snap.run_id, now_iso(), None))
            return {sid: self._append(tx, snap.pipeline, sid, pos, run_id=snap.run_id, epoch=epoch,
                                      kind=snap.kind, reason=reason, who=who, control=control)
                    for sid, pos in positions.items()}

    def snapshot(self, pipeline: str, snapshot_id: str) -> SnapshotRecord | None:
        with self._tx() as tx:
            row = tx.one(f"SELECT {SNAPSHOT_COLS} FROM tidegate_snapshots WHERE pipeline = ? AND "
                         "snapshot_id = ?", (pipeline, snapshot_id))
        return None if row is None else _snapshot(row)

    def snapshots(self, pipeline: str) -> list[SnapshotRecord]:
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

    def finish_snapshot(self, pipeline: str, snapshot_id: str) -> SnapshotRecord | None:
        """Mark a running snapshot completed (every sink is past its handoff), with its rows."""
        with self._tx(write=True) as tx:
            total = tx.one("SELECT COALESCE(SUM(rows), 0) FROM tidegate_snapshot_chunks WHERE "
                           "pipeline = ? AND snapshot_id = ?", (pipeline, snapshot_id))[0]
            tx.exec("UPDATE tidegate_snapshots SET status = ?, rows = ?, finished_at = ? WHERE "
                    "pipeline = ? AND snapshot_id = ? AND status = ?",
                    ("completed", int(total), now_iso(), pipeline, snapshot_id, "running"))
        return self.snapshot(pipeline, snapshot_id)

    # ------------------------------------------------------------------ batch journal

    def journal_begin(self, pipeline: str, run_id: str, *, interval_start: Any = None,
                      interval_end: Any = None, mode: str = "incremental") -> int:
        with self._tx(write=True) as tx:
            return tx.one("INSERT INTO tidegate_journal (pipeline, run_id, mode, interval_start, "
                          "interval_end, status, started_at) VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
                          (pipeline, run_id, mode, ts_text(interval_start), ts_text(interval_end),
                           "running", now_iso()))[0]

    def journal_sink(self, journal_id: int, sink_id: str, *, start: Position | None,
                     end: Position | None, events: int, bytes: int, status: str,
                     error: str | None = None, dlq: int = 0) -> None:
        """Record (or update) what one sink received in a journaled run."""
        with self._tx(write=True) as tx:
            tx.exec("INSERT INTO tidegate_journal_sinks (journal_id, sink_id, from_position, to_position, "
                    "events, bytes, status, error, dlq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (journal_id, sink_id) DO UPDATE SET from_position = excluded.from_position, "
                    "to_position = excluded.to_position, events = excluded.events, "
                    "bytes = excluded.bytes, status = excluded.status, error = excluded.error, "
                    "dlq = excluded.dlq",
                    (journal_id, sink_id, pos_text(start), pos_text(end), events, bytes, status, error, dlq))

    def journal_finish(self, journal_id: int, status: str) -> None:
        with self._tx(write=True) as tx:
            tx.exec("UPDATE tidegate_journal SET status = ?, finished_at = ? WHERE id = ?",
                    (status, now_iso(), journal_id))

    def journal(self, pipeline: str, run_id: str | None = None) -> list[JournalEntry]:
        """Journal entries of a pipeline (of one run id: every attempt), oldest first."""
        sql = ("SELECT id, pipeline, run_id, mode, interval_start, interval_end, status, started_at, "
               "finished_at FROM tidegate_journal WHERE pipeline = ?")
        params: tuple = (pipeline,)
        if run_id is not None:
            sql, params = sql + " AND run_id = ?", (pipeline, run_id)
        with self._tx() as tx:
            rows = tx.all(sql + " ORDER BY id", params)
            sinks = {r[0]: self._journal_sinks(tx, r[0]) for r in rows}
        return [JournalEntry(r[0], r[1], r[2], r[3], r[4], r[5], r[6], ts_text(r[7]), ts_text(r[8]),
                             sinks[r[0]]) for r in rows]

    @staticmethod
    def _journal_sinks(tx: _Tx, journal_id: int) -> dict[str, JournalSink]:
        rows = tx.all("SELECT sink_id, from_position, to_position, events, bytes, status, error, dlq "
                      "FROM tidegate_journal_sinks WHERE journal_id = ? ORDER BY sink_id", (journal_id,))
        return {r[0]: JournalSink(r[0], pos_value(r[1]), pos_value(r[2]), r[3], r[4], r[5], r[6], r[7])
                for r in rows}


def _ckpt(r: tuple) -> CheckpointRecord:
    return CheckpointRecord(r[0], r[1], r[2], pos_value(r[3]), r[4], r[5], ts_text(r[6]), r[7], r[8], r[9],
                            r[10], json.loads(r[11]) if r[11] else None)


def _snapshot(r: tuple) -> SnapshotRecord:
    return SnapshotRecord(r[0], r[1], r[2], pos_value(r[3]), json.loads(r[4]), json.loads(r[5]), int(r[6]),
                          r[7], None if r[8] is None else int(r[8]), r[9], r[10], r[11], ts_text(r[12]),
                          ts_text(r[13]))


def _incident(r: tuple) -> Incident:
    return Incident(r[0], r[1], r[2], pos_value(r[3]), pos_value(r[4]), ts_text(r[5]), r[6], r[7],
                    bool(r[8]), r[9], r[10], r[11], ts_text(r[12]))
