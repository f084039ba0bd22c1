"""One bounded run, the same code path for `tidegate run`, the Spark job and the Airflow tasks.

A run (docs/architecture.md, "One run") has three steps: the bounds (``bounds_step.py``: the
upper bound ``upto``, each sink's start, the read plan, kept as the run's record), the delivery
and the release. :func:`run_pipeline` delivers: it takes the pipeline lease (fencing epoch),
reads (lowest start, upto] from the source and hands it to the coordinator, which delivers
sub-batch by sub-batch and commits checkpoints as it goes. :func:`release` then lets the source
recycle its log up to the lowest checkpoint.

Every step is handed the run's :class:`~tidegate.run.RunContext` (spec, plan, run id, store and
the :class:`~tidegate.parts.Parts` its source and sinks are made by). The delivery is handed a
:class:`~tidegate.run.PlannedRun` and reads its bounds from the run's record instead of deciding
them again.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from typing import TYPE_CHECKING, Any

from . import snapshot
from .batching import cut_sub_batches
from .coordinator import Coordinator, RunReport
from .positions import Position, log_position, lowest_start, same_lineage
from .reading import InProcessReader, Reader, SchemaGate, plan_reads, planned_reads, read_items
from .run import PlannedRun, RunContext
from .sources.base import Source

if TYPE_CHECKING:
    from .sinks.base import Sink

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- the run


def run_pipeline(run: PlannedRun, *, data_interval: tuple[Any, Any] | None = None,
                 reader: Reader | None = None) -> dict[str, Any]:
    """One bounded run as its plan says (default: incremental to every sink); returns the run
    report as JSON. Raises on failure (no checkpoint of a failed sub-batch moves):
    CommitPolicyError, FatalRunError, StaleEpochError, SourceError. ``run`` holds its record,
    written by its bounds step (``bounds_step.prepare_bounds``) before it: its upper bound, its
    replay ranges, the sinks it placed, its read plan. ``reader``: where the plan's segments are
    read (default: in this process, one after the other; reading.py)."""
    if run.plan.max_events:
        spec = run.spec
        run = dataclasses.replace(run, spec=dataclasses.replace(
            spec, batch=dataclasses.replace(spec.batch, max_events=run.plan.max_events)))
    with run.opened() as (source, st):
        run = run.with_store(st)
        reader = reader or InProcessReader()
        if run.plan.mode == "dry_run":
            return _dry_run(run, source, reader)
        if run.bounds.replay_of:
            return _replay(run, source, reader).to_json()
        return _incremental(run, source, data_interval, reader).to_json()


def _incremental(run: PlannedRun, source: Source, data_interval: tuple[Any, Any] | None,
                 reader: Reader) -> RunReport:
    spec, store, run_id, upto = run.spec, run.store, run.run_id, run.bounds.upto
    epoch = store.leases.acquire(spec.pipeline, run_id)
    source.use_lease(epoch)  # its reads are this run's: a stalled older run's hold is taken over
    if run.record.segments:
        reader.ahead(source, run.record.segments)  # the bounds step's plan: planned_reads says if it holds
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
        items = read_items(run, source, planned_reads(run, source, lowest, upto), reader)
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


def _replay(run: PlannedRun, source: Source, reader: Reader) -> RunReport:
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
        return co.run(read_items(run, source, planned_reads(run, source, lowest, upto), reader))


def _dry_run(run: PlannedRun, source: Source, reader: Reader) -> dict[str, Any]:
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
