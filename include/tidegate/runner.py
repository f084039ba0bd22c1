"""One bounded run, the same code path for `tidegate run`, the Spark job and the Airflow tasks.

A run (docs/architecture.md, "One run"): :func:`prepare_bounds` captures the bounds (the
source head now is the upper bound ``upto``; the sinks' checkpoints are where they start),
places new sinks at the head (``start: head``) and moves the checkpoints over a range that
holds nothing the pipeline delivers; when nothing is left, the run stops cheaply. Otherwise
:func:`run_pipeline` takes the pipeline lease (fencing epoch), reads (lowest start, upto] from
the source and hands it to the coordinator, which delivers sub-batch by sub-batch and commits
checkpoints as it goes; :func:`release` then lets the source recycle its log up to the lowest
checkpoint.

Every step is handed the run's :class:`~tidegate.run.RunContext` (spec, plan, run id, store and
the :class:`~tidegate.parts.Parts` its source and sinks are made by). The bounds step writes the
run's record; the delivery reads its bounds from it instead of deciding them again.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from . import snapshot
from .batching import cut_sub_batches
from .coordinator import Coordinator, RunReport
from .errors import ContinuityHalt, RunError
from .events import ControlMessage, PositionMark, is_control
from .parts import Parts, chosen_sinks
from .positions import (
    Position,
    describe_lineage,
    lineage_of_identity,
    log_position,
    lowest_start,
    same_lineage,
)
from .reading import InProcessReader, Reader, plan_reads, read_items
from .run import Bounds, RunContext
from .segments import Segment, plan_start
from .sources.base import Source, SourceItem
from .spec import PipelineSpec
from .store import CheckpointStore

if TYPE_CHECKING:
    from .sinks.base import Sink

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- bounds


def capture_bounds(run: RunContext, source: Source) -> Bounds:
    """The source head now, each sink's stored checkpoint (on the run's opened store) and the
    sinks it owes a control message; reads only."""
    spec, upto = run.spec, source.head()
    stored = run.store.checkpoints.current(spec.pipeline)
    return Bounds(spec.pipeline, upto,
                  {s.id: (stored[s.id].position if s.id in stored else None) for s in spec.sinks},
                  owed=tuple(s.id for s in spec.sinks if s.id in stored and stored[s.id].control))


class BoundsWrites:
    """The checkpoint writes a bounds step makes (new sinks placed, an idle range skipped), on
    the run's opened source and store, each under the bounds step's own lease holder
    (``bounds__<pipeline>``): a bounds step is not the delivery, and fences only what an older
    run might still write."""

    def __init__(self, run: RunContext, source: Source):
        self.spec, self.source, self.store = run.spec, source, run.store
        self.holder = "bounds__" + run.pipeline

    def epoch(self) -> int:
        return self.store.leases.acquire(self.spec.pipeline, self.holder)

    def place_at_head(self, bounds: Bounds) -> Bounds:
        """``start: head``: a sink without a checkpoint begins at the run's upper bound."""
        new = {sid: bounds.upto for sid, p in bounds.checkpoints.items() if p is None}
        if self.spec.source.start != "head" or not new:
            return bounds
        log.info("pipeline %s: sinks %s have no checkpoint; start: head places them at %s",
                 self.spec.pipeline, ", ".join(sorted(new)), bounds.upto)
        self.store.checkpoints.write_many(self.spec.pipeline, new, run_id=self.holder, epoch=self.epoch(),
                                          kind="head", reason="start: head")
        return bounds.with_checkpoints(new)

    def place_snapshots(self, bounds: Bounds) -> Bounds:
        """``start: snapshot``: sinks without a checkpoint start with a snapshot, and tables added
        to ``source.tables`` get one of their own (``snapshot.SnapshotPlanner``)."""
        if self.spec.source.start != "snapshot":
            return bounds
        planner = snapshot.SnapshotPlanner(self.spec, self.source, self.store, self.holder, self.epoch)
        if None in bounds.checkpoints.values():
            bounds = bounds.with_checkpoints(planner.place_new_sinks(bounds.checkpoints, upto=bounds.upto))
        return bounds.with_checkpoints(planner.added_tables(bounds.checkpoints))

    def skip_idle_range(self, bounds: Bounds) -> Bounds:
        """The range holds nothing this pipeline delivers (the head moved for other tables, empty
        transactions or WAL housekeeping): move every sink to ``upto`` without a delivery, so the
        run skips Spark and the next one does not look at this range again. A sink owed a control
        message stays where it is: a version written here would owe nothing, and the message would
        be lost; the run delivers it there and then moves the sink as a delivery does."""
        moved = idle_moves(bounds)
        self.store.checkpoints.write_many(self.spec.pipeline, moved, run_id=self.holder, epoch=self.epoch(),
                                          kind="skip", reason="nothing this pipeline delivers in the range")
        log.info("pipeline %s: nothing to deliver in (%s, %s]; sinks %s moved to %s", self.spec.pipeline,
                 bounds.lowest(), bounds.upto, ", ".join(sorted(moved)), bounds.upto)
        return bounds.with_checkpoints(moved)


def idle_moves(bounds: Bounds) -> dict[str, Position]:
    """The sinks an idle range moves to ``upto``: those behind it that are owed nothing."""
    return {sid: bounds.upto for sid in bounds.behind() if sid not in bounds.owed}


def bounded(run: RunContext, source: Source) -> RunContext:
    """The run (on its opened store and ``source``) with its bounds: those its bounds step
    recorded, or, when no bounds step ran (a deliver task alone recorded only the spec and the
    plan for the driver; a direct call), the bounds step run now, its decisions held by this
    attempt only. Every run has its bounds decided by the bounds step before it delivers; where
    no bounds task keeps them, each attempt decides afresh (so a cleared run that delivered
    replays its range, as a bounds task would make it)."""
    return run if run.bounds else _bounds_step(run, source, missing_ok=False, keep=False)


def prepare_bounds(run: RunContext, *, missing_ok: bool = False) -> RunContext:
    """The bounds step of a run; writes the run's record and returns the context holding it.

    Incremental: capture, place new sinks (``start: head`` / ``start: snapshot``), skip an idle
    range. Cheap: no sink is contacted (but those with a heartbeat interval, when the source has
    nothing for them: :func:`idle_heartbeats`); the lease is taken only when a checkpoint moves.
    A replay (the plan's ``replay_of``, or a cleared run that already delivered): the head, the
    checkpoints and the range the replayed run delivered to each chosen sink; it takes no lease
    and moves nothing, so it never fences a run in flight. ``missing_ok`` (backfills): a run the
    journal does not know delivered nothing (a scheduled run that had nothing to do records no
    range), so the replay has nothing to do; otherwise it is an error, raised before Spark. A
    dry run: the head and the checkpoints, nothing written but the record."""
    given = run.store
    with run.opened() as (source, store):
        return _bounds_step(run.with_store(store), source, missing_ok=missing_ok, keep=True).with_store(given)


def _bounds_step(run: RunContext, source: Source, *, missing_ok: bool, keep: bool) -> RunContext:
    """What the bounds step decides, on the run's opened store and source; written to the store
    as the run's record when ``keep``."""
    if run.plan.mode == "dry_run":
        bounds, segments = capture_bounds(run, source), None
    else:
        replay_of = replay_target(run)
        if replay_of is not None:
            bounds = _replay_bounds(run, source, replay_of, missing_ok)
        else:
            bounds = _incremental_bounds(run, source)
        segments = _read_plan(run, source, bounds)
    return run.recorded(bounds, run.store, segments, keep=keep)


def _read_plan(run: RunContext, source: Source, bounds: Bounds) -> list[Segment] | None:
    """What the delivery will read (None: nothing)."""
    if bounds.nothing_to_do(run.plan.sinks):
        return None
    if bounds.replay_of is not None:
        start = lowest_start([a for a, _ in bounds.ranges.values()])
        return plan_reads(run, source, start, max(b for _, b in bounds.ranges.values()))
    return plan_reads(run, source, bounds.lowest(run.plan.sinks), bounds.upto)


def _incremental_bounds(run: RunContext, source: Source) -> Bounds:
    writes = BoundsWrites(run, source)
    bounds = writes.place_at_head(capture_bounds(run, source))
    # start: snapshot plans one (docs/architecture.md, "Snapshots"); a sink inside a
    # snapshot has chunks to read whatever the log holds, so the range is never idle.
    bounds = writes.place_snapshots(bounds)
    if snapshot.in_snapshot(bounds.checkpoints):
        return bounds
    idle = bool(idle_moves(bounds)) and not source.has_changes(bounds.lowest(), bounds.upto)
    if idle or bounds.nothing_to_do(run.plan.sinks):
        idle_heartbeats(run, bounds)  # before the checkpoints move: a failed heartbeat moves none
    return writes.skip_idle_range(bounds) if idle else bounds


def idle_heartbeats(run: RunContext, bounds: Bounds) -> list[str]:
    """A run whose source holds nothing for its sinks still tells the sinks that keep
    heartbeats (``heartbeat_interval_ms``) how far the source got: each such sink with a
    checkpoint and no control message owed writes one at ``upto`` when its interval has passed
    (the sink decides). Only these sinks are contacted; returns the ids that wrote one."""
    chosen = chosen_sinks(run.spec, run.plan.sinks)
    ids = [s.id for s in run.spec.sinks if s.heartbeat_interval_ms > 0 and s.id in chosen
           and s.id not in bounds.owed and bounds.checkpoints.get(s.id) is not None]
    if not ids:
        return []
    written = []
    for sink in run.parts.sinks(run.spec, ids):
        try:
            if sink.heartbeat(bounds.upto):
                written.append(sink.sink_id)
        finally:
            sink.close()
    if written:
        log.info("pipeline %s: nothing to deliver; heartbeats at %s to sinks %s", run.spec.pipeline,
                 bounds.upto, ", ".join(written))
    return written


def _replay_bounds(run: RunContext, source: Source, replay_of: str, missing_ok: bool) -> Bounds:
    chosen = chosen_sinks(run.spec, run.plan.sinks)
    bounds = capture_bounds(run, source)
    try:
        ranges = _delivered_ranges(run.store, run.pipeline, replay_of)
    except RunError:
        if not missing_ok:
            raise
        ranges = {}
    ranges = {sid: r for sid, r in ranges.items() if sid in chosen}
    if ranges:
        _check_replayable(run.spec, source, replay_of, ranges)
    return dataclasses.replace(bounds, replay_of=replay_of, ranges=ranges)


def replay_target(run: RunContext) -> str | None:
    """The run a run replays: the plan's ``replay_of``, or the run itself when it is a cleared /
    re-run Airflow run that already delivered (None: an incremental run). A cleared/re-run
    Airflow run keeps its run id: when that id already delivered, the re-run replays exactly its
    range instead of reading new changes."""
    if run.plan.mode == "dry_run":
        return None
    if run.plan.replay_of:
        return run.plan.replay_of
    if run.plan.mode == "replay":
        return run.run_id
    with run.opened_store() as store:
        done = [e for e in store.runs.entries(run.pipeline, run.run_id)
                if e.status == "success" and e.mode == "incremental"]
    return run.run_id if done else None


# --------------------------------------------------------------------------- the run


def run_pipeline(run: RunContext, *, data_interval: tuple[Any, Any] | None = None,
                 reader: Reader | None = None) -> dict[str, Any]:
    """One bounded run as its plan says (default: incremental to every sink); returns the run
    report as JSON. Raises on failure (no checkpoint of a failed sub-batch moves):
    CommitPolicyError, FatalRunError, StaleEpochError, SourceError. The run's record (its bounds
    step: :func:`bounded`) holds its bounds: its upper bound, its replay ranges, the sinks it
    placed, its read plan. ``reader``: where the plan's segments are read (default: in this
    process, one after the other; reading.py)."""
    if run.plan.max_events:
        spec = run.spec
        run = dataclasses.replace(run, spec=dataclasses.replace(
            spec, batch=dataclasses.replace(spec.batch, max_events=run.plan.max_events)))
    with run.opened() as (source, st):
        run = bounded(run.with_store(st), source)
        reader = reader or InProcessReader()
        if run.plan.mode == "dry_run":
            return _dry_run(run, source, reader)
        if run.bounds.replay_of:
            return _replay(run, source, reader).to_json()
        return _incremental(run, source, data_interval, reader).to_json()


class SchemaGate:
    """``on_schema_change: halt``: the stream stops before a schema change of a captured table
    (at the last whole transaction before it), unless an operator let this very change pass
    (a resolved ``schema_change`` incident at that boundary). The run delivers what came
    before; :meth:`halt` then records the incident."""

    def __init__(self, run: RunContext):
        self.spec, self.store = run.spec, run.store
        self.passed = {i.from_position for i in run.store.incidents.all(run.pipeline)
                       if i.kind == "schema_change" and i.resolved}
        self.stopped: tuple[Position | None, ControlMessage] | None = None

    def filter(self, items: Iterable[SourceItem], start: Position | None) -> Iterator[SourceItem]:
        if self.spec.source.on_schema_change != "halt":
            yield from items
            return
        boundary, tx = start, []  # the rows of the transaction in progress wait for its end
        for item in items:
            if is_control(item) and item.type == "schema_change" and boundary not in self.passed:
                self.stopped = (boundary, item)
                return
            tx.append(item)
            if isinstance(item, PositionMark) or item.tx_end:
                yield from tx
                tx, boundary = [], item.position if isinstance(item, PositionMark) else item.end_position
        yield from tx

    def halt(self, run_id: str) -> None:
        if self.stopped is None:
            return
        boundary, change = self.stopped
        detail = (f"schema change of {change.fields.get('db')}.{change.table}: "
                  f"{change.fields.get('ddl') or change.fields.get('change')}")
        inc = self.store.incidents.record(self.spec.pipeline, "schema_change", boundary,
                                          change.end_position or boundary, detail=detail, run_id=run_id)
        raise ContinuityHalt(inc)


def _incremental(run: RunContext, source: Source, data_interval: tuple[Any, Any] | None,
                 reader: Reader) -> RunReport:
    spec, store, run_id, upto = run.spec, run.store, run.run_id, run.bounds.upto
    epoch = store.leases.acquire(spec.pipeline, run_id)
    source.use_lease(epoch)  # its reads are this run's: a stalled older run's hold is taken over
    if run.record.segments:
        reader.ahead(source, run.record.segments)  # the bounds step's plan: _segments says if it holds
    sinks = _sinks(run, source, run.plan.sinks)
    start, end = data_interval or (None, None)
    journal_id = store.runs.begin(spec.pipeline, run_id, interval_start=start, interval_end=end,
                                  mode="incremental")
    with Coordinator(store, spec.pipeline, run_id, epoch, sinks, spec.batch, journal_id=journal_id,
                     tenant=spec.tenant) as co:
        lowest = co.lowest_start()
        log.info("pipeline %s run %s: reading (%s, %s] for %d sink(s)", spec.pipeline, run_id,
                 lowest, upto, len(sinks))
        gate = SchemaGate(run)
        items = read_items(run, source, _segments(run, source, lowest, upto), reader)
        report = co.run(gate.filter(items, lowest))
    snapshot.settle(run)  # snapshots every sink is past are completed
    gate.halt(run_id)
    return report


def _sinks(run: RunContext, source: Source, only: Any) -> list[Sink]:
    """The run's sinks, each lent where the source's column types are (``envelope: debezium``
    asks for them on its first event) and the run's Spark Connect session (the Delta sink)."""
    sinks = run.parts.sinks(run.spec, only)
    for sink in sinks:
        sink.use_run(column_types=source.column_types, spark=run.spark)
    return sinks


def _segments(run: RunContext, source: Source, start: Position | None, upto: Position) -> list[Segment]:
    """The run's read plan: the bounds step's, when it starts where the run starts (a rewind since
    then moves the start back: the plan is made again), else made here."""
    planned = run.record.segments
    if planned and plan_start(planned) == start:
        return list(planned)
    if planned:
        log.info("pipeline %s run %s: the read plan of the bounds step starts at %s, the run at %s; "
                 "planned again", run.pipeline, run.run_id, plan_start(planned), start)
    return plan_reads(run, source, start, upto)


def _replay(run: RunContext, source: Source, reader: Reader) -> RunReport:
    """Re-deliver exactly the ranges a past run delivered, to the chosen sinks (the ranges its
    bounds step chose and checked; none: nothing to replay, as the bounds step says it).
    Checkpoints never move backwards, nor past a sink's own range: the coordinator writes a
    position only beyond the stored one and no further than that sink's range end."""
    spec, store, run_id = run.spec, run.store, run.run_id
    replay_of, ranges = run.bounds.replay_of, dict(run.bounds.ranges)
    if not ranges:  # as the bounds step says it (nothing to do), whoever ran it
        log.info("pipeline %s run %s: run %s delivered nothing to the chosen sinks: nothing to replay",
                 spec.pipeline, run_id, replay_of)
        return RunReport(spec.pipeline, run_id, 0, {})
    sinks = _sinks(run, source, sorted(ranges))
    epoch = store.leases.acquire(spec.pipeline, run_id)
    source.use_lease(epoch)
    starts = {sid: a for sid, (a, _) in ranges.items()}
    ends = {sid: b for sid, (_, b) in ranges.items()}
    journal_id = store.runs.begin(spec.pipeline, run_id, mode="replay")
    log.info("pipeline %s run %s: replaying run %s to %s", spec.pipeline, run_id, replay_of,
             ", ".join(f"{sid} ({a}, {b}]" for sid, (a, b) in sorted(ranges.items())))
    with Coordinator(store, spec.pipeline, run_id, epoch, sinks, spec.batch, journal_id=journal_id,
                     starts=starts, ends=ends, tenant=spec.tenant) as co:
        lowest, upto = co.lowest_start(), max(ends.values())
        return co.run(read_items(run, source, _segments(run, source, lowest, upto), reader))


def _check_replayable(spec: PipelineSpec, source: Source, replay_of: str,
                      ranges: dict[str, tuple[Position | None, Position]]) -> None:
    """A past run's range is a range of the server it was read from: after a failover it
    cannot be read again from the new one; and the server must still hold its log."""
    now = lineage_of_identity(source.identity())
    for sid, (start, end) in ranges.items():
        if end.lineage is not None and now is not None and end.lineage != now:
            raise RunError(f"pipeline {spec.pipeline!r}: run {replay_of!r} delivered to sink {sid} a "
                           f"range of {describe_lineage(end.lineage)}, but the source is now "
                           f"{describe_lineage(now)} (a failover happened since): that range cannot "
                           f"be replayed from the new server")
        check_log_held(spec, source, start, f"the replay of run {replay_of!r} to sink {sid}, range "
                                            f"({start}, {end}],")


class LogNotHeldError(RunError):
    """A replay, backfill or rewind asks for log the source no longer holds. It is refused
    before anything is read or moved, and opens no incident: nothing new is lost (the range was
    delivered once) and the pipeline runs on."""


def check_log_held(spec: PipelineSpec, source: Source, start: Position | None, asked: str) -> None:
    """Refuse ``asked`` (what needs the log after ``start``, in words) up front when the source
    no longer holds that log (a released Postgres slot, a purged binlog), naming where the log
    stands and the setting that keeps more of it. A position of another server is left to the
    lineage checks."""
    if start is None:
        return
    at = log_position(start)
    now = lineage_of_identity(source.identity())
    if at.lineage is not None and now is not None and at.lineage != now:
        return
    gone = source.log_gone_before(at)
    if gone:
        raise LogNotHeldError(f"pipeline {spec.pipeline!r}: {asked} needs the source log after {at}, but "
                              f"{gone}. Refused before anything was read: nothing was delivered, no "
                              f"checkpoint moved, no incident was opened.")


def check_rewind(spec: PipelineSpec, sink_id: str, version: int, position: Position, *,
                 parts: Parts | None = None) -> None:
    """Before a rewind is written: the source still holds the log after the restored position
    (otherwise every later run would fail until the checkpoint moves forward again)."""
    source = (parts or Parts()).source(spec)
    try:
        check_log_held(spec, source, position, f"a rewind of sink {sink_id} to version {version}")
    finally:
        source.close()


def _delivered_ranges(store: CheckpointStore, pipeline: str, past_run: str
                      ) -> dict[str, tuple[Position | None, Position]]:
    """Per sink, the range the run ``past_run`` delivered over all its attempts (an attempt that
    failed part-way may have moved some sinks)."""
    entries = [e for e in store.runs.entries(pipeline, past_run) if e.mode == "incremental"]
    if not entries:
        raise RunError(f"pipeline {pipeline!r} has no journal entry for run {past_run!r}; "
                       f"`tidegate status {pipeline}` shows the checkpoints, the journal lists runs")
    ranges: dict[str, tuple[Position | None, Position]] = {}
    for entry in entries:
        for sid, js in entry.sinks.items():
            if js.end is None or (js.start is not None and not js.end > js.start):
                continue  # this attempt moved nothing for the sink
            lo, hi = ranges.get(sid, (js.start, js.end))
            lo = None if lo is None or js.start is None else min(lo, js.start)
            ranges[sid] = (lo, max(hi, js.end))
    return ranges


def _dry_run(run: RunContext, source: Source, reader: Reader) -> dict[str, Any]:
    """Read and cut the range as a run would; deliver nothing, move nothing."""
    spec, bounds = run.spec, run.bounds
    segments = plan_reads(run, source, bounds.lowest(), bounds.upto)
    batches = events = size = 0
    items = read_items(run, source, segments, reader)
    for b in cut_sub_batches(items, max_events=spec.batch.max_events,
                             max_bytes=spec.batch.max_bytes, respect_source_tx=spec.batch.respect_source_tx):
        batches, events, size = batches + 1, events + b.event_count, size + b.byte_size
    return {"pipeline": spec.pipeline, "mode": "dry_run", "bounds": bounds.to_json(),
            "sub_batches": batches, "events": events, "bytes": size}


# --------------------------------------------------------------------------- release


def release(run: RunContext) -> Position | None:
    """Let the source recycle its log up to the lowest sink checkpoint (a sink that is behind
    holds the log it still needs), or less far with ``source.replay_retention``
    (:func:`replay_hold`); returns the position released to (None: some sink has no checkpoint
    yet). The source never moves its log back (a Postgres slot only advances)."""
    with run.opened() as (source, st):
        stored = st.checkpoints.current(run.pipeline)  # the head is not needed: no read of it
        low = lowest_start([stored[s.id].position if s.id in stored else None for s in run.spec.sinks])
        if low is None:
            return None
        # a snapshot holds the log from its handoff
        target = replay_hold(run.with_store(st), log_position(low))
        source.release(target)
        return target


def replay_hold(run: RunContext, low: Position, now: dt.datetime | None = None) -> Position:
    """How far release may let the log go: ``low`` (the lowest checkpoint), or, with
    ``source.replay_retention``, the lowest position any sink's checkpoint had within that
    window, so that a replay or backfill of a run in the window, or a rewind to a version of it,
    still finds its log. Positions of another lineage (before a failover) are another server's
    log and hold nothing here."""
    spec, store = run.spec, run.store
    window = spec.source.replay_retention_s
    if not window:
        return low
    since = ((now or dt.datetime.now(dt.UTC)) - dt.timedelta(seconds=window)).isoformat(
        timespec="microseconds")
    held = [log_position(rec.position) for s in spec.sinks
            for rec in store.checkpoints.history(spec.pipeline, s.id, since=since)]
    return min([low, *(p for p in held if same_lineage(p, low))])
