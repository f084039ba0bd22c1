"""Snapshots: the tables' current rows as ``op: "r"`` events, then the log from the handoff.

The method (docs/architecture.md, "Snapshots", has the argument in full):

1. Capture the handoff ``H`` before any chunk is read: the source head (``start: snapshot``),
   where streaming restarts after a loss (``resolve=resnapshot``), or the lowest sink checkpoint
   (a resnapshot of a healthy pipeline, so nothing after it is lost for other tables).
2. Cut each table into primary-key chunks and read them, each in its own short transaction,
   without locks (in parallel Spark tasks, or in-process for ``tidegate run``).
3. Deliver every chunk's rows, then the log from ``H``.

Every row is read after ``H``, so it already holds every change committed before ``H`` (and
maybe some after); the log from ``H`` then brings every change after ``H``, each after its key's
snapshot row. Replaying a sink's events per key therefore ends in the table's current content.

Progress is a position: :class:`~tidegate.positions.SnapshotPosition` ``(snapshot, chunk, H)``
means "chunks 1..chunk delivered". The snapshot's item stream is, per chunk, its rows as one
"transaction" whose last row ends at ``SnapshotPosition(chunk)``, then the
``snapshot_completed`` control message ending at ``H``, then the log. Checkpoints, sink-side
records, adoption and the coordinator treat it like any other stream: a killed run resumes at
the next chunk; a sink that is behind gets the chunks it lacks. ``snapshot_started`` is owed by
the checkpoint versions that start the snapshot (delivered before the first chunk).

Envelopes: ``op: "r"``, ``before: null``, ``after`` = the row, ``key`` = the primary key,
``tx_id`` = ``snapshot:{id}``, ``event_id`` = the primary key's JSON (so a resumed snapshot
re-sends the same idempotency keys), ``source.snapshot`` ``"true"`` (``"last"`` for the last
row of a table), ``ts_ms`` = when the snapshot was planned, ``source.position`` =
``{"snapshot", "chunk"}``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from .errors import SnapshotError
from .events import (
    ChangeEvent,
    ControlMessage,
    PositionMark,
    encode_row,
    key_json_bytes,
    orjson_formats_like_stdlib,
)
from .filters import ColumnFilters, TableFilter, is_pattern
from .positions import Position, SnapshotPosition, log_position, oldest
from .sources.base import SnapshotTable, Source, SourceItem
from .spec import PipelineSpec
from .store.base import CheckpointStore
from .store.records import CheckpointRecord, SnapshotRecord

if TYPE_CHECKING:
    from .run import RunContext

log = logging.getLogger(__name__)

@dataclasses.dataclass(frozen=True)
class ChunkRead:
    """A chunk as read: its row events, and ``upper``, a log position at or after every change
    the rows show (the log head read just after the read's view was taken)."""

    upper: Position
    events: Iterable[ChangeEvent]


# --------------------------------------------------------------------------- the plan


def new_snapshot_id() -> str:
    """Time-ordered and unique: ``20261125T101502123-9f3a``."""
    now = dt.datetime.now(dt.UTC)
    return now.strftime("%Y%m%dT%H%M%S") + f"{now.microsecond // 1000:03d}-" + secrets.token_hex(2)


def plan_snapshot(spec: PipelineSpec, source: Source, *, handoff: Position, kind: str,
                  tables: Sequence[str] | None = None, who: str | None = None,
                  reason: str | None = None) -> SnapshotRecord:
    """Name the tables, cut each into primary-key chunks (``snapshot.chunk_rows``); the record
    names no run (:meth:`SnapshotPlanner.begin` names the one that planned it)."""
    handoff = log_position(handoff)
    reads = source.snapshots()
    chosen = reads.tables(tables)
    if not chosen:
        raise SnapshotError(f"pipeline {spec.pipeline!r}: no table to snapshot (source.tables "
                            f"{list(spec.source.tables) or 'all'}; tables param "
                            f"{list(tables or []) or 'none'})")
    chunks: list[dict[str, Any]] = []
    for i, table in enumerate(chosen):
        for lo, hi in reads.chunk_plan(table, spec.snapshot.chunk_rows):
            chunks.append({"table": i, "lo": lo, "hi": hi})
    now = dt.datetime.now(dt.UTC)
    rec = SnapshotRecord(spec.pipeline, new_snapshot_id(), kind, handoff, [t.to_json() for t in chosen],
                         chunks, int(now.timestamp() * 1000), reason=reason, who=who)
    log.info("pipeline %s: snapshot %s of %s planned as %d chunk(s) of at most %d rows; the log takes "
             "over at %s", spec.pipeline, rec.snapshot_id, ", ".join(t.name for t in chosen), len(chunks),
             spec.snapshot.chunk_rows, handoff)
    return rec


def started_message(spec: PipelineSpec, rec: SnapshotRecord) -> ControlMessage:
    return ControlMessage(spec.tenant, spec.pipeline, "snapshot_started", rec.snapshot_id,
                          position_json(rec), rec.ts_ms, {
                              "snapshot": rec.snapshot_id, "tables": table_names(rec),
                              "chunks": len(rec.chunks), "handoff": rec.handoff.to_json(),
                              "kind": rec.kind, "reason": rec.reason})


def completed_message(spec: PipelineSpec, rec: SnapshotRecord, rows: int) -> ControlMessage:
    return ControlMessage(spec.tenant, spec.pipeline, "snapshot_completed", rec.snapshot_id,
                          rec.handoff.to_json(), rec.ts_ms,
                          {"snapshot": rec.snapshot_id, "tables": table_names(rec), "rows": rows},
                          tx_id=f"snapshot:{rec.snapshot_id}", tx_end=True, end_position=rec.handoff)


def position_json(rec: SnapshotRecord) -> dict[str, Any]:
    return SnapshotPosition(rec.snapshot_id, 0, rec.handoff).to_json()


def table_names(rec: SnapshotRecord) -> list[str]:
    return [f"{t['schema']}.{t['table']}" for t in rec.tables]


def running(store: CheckpointStore, pipeline: str, checkpoints: Mapping[str, Position | None]
            ) -> SnapshotRecord | None:
    """The snapshot some sink is in (its checkpoint is a position of it), if any."""
    ids = [p.snapshot_id for p in checkpoints.values() if isinstance(p, SnapshotPosition)]
    for sid in sorted(set(ids), reverse=True):  # the newest first
        rec = store.snapshots.get(pipeline, sid)
        if rec is not None:
            return rec
    return None


# --------------------------------------------------------------------------- planning


@dataclasses.dataclass(frozen=True)
class SnapshotPlanner:
    """Plans the snapshots of one run's pipeline and moves its sinks into them, on the run's
    opened ``source`` and ``store``, as ``run_id`` (the run, or its bounds step), each write under
    ``epoch_for()`` (the lease, taken when a write is due)."""

    spec: PipelineSpec
    source: Source
    store: CheckpointStore
    run_id: str
    epoch_for: Callable[[], int]

    @classmethod
    def for_run(cls, run: RunContext, source: Source) -> SnapshotPlanner:
        """As the run itself (its opened store), the lease taken under its run id."""
        store, pipeline, run_id = run.store, run.pipeline, run.run_id
        return cls(run.spec, source, store, run_id, lambda: store.leases.acquire(pipeline, run_id))

    def begin(self, *, sinks: Sequence[str], handoff: Position, kind: str,
              tables: Sequence[str] | None = None, who: str | None = None, reason: str | None = None,
              epoch: int | None = None) -> tuple[SnapshotRecord, dict[str, CheckpointRecord]]:
        """Plan a snapshot and move ``sinks`` to its start (chunk 0), owing ``snapshot_started``."""
        spec = self.spec
        rec = dataclasses.replace(plan_snapshot(spec, self.source, handoff=handoff, kind=kind, tables=tables,
                                                who=who, reason=reason), run_id=self.run_id)
        start = SnapshotPosition(rec.snapshot_id, 0, rec.handoff)
        written = self.store.snapshots.begin(rec, {sid: start for sid in sinks},
                                             epoch=self.epoch_for() if epoch is None else epoch,
                                             reason=reason or f"snapshot {rec.snapshot_id} ({kind})", who=who,
                                             control=started_message(spec, rec).record())
        return self.store.snapshots.get(spec.pipeline, rec.snapshot_id) or rec, written

    def place_new_sinks(self, checkpoints: Mapping[str, Position | None], *, upto: Position
                        ) -> dict[str, Position]:
        """``start: snapshot``: the sinks without a checkpoint start with a snapshot. On the
        pipeline's first run every sink starts a new snapshot handing off at ``upto`` (the head
        now). A sink added later joins the snapshot others are in, or starts a new one handing off
        at the lowest checkpoint (the log after it is there). Returns the sinks' new positions."""
        spec, store = self.spec, self.store
        new = sorted(sid for sid, p in checkpoints.items() if p is None)
        if spec.source.start != "snapshot" or not new:
            return {}
        current = running(store, spec.pipeline, checkpoints)
        epoch = self.epoch_for()
        if current is not None and current.status == "running":
            at = SnapshotPosition(current.snapshot_id, 0, current.handoff)
            store.checkpoints.write_many(spec.pipeline, {sid: at for sid in new}, run_id=self.run_id,
                                         epoch=epoch, kind="snapshot",
                                         reason=f"start: snapshot; joins snapshot {current.snapshot_id}",
                                         control=started_message(spec, current).record())
            log.info("pipeline %s: sinks %s join snapshot %s", spec.pipeline, ", ".join(new),
                     current.snapshot_id)
            return {sid: at for sid in new}
        lowest = oldest(checkpoints.values())
        handoff = self.source.snapshots().handoff(upto if lowest is None else log_position(lowest))
        rec, written = self.begin(sinks=new, handoff=handoff, kind="start", epoch=epoch,
                                  reason="start: snapshot")
        return {sid: w.position for sid, w in written.items()}

    def added_tables(self, checkpoints: Mapping[str, Position | None]) -> dict[str, Position]:
        """``start: snapshot``: a table added to ``source.tables`` of a running pipeline (named by
        no snapshot of the pipeline yet) is snapshotted by itself, handing off at the lowest
        checkpoint, so the other tables lose nothing and keep streaming in the same run (after its
        chunks). Every sink moves to the snapshot's start. Returns the sinks' new positions."""
        spec = self.spec
        if not spec.source.tables or None in checkpoints.values() or in_snapshot(checkpoints):
            return {}
        history = self.store.snapshots.all(spec.pipeline)
        if not history:  # a pipeline that began before it said start: snapshot: nothing is "added"
            return {}
        known = {name for rec in history for name in table_names(rec)}
        # the tables named outright (a table that comes to match a pattern later is not "added":
        # its rows arrive from the log, docs/operations.md "Filters and masking")
        named = TableFilter(spec.source.tables)
        added = [t for t in named.includes
                 if not is_pattern(t) and t not in known and named.matches(*t.split(".", 1))]
        if not added:
            return {}
        handoff = self.source.snapshots().handoff(log_position(oldest(checkpoints.values())))
        rec, written = self.begin(sinks=list(checkpoints), handoff=handoff, kind="added", tables=added,
                                  reason=f"tables added to source.tables: {', '.join(added)}")
        log.warning("pipeline %s: %s added to source.tables: snapshot %s, the log takes over at %s",
                    spec.pipeline, ", ".join(added), rec.snapshot_id, rec.handoff)
        return {sid: w.position for sid, w in written.items()}

    def resnapshot(self, *, incidents: Sequence[Any], tables: Sequence[str] | None, who: str, reason: str
                   ) -> SnapshotRecord:
        """``resolve=resnapshot``: re-load the tables and hand off to the log.

        After a loss (the open ``incidents``: a purged binlog, a lost slot, a failover without GTID
        translation) the handoff is where streaming restarts (:meth:`Source.restart_stream`) and
        every table is re-loaded: the snapshot covers the lost range. On a healthy pipeline the
        handoff is the lowest checkpoint, so the log after it still reaches every sink (a sink ahead
        of it receives the stretch between them again, with the same idempotency keys). Every sink
        moves to the snapshot's start as a new checkpoint version, so no older sink-side record
        pulls a sink back."""
        spec, source, store = self.spec, self.source, self.store
        losses = [i for i in incidents if i.kind != "schema_change"]
        if losses and tables:
            raise SnapshotError(
                f"pipeline {spec.pipeline!r}: incident(s) {', '.join('#' + str(i.id) for i in losses)} lost "
                f"changes of every captured table; a resnapshot of only {', '.join(tables)} would leave a "
                f"silent gap in the others: trigger resolve=resnapshot without tables (or accept_gap)")
        epoch = self.epoch_for()
        stored = store.checkpoints.current(spec.pipeline)
        if losses:
            if any(i.kind == "failover" for i in losses):  # the new server is the pipeline's from now on
                store.checkpoints.set_source_identity(spec.pipeline, source.identity(), epoch=epoch)
            handoff = source.restart_stream()
        else:
            lowest = oldest(stored[s.id].position for s in spec.sinks if s.id in stored)
            handoff = source.head() if lowest is None else log_position(lowest)
        handoff = source.snapshots().handoff(handoff)
        what = ", ".join(f"#{i.id} ({i.kind})" for i in losses) or "none open"
        rec, _ = self.begin(sinks=[s.id for s in spec.sinks], handoff=handoff, kind="resnapshot", epoch=epoch,
                            tables=tables, who=who, reason=f"resnapshot (incidents {what}): {reason}")
        log.warning("pipeline %s: resnapshot %s of %s planned by %s (incidents %s): %s", spec.pipeline,
                    rec.snapshot_id, ", ".join(table_names(rec)), who, what, reason)
        return rec


# --------------------------------------------------------------------------- reading


def chunk_table(rec: SnapshotRecord, chunk: int) -> SnapshotTable:
    return SnapshotTable.from_json(rec.tables[rec.chunks[chunk - 1]["table"]])


class ChangedKeys:
    """The keys of a snapshot's tables that the log changes after the handoff, each with where
    the log first changes it (the end of that transaction), scanned up to the highest upper
    bound of the chunks read so far; and a chunk's rows of the keys changed up to its own upper
    bound, dropped.

    Why (docs/architecture.md, "Snapshots"): a chunk row shows its key as of the chunk's read,
    somewhere between the handoff and the chunk's upper bound. If the log changes the key in that
    stretch, the row may be newer than some of the log events that follow it, and a consumer
    would see the key go back in time; the log alone then carries the key (every change after
    the handoff is in it, each with the full row). A key the log does not change up to the upper
    bound is exactly the row, and every later change of it follows the row. Deciding by the
    chunk's own upper bound (not by how far the scan went for other chunks) makes a read give
    the same events whichever run, and in whichever order, the chunks are read
    (tidegate.chunk_reads)."""

    def __init__(self, rec: SnapshotRecord, source: Source):
        self.source = source
        self.key_columns = {(t["schema"], t["table"]): list(t["key"]) for t in rec.tables}
        self.keys: dict[tuple[str, str], dict[bytes, Position]] = {}
        self.scanned: Position = rec.handoff
        self.dropped = 0

    def scan_to(self, upper: Position) -> None:
        if not upper > self.scanned:
            return
        pending: list[tuple[tuple[str, str], bytes]] = []  # the keys of the transaction read so far
        for item in self.source.read(self.scanned, upper):
            if not isinstance(item, ChangeEvent):
                continue
            name = (item.schema, item.table)
            cols = self.key_columns.get(name)
            if cols is not None:
                pending.append((name, bytes(item.key_bytes)))
                if item.op == "u" and item.before:  # a key change: the old key changed too
                    pending.append((name, key_json_bytes({c: item.before.get(c) for c in cols})))
            if item.tx_end:
                self._changed_at(pending, item.end_position or upper)
                pending = []
        self._changed_at(pending, upper)
        self.scanned = upper

    def _changed_at(self, keys: list[tuple[tuple[str, str], bytes]], at: Position) -> None:
        for name, key in keys:
            self.keys.setdefault(name, {}).setdefault(key, at)

    def drop_changed(self, table: SnapshotTable, events: Iterable[ChangeEvent],
                     upper: Position) -> Iterator[ChangeEvent]:
        """``events`` (a chunk read with upper bound ``upper``, scanned to) without the rows of
        keys the log changes at or before ``upper``."""
        changed = self.keys.get((table.schema, table.table))
        if not changed:
            yield from events
            return
        held: ChangeEvent | None = None
        for ev in events:
            at = changed.get(bytes(ev.key_bytes))
            if at is not None and not upper < at:
                self.dropped += 1
                if ev.snapshot == "last" and held is not None:
                    held = marked(held, "last")  # the table's last row moves to the row before
                continue
            if held is not None:
                yield held
            held = ev
        if held is not None:
            yield held


def marked(ev: ChangeEvent, mark: str) -> ChangeEvent:
    """``ev`` with another ``source.snapshot`` mark (a new event: its envelope serialized anew)."""
    env = orjson.loads(ev.value) if ev.after is None else {"after": ev.after, "key": ev.key}
    # A plain ChangeEvent: a row rebuilt from its shipped form reads its fields from its bytes,
    # and the new event's bytes are made from its fields.
    fields = {f.name: getattr(ev, f.name) for f in dataclasses.fields(ChangeEvent) if f.init}
    return ChangeEvent(**{**fields, "snapshot": mark, "after": env["after"], "key": env["key"]})


def end_chunk(events: Iterable[ChangeEvent], end: SnapshotPosition, store: CheckpointStore,
              rec: SnapshotRecord, chunk: int) -> Iterator[SourceItem]:
    """A chunk's rows as one transaction ending at ``end`` (an empty chunk: a position mark)."""
    held: ChangeEvent | None = None
    n = 0
    for ev in events:
        if held is not None:
            yield held
        held, n = ev, n + 1
    store.snapshots.record_chunk_rows(rec.pipeline, rec.snapshot_id, chunk, n)
    if held is None:
        yield PositionMark(end)
    else:
        held._mark_tx_end(end)
        yield held


def read_chunk(spec: PipelineSpec, source: Source, rec: SnapshotRecord, chunk: int,
               connector: str | None = None) -> ChunkRead:
    """One chunk (1-based): its upper bound and its row events, in key order; the last row of
    a table's last chunk is marked ``"last"``."""
    c = rec.chunks[chunk - 1]
    table = chunk_table(rec, chunk)
    build = RowEvents(spec, rec, table, chunk, connector or source.connector, source.column_filters)
    upper, rows = source.snapshots().chunk_rows(table, c["lo"], c["hi"], build)
    return ChunkRead(upper, _marked_rows(rows, build, final=c["hi"] is None))


def _marked_rows(rows: Iterable[Mapping[str, Any]], build: RowEvents, final: bool) -> Iterator[ChangeEvent]:
    held: Mapping[str, Any] | None = None
    for row in rows:
        if held is not None:
            yield build(held, "true")
        held = row
    if held is not None:
        yield build(held, "last" if final else "true")


class RowEvents:
    """Builds the ``op: r`` event of a row of one chunk (see the module docstring)."""

    def __init__(self, spec: PipelineSpec, rec: SnapshotRecord, table: SnapshotTable, chunk: int,
                 connector: str, column_filters: ColumnFilters | None = None):
        self.spec, self.table, self.connector = spec, table, connector
        # the table's column rules, applied to each row as it is read (filters.py), as the
        # source's reads apply them to log events: same value, same hash
        self.transform = column_filters.for_table(table.schema, table.table) if column_filters else None
        if self.transform is not None:
            self.transform.check_key(table.key)
        self.tx_id = f"snapshot:{rec.snapshot_id}"
        self.position = {"snapshot": rec.snapshot_id, "chunk": chunk}
        self.ts_ms = rec.ts_ms
        self.n = 0
        # a source's compiled path for its raw rows (SnapshotReads.chunk_rows), if it gives them
        self.raw: Any = None

    def __call__(self, row: Mapping[str, Any] | Any, mark: str) -> ChangeEvent:
        if self.raw is not None and row.__class__ is not dict:  # a raw row: the compiled path writes it
            ev = self.raw.event(row, mark == "last", self.n + 1)
            if ev is not None:
                self.n += 1
                return ev
            row = self.raw.decode(row)
        after = encode_row(row)
        if self.transform is not None:
            after = self.transform.row(after)
        key = {c: after[c] for c in self.table.key}
        self.n += 1
        t, spec = self.table, self.spec
        # One pass over the row's floats serves the key (its values are the row's), the position
        # (a string and an int) and the envelope: each would otherwise search them again.
        floats_ok = row_floats_like_stdlib(after)
        return ChangeEvent.native(spec.tenant, spec.pipeline, self.connector, t.db, t.schema, t.table, "r",
                                  None, after, key, self.tx_id, key_json(key, floats_ok), self.position,
                                  self.ts_ms, self.n, self.n, mark, floats_checked=floats_ok)


def row_floats_like_stdlib(row: Mapping[str, Any]) -> bool:
    """:func:`~tidegate.events.orjson_formats_like_stdlib` of a row, in one flat pass: its
    values are scalars but for JSON, array and SET columns, which are searched in depth."""
    for v in row.values():
        t = type(v)
        if t is float:
            if not (v == 0.0 or 1e-4 <= abs(v) < 1e16):  # also False for NaN and the infinities
                return False
        elif t is not str and t is not int and t is not bool and v is not None \
                and not orjson_formats_like_stdlib(v):
            return False
    return True


def key_json(key: Mapping[str, Any], floats_ok: bool | None = None) -> str:
    """The primary key's JSON (key column order), the same bytes the stdlib would write.
    ``floats_ok``: the caller already knows whether orjson writes the key's floats as the stdlib."""
    if floats_ok if floats_ok is not None else orjson_formats_like_stdlib(key):
        try:
            return orjson.dumps(key).decode("utf-8")
        except TypeError:
            pass
    return json.dumps(key, ensure_ascii=False, separators=(",", ":"))


# --------------------------------------------------------------------------- housekeeping


def settle(run: RunContext) -> list[SnapshotRecord]:
    """Mark the running snapshots completed that no sink is in any more (every sink passed the
    handoff); returns them."""
    spec, store = run.spec, run.store
    stored = store.checkpoints.current(spec.pipeline)
    inside = {r.position.snapshot_id for sid, r in stored.items()
              if isinstance(r.position, SnapshotPosition) and sid in {s.id for s in spec.sinks}}
    done = []
    for rec in store.snapshots.all(spec.pipeline):
        if rec.status == "running" and rec.snapshot_id not in inside and stored:
            done.append(store.snapshots.finish(spec.pipeline, rec.snapshot_id))
            log.info("pipeline %s: snapshot %s completed (%s rows); the pipeline streams from its handoff",
                     spec.pipeline, rec.snapshot_id, done[-1].rows if done[-1] else "?")
    return done


def in_snapshot(checkpoints: Mapping[str, Position | None], sinks: Sequence[str] | None = None) -> bool:
    """Whether a chosen sink (default: all) is inside a snapshot."""
    chosen = sinks or list(checkpoints)
    return any(isinstance(checkpoints.get(s), SnapshotPosition) for s in chosen)


__all__ = ["ChangedKeys", "ChunkRead", "RowEvents", "SnapshotPlanner", "chunk_table", "completed_message",
           "end_chunk", "in_snapshot", "plan_snapshot", "read_chunk", "running", "settle"]
