"""The bounds step of a run (docs/architecture.md, "One run"): what the run will deliver,
decided once before anything is read and kept as the run's record.

:func:`prepare_bounds` captures the source head (the run's upper bound ``upto``) and each sink's
checkpoint, places new sinks (``start: head``, ``start: snapshot``), moves the checkpoints over a
range that holds nothing the pipeline delivers, and makes the read plan. A replay's bounds are
the ranges the replayed run delivered (the journal), checked to be readable still. :class:`Bounds`
is what it decides. The delivery (``runner.run_pipeline``) takes a run that holds its record.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import snapshot
from .errors import RunError
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
)
from .reading import plan_reads
from .run import PlannedRun, RunContext
from .segments import Segment, segment_from_json, segment_to_json
from .spec import PipelineSpec, load_spec_text

if TYPE_CHECKING:
    from .sources.base import Source
    from .store import CheckpointStore

log = logging.getLogger(__name__)


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


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """What the bounds step decided for one run, as every later step reads it: the spec's text
    (parsed once by each process that reads the record), the validated plan, the bounds and the
    read plan. Only the bounds step writes one (:func:`prepare_bounds`): a record always holds
    bounds."""

    pipeline: str
    run_id: str
    spec_text: str
    spec_path: str | None
    plan: RunPlan
    bounds: Bounds
    segments: tuple[Segment, ...] | None = None  # the read plan (reading.py); None: none made
    # Where the read plan starts reading (None: the log's beginning): the delivery takes the
    # plan only from there (a checkpoint moved back since, by a rewind, makes it stale).
    plan_start: Position | None = None

    def to_json(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "run_id": self.run_id, "spec_text": self.spec_text,
                "spec_path": self.spec_path, "plan": self.plan.to_json(),
                "bounds": self.bounds.to_json(),
                "segments": None if self.segments is None else [segment_to_json(s) for s in self.segments],
                "plan_start": position_to_json(self.plan_start)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RunRecord:
        # A record written before plans kept their start has no "plan_start": its plan is
        # dropped, and the delivery plans its reads again (what a stale plan gets).
        segments = d.get("segments") if "plan_start" in d else None
        return cls(d["pipeline"], d["run_id"], d["spec_text"], d.get("spec_path"),
                   RunPlan(**d["plan"]), Bounds.from_json(d["bounds"]),
                   None if segments is None else tuple(segment_from_json(s) for s in segments),
                   position_from_json(d.get("plan_start")))

    def spec(self) -> PipelineSpec:
        spec = load_spec_text(self.spec_text, origin=self.spec_path or f"<{self.pipeline}>")
        return dataclasses.replace(spec, path=self.spec_path)


def recorded(run: RunContext, bounds: Bounds, store: CheckpointStore,
             segments: Sequence[Segment] | None = None, plan_start: Position | None = None) -> PlannedRun:
    """The context holding the run's record (what the bounds step decided), written to the
    store for the steps after it. ``segments``: the read plan, made from ``plan_start``."""
    record = RunRecord(run.pipeline, run.run_id, run.spec.text, run.spec.path, run.plan, bounds,
                       None if segments is None else tuple(segments), plan_start)
    store.runs.put_record(run.pipeline, run.run_id, record.to_json())
    return run.planned(record)


def read_record(store: CheckpointStore, pipeline: str, run_id: str) -> RunRecord | None:
    found = store.runs.record(pipeline, run_id)
    return RunRecord.from_json(found) if found is not None else None


def from_record(store: CheckpointStore, pipeline: str, run_id: str, parts: Parts | None = None) -> PlannedRun:
    """The context, on ``store``, of a run whose bounds step wrote its record (the Spark driver)."""
    record = read_record(store, pipeline, run_id)
    if record is None:
        raise RunError(f"pipeline {pipeline!r} has no run record for run {run_id!r}: its bounds step "
                       f"did not run (or wrote to another store than TIDEGATE_CHECKPOINT_STORE)")
    return planned_from(record, store, parts)


def planned_from(record: RunRecord, store: CheckpointStore | None, parts: Parts | None = None) -> PlannedRun:
    """The context of the run ``record`` decided, on ``store`` (a Spark task gets the record
    with its job, as the driver read it)."""
    return PlannedRun(record.spec(), record.plan, record.run_id, parts or Parts(), store, record=record)


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


def prepare_bounds(run: RunContext, *, missing_ok: bool = False) -> PlannedRun:
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
        return _bounds_step(run.with_store(store), source, missing_ok=missing_ok).with_store(given)


def _bounds_step(run: RunContext, source: Source, *, missing_ok: bool) -> PlannedRun:
    """What the bounds step decides, on the run's opened store and source, written to the store
    as the run's record."""
    if run.plan.mode == "dry_run":
        return recorded(run, capture_bounds(run, source), run.store)
    replay_of = replay_target(run)
    if replay_of is not None:
        bounds = _replay_bounds(run, source, replay_of, missing_ok)
    else:
        bounds = _incremental_bounds(run, source)
    if bounds.nothing_to_do(run.plan.sinks):  # nothing to read: no plan
        return recorded(run, bounds, run.store)
    start, end = _read_range(run, bounds)
    return recorded(run, bounds, run.store, plan_reads(run, source, start, end), start)


def _read_range(run: RunContext, bounds: Bounds) -> tuple[Position | None, Position]:
    """What the delivery will read: (lowest start, end] of the chosen sinks, or of the ranges a
    replay re-delivers."""
    if bounds.replay_of is not None:
        return (lowest_start([a for a, _ in bounds.ranges.values()]),
                max(b for _, b in bounds.ranges.values()))
    return bounds.lowest(run.plan.sinks), bounds.upto


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
    range instead of reading new changes. On the run's opened store."""
    if run.plan.mode == "dry_run":
        return None
    if run.plan.replay_of:
        return run.plan.replay_of
    if run.plan.mode == "replay":
        return run.run_id
    done = [e for e in run.store.runs.entries(run.pipeline, run.run_id)
            if e.status == "success" and e.mode == "incremental"]
    return run.run_id if done else None


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
