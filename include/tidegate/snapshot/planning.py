"""Snapshots planned (the handoff, the tables cut into chunks) and sinks moved into them; snapshots
every sink is past, settled (the package docstring has the method)."""


from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import SnapshotError
from ..events import (
    ControlMessage,
)
from ..filters import TableFilter, is_pattern
from ..positions import Position, SnapshotPosition, log_position, oldest
from ..sources.base import Source
from ..spec import PipelineSpec
from ..store.base import CheckpointStore
from ..store.records import CheckpointRecord, SnapshotRecord

if TYPE_CHECKING:
    from ..run import RunContext

log = logging.getLogger(__name__)

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


def snapshot_record(store: CheckpointStore, pipeline: str, snapshot_id: str) -> SnapshotRecord:
    """The snapshot a checkpoint or a read plan names; refused when the store does not know it."""
    rec = store.snapshots.get(pipeline, snapshot_id)
    if rec is None:
        raise SnapshotError(f"pipeline {pipeline!r}: a checkpoint is in snapshot {snapshot_id}, "
                            f"which the checkpoint store does not know (another store?): rewind the "
                            f"checkpoints or trigger resolve=resnapshot")
    return rec


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


# --------------------------------------------------------------------------- settling


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


