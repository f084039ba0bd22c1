"""One bounded run, the same code path for `tidegate run`, the Spark job and the Airflow tasks.

A run (docs/architecture.md, "One run"): :func:`prepare_bounds` captures the bounds (the
source head now is the upper bound ``upto``; the sinks' checkpoints are where they start),
places new sinks at the head (``start: head``) and moves the checkpoints over a range that
holds nothing the pipeline delivers; when nothing is left, the run stops cheaply. Otherwise
:func:`run_pipeline` takes the pipeline lease (fencing epoch), reads (lowest start, upto] from
the source and hands it to the coordinator, which delivers sub-batch by sub-batch and commits
checkpoints as it goes; :func:`release` then lets the source recycle its log up to the lowest
checkpoint.

Callers hand in the :class:`~tidegate.parts.Parts` the run's source and sinks are made by (by
default from ``AIRFLOW_CONN_<ID>`` environment variables; the Airflow operators hand one built on
Airflow's own connections).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from . import snapshots
from .coordinator import Coordinator, RunReport
from .errors import ContinuityHalt, RunError
from .events import ControlMessage, PositionMark, is_control
from .parts import Parts, chosen_sinks
from .plan import RunPlan
from .positions import (
    Position,
    describe_lineage,
    lineage_of_identity,
    log_position,
    lowest_start,
    position_from_json,
    position_to_json,
    same_lineage,
)
from .sources.base import Source, SourceItem
from .spec import PipelineSpec
from .store import CheckpointStore, open_store

log = logging.getLogger(__name__)

# How a run reads its range: (source, start, upto) -> items. The default reads in-process;
# the Spark job passes one that reads slices in Spark tasks.
Reader = Callable[[Source, "Position | None", Position], Iterable[SourceItem]]


def read_in_process(source: Source, start: Position | None, upto: Position) -> Iterable[SourceItem]:
    return source.read(start, upto)


# --------------------------------------------------------------------------- building blocks


@contextmanager
def opened(spec: PipelineSpec, parts: Parts | None, store: CheckpointStore | None
           ) -> Iterator[tuple[Source, CheckpointStore]]:
    """The pipeline's source and the checkpoint store (opened here unless given)."""
    own_store = store is None
    store = store or open_store()
    source = (parts or Parts()).source(spec)
    source.use_store(store)  # schema branch: facts a source keeps between runs (Postgres column sets)
    try:
        yield source, store
    finally:
        source.close()
        if own_store:
            store.close()


# --------------------------------------------------------------------------- bounds


@dataclasses.dataclass(frozen=True)
class Bounds:
    """A run's range: ``upto`` (the source head when the run began, its upper bound) and each
    sink's checkpoint (None: the sink has none yet). ``owed``: the sinks whose checkpoint
    version owes them a control message (an accepted gap, a failover, a snapshot's start). A
    replay's bounds also name the run it replays and, per sink, the range that run delivered
    (``ranges``; empty: nothing)."""

    pipeline: str
    upto: Position
    checkpoints: Mapping[str, Position | None]
    replay_of: str | None = None
    ranges: Mapping[str, tuple[Position | None, Position]] = dataclasses.field(default_factory=dict)
    owed: tuple[str, ...] = ()

    def nothing_to_do(self, sinks: Sequence[str] | None = None) -> bool:
        """Whether every chosen sink (default: all) already has everything up to ``upto`` and is
        owed no control message; for a replay, whether the replayed run delivered nothing to the
        chosen sinks."""
        if self.replay_of is not None:
            return not any(sid in self.ranges for sid in (sinks or self.checkpoints))
        # Consumers learn of an accepted loss (or a failover) in the run that accepts it, even
        # when the log has nothing new: the run delivers the message alone.
        if any(sid in self.owed for sid in (sinks or self.checkpoints)):
            return False
        return all(p is not None and p >= self.upto for p in self._of(sinks))

    def lowest(self, sinks: Sequence[str] | None = None) -> Position | None:
        """Where a read for the chosen sinks starts (None: from the beginning)."""
        return lowest_start(self._of(sinks))

    def behind(self, sinks: Sequence[str] | None = None) -> list[str]:
        chosen = sinks or list(self.checkpoints)
        return [sid for sid in chosen if self.checkpoints[sid] is None or self.checkpoints[sid] < self.upto]

    def _of(self, sinks: Sequence[str] | None) -> list[Position | None]:
        return [self.checkpoints[sid] for sid in (sinks or self.checkpoints)]

    def with_checkpoints(self, moved: Mapping[str, Position]) -> Bounds:
        return dataclasses.replace(self, checkpoints={**self.checkpoints, **moved})

    def to_json(self) -> dict[str, Any]:
        out = {"pipeline": self.pipeline, "upto": position_to_json(self.upto),
               "checkpoints": {k: position_to_json(v) for k, v in self.checkpoints.items()},
               "owed": list(self.owed), "nothing_to_do": self.nothing_to_do()}
        if self.replay_of is not None:
            out["replay_of"] = self.replay_of
            out["ranges"] = {k: [position_to_json(a), position_to_json(b)]
                             for k, (a, b) in self.ranges.items()}
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Bounds:
        return cls(d["pipeline"], position_from_json(d["upto"]),
                   {k: position_from_json(v) for k, v in (d.get("checkpoints") or {}).items()},
                   d.get("replay_of"),
                   {k: (position_from_json(a), position_from_json(b))
                    for k, (a, b) in (d.get("ranges") or {}).items()},
                   tuple(d.get("owed") or ()))


def capture_bounds(spec: PipelineSpec, source: Source, store: CheckpointStore) -> Bounds:
    """The source head now, each sink's stored checkpoint and the sinks it owes a control
    message; reads only."""
    upto = source.head()
    stored = store.checkpoints.current(spec.pipeline)
    return Bounds(spec.pipeline, upto,
                  {s.id: (stored[s.id].position if s.id in stored else None) for s in spec.sinks},
                  owed=tuple(s.id for s in spec.sinks if s.id in stored and stored[s.id].control))


def place_new_sinks(spec: PipelineSpec, store: CheckpointStore, bounds: Bounds, *, run_id: str,
                    epoch: int) -> Bounds:
    """``start: head``: a sink without a checkpoint begins at the run's upper bound."""
    new = {sid: bounds.upto for sid, p in bounds.checkpoints.items() if p is None}
    if spec.source.start != "head" or not new:
        return bounds
    log.info("pipeline %s: sinks %s have no checkpoint; start: head places them at %s",
             spec.pipeline, ", ".join(sorted(new)), bounds.upto)
    store.checkpoints.write_many(spec.pipeline, new, run_id=run_id, epoch=epoch, kind="head",
                                 reason="start: head")
    return bounds.with_checkpoints(new)


def skip_idle_range(spec: PipelineSpec, store: CheckpointStore, bounds: Bounds, *, run_id: str,
                    epoch: int) -> Bounds:
    """The range holds nothing this pipeline delivers (the head moved for other tables, empty
    transactions or WAL housekeeping): move every sink to ``upto`` without a delivery, so the
    run skips Spark and the next one does not look at this range again. A sink owed a control
    message stays where it is: a version written here would owe nothing, and the message would
    be lost; the run delivers it there and then moves the sink as a delivery does."""
    moved = idle_moves(bounds)
    store.checkpoints.write_many(spec.pipeline, moved, run_id=run_id, epoch=epoch, kind="skip",
                                 reason="nothing this pipeline delivers in the range")
    log.info("pipeline %s: nothing to deliver in (%s, %s]; sinks %s moved to %s", spec.pipeline,
             bounds.lowest(), bounds.upto, ", ".join(sorted(moved)), bounds.upto)
    return bounds.with_checkpoints(moved)


def idle_moves(bounds: Bounds) -> dict[str, Position]:
    """The sinks an idle range moves to ``upto``: those behind it that are owed nothing."""
    return {sid: bounds.upto for sid in bounds.behind() if sid not in bounds.owed}


def prepare_bounds(spec: PipelineSpec, *, parts: Parts | None = None,
                   store: CheckpointStore | None = None) -> Bounds:
    """The bounds step of a run: capture, place new sinks (``start: head``), skip an idle
    range. Cheap: no sink is contacted; the lease is taken only when a checkpoint moves."""
    run_id = "bounds__" + spec.pipeline
    with opened(spec, parts, store) as (source, st):
        bounds = capture_bounds(spec, source, st)
        if spec.source.start == "head" and None in bounds.checkpoints.values():
            bounds = place_new_sinks(spec, st, bounds, run_id=run_id,
                                     epoch=st.leases.acquire(spec.pipeline, run_id))
        # start: snapshot plans one (docs/architecture.md, "Snapshots"); a sink inside a
        # snapshot has chunks to read whatever the log holds, so the range is never idle.
        bounds = _place_snapshot_sinks(spec, source, st, bounds, run_id)
        if snapshots.in_snapshot(bounds.checkpoints):
            return bounds
        if idle_moves(bounds) and not source.has_changes(bounds.lowest(), bounds.upto):
            bounds = skip_idle_range(spec, st, bounds, run_id=run_id,
                                     epoch=st.leases.acquire(spec.pipeline, run_id))
        return bounds


def replay_target(spec: PipelineSpec, plan: RunPlan, run_id: str, *,
                  store: CheckpointStore | None = None) -> str | None:
    """The run a run replays: the plan's ``replay_of``, or the run itself when it is a cleared /
    re-run Airflow run that already delivered (None: an incremental run)."""
    if plan.mode == "dry_run":
        return None
    if plan.replay_of:
        return plan.replay_of
    own = store is None
    store = store or open_store()
    try:
        return _rerun_of(spec, store, run_id, plan.mode)
    finally:
        if own:
            store.close()


def prepare_replay_bounds(spec: PipelineSpec, replay_of: str, *, sinks: Sequence[str] | None = None,
                          missing_ok: bool = False, parts: Parts | None = None,
                          store: CheckpointStore | None = None) -> Bounds:
    """The bounds step of a replay: the head, the checkpoints and the range ``replay_of``
    delivered to each chosen sink. Reads only: it takes no lease and moves no checkpoint, so a
    replay (a backfill run) never fences a run in flight. ``missing_ok`` (backfills): a run the
    journal does not know delivered nothing (a scheduled run that had nothing to do records no
    range), so the replay has nothing to do; otherwise it is an error, raised before Spark."""
    chosen = chosen_sinks(spec, sinks)
    with opened(spec, parts, store) as (source, st):
        bounds = capture_bounds(spec, source, st)
        try:
            ranges = _delivered_ranges(st, spec.pipeline, replay_of)
        except RunError:
            if not missing_ok:
                raise
            ranges = {}
        ranges = {sid: r for sid, r in ranges.items() if sid in chosen}
        if ranges:
            _check_replayable(spec, source, replay_of, ranges)
        return dataclasses.replace(bounds, replay_of=replay_of, ranges=ranges)


def _place_snapshot_sinks(spec: PipelineSpec, source: Source, store: CheckpointStore, bounds: Bounds,
                          run_id: str, epoch: int | None = None) -> Bounds:
    """``start: snapshot``: sinks without a checkpoint start with a snapshot, and tables added to
    ``source.tables`` get one of their own (snapshots.py), written under ``epoch`` (None: take
    the lease)."""
    if spec.source.start != "snapshot":
        return bounds

    def epoch_for() -> int:
        return epoch if epoch is not None else store.leases.acquire(spec.pipeline, run_id)

    if None in bounds.checkpoints.values():
        bounds = bounds.with_checkpoints(snapshots.place_new_sinks(
            spec, source, store, bounds.checkpoints, upto=bounds.upto, run_id=run_id, epoch_for=epoch_for))
    return bounds.with_checkpoints(snapshots.snapshot_added_tables(
        spec, source, store, bounds.checkpoints, run_id=run_id, epoch_for=epoch_for))


# --------------------------------------------------------------------------- the run


def run_pipeline(spec: PipelineSpec, plan: RunPlan | None = None, *, run_id: str,
                 upto: Position | None = None, parts: Parts | None = None,
                 store: CheckpointStore | None = None, data_interval: tuple[Any, Any] | None = None,
                 reader: Reader = read_in_process,
                 chunk_reader: snapshots.ChunkReader | None = None) -> dict[str, Any]:
    """One bounded run as ``plan`` says (default: incremental to every sink); returns the run
    report as JSON. Raises on failure (no checkpoint of a failed sub-batch moves):
    CommitPolicyError, FatalRunError, StaleEpochError, SourceError. ``chunk_reader``: how a
    snapshot's chunks are read (default: in-process, one after the other)."""
    plan = plan or RunPlan()
    if plan.max_events:
        spec = dataclasses.replace(spec, batch=dataclasses.replace(spec.batch, max_events=plan.max_events))
    with opened(spec, parts, store) as (source, st):
        reader = snapshots.snapshot_reader(spec, st, reader, chunk_reader)  # snapshot positions
        upto = upto or source.head()
        if plan.mode == "dry_run":
            return _dry_run(spec, source, st, upto, reader)
        replay_of = plan.replay_of or _rerun_of(spec, st, run_id, plan.mode)
        if replay_of:
            return _replay(spec, source, st, run_id, replay_of, plan.sinks, parts, reader).to_json()
        return _incremental(spec, source, st, run_id, upto, plan.sinks, parts, data_interval,
                            reader).to_json()


def _rerun_of(spec: PipelineSpec, store: CheckpointStore, run_id: str, mode: str) -> str | None:
    """A cleared/re-run Airflow run keeps its run id: when that id already delivered, the
    re-run replays exactly its range instead of reading new changes."""
    if mode == "replay":
        return run_id
    done = [e for e in store.runs.entries(spec.pipeline, run_id)
            if e.status == "success" and e.mode == "incremental"]
    return run_id if done else None


class SchemaGate:
    """``on_schema_change: halt``: the stream stops before a schema change of a captured table
    (at the last whole transaction before it), unless an operator let this very change pass
    (a resolved ``schema_change`` incident at that boundary). The run delivers what came
    before; :meth:`halt` then records the incident."""

    def __init__(self, spec: PipelineSpec, store: CheckpointStore):
        self.spec, self.store = spec, store
        self.passed = {i.from_position for i in store.incidents.all(spec.pipeline)
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


def _incremental(spec: PipelineSpec, source: Source, store: CheckpointStore, run_id: str,
                 upto: Position, only: Sequence[str] | None, parts: Parts | None,
                 data_interval: tuple[Any, Any] | None, reader: Reader) -> RunReport:
    sinks = (parts or Parts()).sinks(spec, only)
    epoch = store.leases.acquire(spec.pipeline, run_id)
    if spec.source.start == "head":
        place_new_sinks(spec, store, capture_bounds(spec, source, store), run_id=run_id, epoch=epoch)
    if spec.source.start == "snapshot":  # snapshots: a run without a bounds step plans it here
        _place_snapshot_sinks(spec, source, store, dataclasses.replace(
            capture_bounds(spec, source, store), upto=upto), run_id, epoch)
    start, end = data_interval or (None, None)
    journal_id = store.runs.begin(spec.pipeline, run_id, interval_start=start, interval_end=end,
                                  mode="incremental")
    with Coordinator(store, spec.pipeline, run_id, epoch, sinks, spec.batch, journal_id=journal_id,
                     tenant=spec.tenant) as co:
        lowest = co.lowest_start()
        log.info("pipeline %s run %s: reading (%s, %s] for %d sink(s)", spec.pipeline, run_id,
                 lowest, upto, len(sinks))
        gate = SchemaGate(spec, store)
        report = co.run(gate.filter(reader(source, lowest, upto), lowest))
    snapshots.settle(store, spec)  # snapshots every sink is past are completed
    gate.halt(run_id)
    return report


def _replay(spec: PipelineSpec, source: Source, store: CheckpointStore, run_id: str,
            replay_of: str, only: Sequence[str] | None, parts: Parts | None,
            reader: Reader) -> RunReport:
    """Re-deliver exactly the ranges a past run delivered, to the chosen sinks. Checkpoints
    never move backwards: the coordinator only writes positions beyond the stored ones."""
    ranges = _delivered_ranges(store, spec.pipeline, replay_of)
    chosen = chosen_sinks(spec, only) & set(ranges)
    if not chosen:
        raise RunError(f"run {replay_of!r} delivered nothing to the chosen sinks")
    _check_replayable(spec, source, replay_of, {sid: ranges[sid] for sid in chosen})
    sinks = (parts or Parts()).sinks(spec, sorted(chosen))
    epoch = store.leases.acquire(spec.pipeline, run_id)
    starts = {sid: ranges[sid][0] for sid in chosen}
    upto = max(ranges[sid][1] for sid in chosen)
    journal_id = store.runs.begin(spec.pipeline, run_id, mode="replay")
    log.info("pipeline %s run %s: replaying run %s to %s", spec.pipeline, run_id, replay_of,
             ", ".join(f"{sid} ({a}, {b}]" for sid, (a, b) in sorted(ranges.items()) if sid in chosen))
    with Coordinator(store, spec.pipeline, run_id, epoch, sinks, spec.batch, journal_id=journal_id,
                     starts=starts, ends={sid: ranges[sid][1] for sid in chosen}, tenant=spec.tenant) as co:
        return co.run(reader(source, co.lowest_start(), upto))


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


def _delivered_ranges(store: CheckpointStore, pipeline: str, run_id: str
                      ) -> dict[str, tuple[Position | None, Position]]:
    """Per sink, the range a past run delivered over all its attempts (an attempt that failed
    part-way may have moved some sinks)."""
    entries = [e for e in store.runs.entries(pipeline, run_id) if e.mode == "incremental"]
    if not entries:
        raise RunError(f"pipeline {pipeline!r} has no journal entry for run {run_id!r}; "
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


def _dry_run(spec: PipelineSpec, source: Source, store: CheckpointStore, upto: Position,
             reader: Reader) -> dict[str, Any]:
    """Read and cut the range as a run would; deliver nothing, move nothing."""
    from .batching import cut_sub_batches

    bounds = capture_bounds(spec, source, store)
    bounds = dataclasses.replace(bounds, upto=upto)
    batches = events = size = 0
    for b in cut_sub_batches(reader(source, bounds.lowest(), upto), max_events=spec.batch.max_events,
                             max_bytes=spec.batch.max_bytes, respect_source_tx=spec.batch.respect_source_tx):
        batches, events, size = batches + 1, events + b.event_count, size + b.byte_size
    return {"pipeline": spec.pipeline, "mode": "dry_run", "bounds": bounds.to_json(),
            "sub_batches": batches, "events": events, "bytes": size}


# --------------------------------------------------------------------------- release


def release(spec: PipelineSpec, *, parts: Parts | None = None,
            store: CheckpointStore | None = None) -> Position | None:
    """Let the source recycle its log up to the lowest sink checkpoint (a sink that is behind
    holds the log it still needs), or less far with ``source.replay_retention``
    (:func:`replay_hold`); returns the position released to (None: some sink has no checkpoint
    yet). The source never moves its log back (a Postgres slot only advances)."""
    with opened(spec, parts, store) as (source, st):
        low = capture_bounds(spec, source, st).lowest()
        if low is None:
            return None
        target = replay_hold(spec, st, log_position(low))  # a snapshot holds the log from its handoff
        source.release(target)
        return target


def replay_hold(spec: PipelineSpec, store: CheckpointStore, low: Position,
                now: dt.datetime | None = None) -> Position:
    """How far release may let the log go: ``low`` (the lowest checkpoint), or, with
    ``source.replay_retention``, the lowest position any sink's checkpoint had within that
    window, so that a replay or backfill of a run in the window, or a rewind to a version of it,
    still finds its log. Positions of another lineage (before a failover) are another server's
    log and hold nothing here."""
    window = spec.source.replay_retention_s
    if not window:
        return low
    since = ((now or dt.datetime.now(dt.UTC)) - dt.timedelta(seconds=window)).isoformat(
        timespec="microseconds")
    held = [log_position(rec.position) for s in spec.sinks
            for rec in store.checkpoints.history(spec.pipeline, s.id, since=since)]
    return min([low, *(p for p in held if same_lineage(p, low))])
