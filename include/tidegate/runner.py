"""One bounded run, the same code path for `tidegate run`, the Spark job and the Airflow tasks.

A run (DESIGN.md, "One run"): capture the bounds (the source head now is the upper bound; the
sinks' checkpoints are the lower bounds); when there is nothing new, stop cheaply; otherwise
take the pipeline lease (fencing epoch), read (lowest sink checkpoint, upper bound] from the
source and hand it to the coordinator, which delivers sub-batch by sub-batch and commits
checkpoints as it goes; finally release the source up to the lowest committed checkpoint.

Callers pass a connection resolver; by default connections come from ``AIRFLOW_CONN_<ID>``
environment variables. Airflow operators pass one built on Airflow's own connections.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .connections import Connection, get_connection
from .coordinator import Coordinator, RunReport, lowest_start
from .errors import SpecError, TidegateError
from .positions import (
    Position,
    describe_lineage,
    lineage_of_identity,
    position_from_json,
    position_to_json,
)
from .sinks.base import Sink
from .sources.base import Source, SourceItem
from .spec import PipelineSpec, load_spec, spec_files
from .store import CheckpointStore, open_store

log = logging.getLogger(__name__)

Resolver = Callable[[str], Connection]
# How a run reads its range: (source, start, upto) -> items. The default reads in-process;
# the Spark job passes one that reads slices in Spark tasks.
Reader = Callable[[Source, "Position | None", Position], Iterable[SourceItem]]


def read_in_process(source: Source, start: Position | None, upto: Position) -> Iterable[SourceItem]:
    return source.read(start, upto)

MODES = ("incremental", "replay", "dry_run")


class RunError(TidegateError):
    """A run was asked for something it cannot do (unknown sink, replay of an unknown run)."""


# --------------------------------------------------------------------------- building blocks


def find_spec(pipeline: str | PipelineSpec) -> PipelineSpec:
    if isinstance(pipeline, PipelineSpec):
        return pipeline
    if pipeline.endswith((".yaml", ".yml")):
        return load_spec(pipeline)
    # One spec at a time: a broken spec elsewhere in the folder must not stop this pipeline.
    files = spec_files()
    files.sort(key=lambda f: f.stem != pipeline)  # the conventional <pipeline>.yaml first
    for f in files:
        try:
            spec = load_spec(str(f))
        except SpecError:
            continue
        if spec.pipeline == pipeline:
            return spec
    raise RunError(f"no pipeline {pipeline!r} in the pipelines folder "
                   f"(set TIDEGATE_PIPELINES_DIR or add include/pipelines/{pipeline}.yaml)")


def build_source(spec: PipelineSpec, resolve: Resolver | None = None) -> Source:
    from .sources import make_source  # the source drivers pull in their client libraries

    return make_source(spec, (resolve or get_connection)(spec.source.conn_id))


def build_sinks(spec: PipelineSpec, only: Sequence[str] | None = None,
                resolve: Resolver | None = None) -> list[Sink]:
    from .sinks import make_sink

    chosen = _chosen_sinks(spec, only)
    resolve = resolve or get_connection
    return [make_sink(spec, s, resolve(s.conn_id)) for s in spec.sinks if s.id in chosen]


def _chosen_sinks(spec: PipelineSpec, only: Sequence[str] | None) -> set[str]:
    known = [s.id for s in spec.sinks]
    if not only:
        return set(known)
    unknown = sorted(set(only) - set(known))
    if unknown:
        raise RunError(f"pipeline {spec.pipeline!r} has no sink(s) {', '.join(unknown)}; "
                       f"its sinks are: {', '.join(known)}")
    return set(only)


@contextmanager
def _opened(spec: PipelineSpec, resolve: Resolver | None, store: CheckpointStore | None
            ) -> Iterator[tuple[Source, CheckpointStore]]:
    own_store = store is None
    store = store or open_store()
    source = build_source(spec, resolve)
    try:
        yield source, store
    finally:
        source.close()
        if own_store:
            store.close()


# --------------------------------------------------------------------------- bounds


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The run's range: the source head (upper bound) and each sink's stored checkpoint."""

    pipeline: str
    upto: Position
    sinks: dict[str, Position | None]

    @property
    def nothing_to_do(self) -> bool:
        return all(p is not None and p >= self.upto for p in self.sinks.values())

    @property
    def lowest(self) -> Position | None:
        return lowest_start(self.sinks.values())

    def to_json(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "upto": position_to_json(self.upto),
                "sinks": {k: position_to_json(v) for k, v in self.sinks.items()},
                "nothing_to_do": self.nothing_to_do}


def bounds_of(spec: PipelineSpec, source: Source, store: CheckpointStore) -> Bounds:
    upto = source.head()
    stored = store.checkpoints(spec.pipeline)
    return Bounds(spec.pipeline, upto,
                  {s.id: (stored[s.id].position if s.id in stored else None) for s in spec.sinks})


def capture_bounds(pipeline: str | PipelineSpec, *, resolve: Resolver | None = None,
                   store: CheckpointStore | None = None) -> dict[str, Any]:
    """The bounds as JSON (for XCom). Cheap: no sink is contacted. Sinks without a checkpoint
    under ``start: head`` are placed at the head now, so a first run has nothing to do."""
    spec = find_spec(pipeline)
    with _opened(spec, resolve, store) as (source, st):
        bounds = bounds_of(spec, source, st)
        if spec.source.start == "head" and any(p is None for p in bounds.sinks.values()):
            run_id = "bounds__" + spec.pipeline
            _position_new_sinks(spec, st, run_id, st.acquire_lease(spec.pipeline, run_id), bounds.upto)
            bounds = bounds_of(spec, source, st)
        if not bounds.nothing_to_do and not source.has_changes(bounds.lowest, bounds.upto):
            bounds = _skip_empty_range(spec, st, bounds)
        return bounds.to_json()


def _skip_empty_range(spec: PipelineSpec, store: CheckpointStore, bounds: Bounds) -> Bounds:
    """The range holds nothing this pipeline delivers (the head moved for other tables, empty
    transactions or WAL housekeeping): move every sink to the upper bound without a delivery,
    so the run skips Spark and the next one does not look at this range again."""
    run_id = "bounds__" + spec.pipeline
    epoch = store.acquire_lease(spec.pipeline, run_id)
    behind = {sid: bounds.upto for sid, p in bounds.sinks.items() if p is None or p < bounds.upto}
    store.write_checkpoints(spec.pipeline, behind, run_id=run_id, epoch=epoch, kind="skip",
                            reason="nothing this pipeline delivers in the range")
    log.info("pipeline %s: nothing to deliver in (%s, %s]; sinks %s moved to %s", spec.pipeline,
             bounds.lowest, bounds.upto, ", ".join(sorted(behind)), bounds.upto)
    return Bounds(spec.pipeline, bounds.upto, {sid: bounds.upto for sid in bounds.sinks})


# --------------------------------------------------------------------------- the run


def run_pipeline(pipeline: str | PipelineSpec, *, run_id: str, mode: str = "incremental",
                 sinks: Sequence[str] | None = None, max_events: int | None = None,
                 replay_of: str | None = None, upto: dict[str, Any] | None = None,
                 resolve: Resolver | None = None, store: CheckpointStore | None = None,
                 data_interval: tuple[Any, Any] | None = None,
                 reader: Reader = read_in_process) -> dict[str, Any]:
    """One bounded run; returns the run report as JSON. Raises on failure (no checkpoint of a
    failed sub-batch moves): CommitPolicyError, FatalRunError, StaleEpochError, SourceError."""
    if mode not in MODES:
        raise RunError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    spec = find_spec(pipeline)
    if max_events:
        spec = dataclasses.replace(spec, batch=dataclasses.replace(spec.batch, max_events=int(max_events)))
    with _opened(spec, resolve, store) as (source, st):
        bound = position_from_json(upto) if upto else source.head()
        if mode == "dry_run":
            return _dry_run(spec, source, st, bound, reader)
        replay_of = replay_of or _rerun_of(spec, st, run_id, mode)
        if replay_of:
            return _replay(spec, source, st, run_id, replay_of, sinks, resolve, reader).to_json()
        return _incremental(spec, source, st, run_id, bound, sinks, resolve, data_interval, reader).to_json()


def _rerun_of(spec: PipelineSpec, store: CheckpointStore, run_id: str, mode: str) -> str | None:
    """A cleared/re-run Airflow run keeps its run id: when that id already delivered, the
    re-run replays exactly its range instead of reading new changes."""
    if mode == "replay":
        return run_id
    done = [e for e in store.journal(spec.pipeline, run_id)
            if e.status == "success" and e.mode == "incremental"]
    return run_id if done else None


def _incremental(spec: PipelineSpec, source: Source, store: CheckpointStore, run_id: str,
                 upto: Position, only: Sequence[str] | None, resolve: Resolver | None,
                 data_interval: tuple[Any, Any] | None, reader: Reader) -> RunReport:
    sinks = build_sinks(spec, only, resolve)
    epoch = store.acquire_lease(spec.pipeline, run_id)
    _position_new_sinks(spec, store, run_id, epoch, upto)
    start, end = data_interval or (None, None)
    journal_id = store.journal_begin(spec.pipeline, run_id, interval_start=start, interval_end=end,
                                     mode="incremental")
    with Coordinator(store, spec.pipeline, run_id, epoch, sinks, spec.batch, journal_id=journal_id) as co:
        lowest = co.lowest_start()
        log.info("pipeline %s run %s: reading (%s, %s] for %d sink(s)", spec.pipeline, run_id,
                 lowest, upto, len(sinks))
        return co.run(reader(source, lowest, upto))


def _position_new_sinks(spec: PipelineSpec, store: CheckpointStore, run_id: str, epoch: int,
                        upto: Position) -> None:
    """`start: head`: a sink with no checkpoint begins at the head captured for this run."""
    if spec.source.start != "head":
        return
    stored = store.checkpoints(spec.pipeline)
    new = {s.id: upto for s in spec.sinks if s.id not in stored}
    if new:
        log.info("pipeline %s: sinks %s have no checkpoint; start: head places them at %s",
                 spec.pipeline, ", ".join(sorted(new)), upto)
        store.write_checkpoints(spec.pipeline, new, run_id=run_id, epoch=epoch, kind="head",
                                reason="start: head")


def _replay(spec: PipelineSpec, source: Source, store: CheckpointStore, run_id: str,
            replay_of: str, only: Sequence[str] | None, resolve: Resolver | None,
            reader: Reader) -> RunReport:
    """Re-deliver exactly the ranges a past run delivered, to the chosen sinks. Checkpoints
    never move backwards: the coordinator only writes positions beyond the stored ones."""
    ranges = _delivered_ranges(store, spec.pipeline, replay_of)
    chosen = _chosen_sinks(spec, only) & set(ranges)
    if not chosen:
        raise RunError(f"run {replay_of!r} delivered nothing to the chosen sinks")
    _check_replayable(spec, source, replay_of, {sid: ranges[sid] for sid in chosen})
    sinks = build_sinks(spec, sorted(chosen), resolve)
    epoch = store.acquire_lease(spec.pipeline, run_id)
    starts = {sid: ranges[sid][0] for sid in chosen}
    upto = max(ranges[sid][1] for sid in chosen)
    journal_id = store.journal_begin(spec.pipeline, run_id, mode="replay")
    log.info("pipeline %s run %s: replaying run %s to %s", spec.pipeline, run_id, replay_of,
             ", ".join(f"{sid} ({a}, {b}]" for sid, (a, b) in sorted(ranges.items()) if sid in chosen))
    with Coordinator(store, spec.pipeline, run_id, epoch, sinks, spec.batch, journal_id=journal_id,
                     starts=starts, ends={sid: ranges[sid][1] for sid in chosen}) as co:
        return co.run(reader(source, co.lowest_start(), upto))


def _check_replayable(spec: PipelineSpec, source: Source, replay_of: str,
                      ranges: dict[str, tuple[Position | None, Position]]) -> None:
    """A past run's range is a range of the server it was read from: after a failover it
    cannot be read again from the new one."""
    now = lineage_of_identity(source.identity())
    for sid, (_, end) in ranges.items():
        if end.lineage is not None and now is not None and end.lineage != now:
            raise RunError(f"pipeline {spec.pipeline!r}: run {replay_of!r} delivered to sink {sid} a "
                           f"range of {describe_lineage(end.lineage)}, but the source is now "
                           f"{describe_lineage(now)} (a failover happened since): that range cannot "
                           f"be replayed from the new server")


def _delivered_ranges(store: CheckpointStore, pipeline: str, run_id: str
                      ) -> dict[str, tuple[Position | None, Position]]:
    """Per sink, the range a past run delivered over all its attempts (an attempt that failed
    part-way may have moved some sinks)."""
    entries = [e for e in store.journal(pipeline, run_id) if e.mode == "incremental"]
    if not entries:
        raise RunError(f"pipeline {pipeline!r} has no journal entry for run {run_id!r}; "
                       f"`tidegate status {pipeline}` shows the checkpoints, the journal lists runs")
    ranges: dict[str, tuple[Position | None, Position]] = {}
    for entry in entries:
        for sid, js in entry.sinks.items():
            moved = js.to_position is not None and (js.from_position is None
                                                    or js.to_position > js.from_position)
            if not moved:
                continue
            lo, hi = ranges.get(sid, (js.from_position, js.to_position))
            lo = None if lo is None or js.from_position is None else min(lo, js.from_position)
            ranges[sid] = (lo, max(hi, js.to_position))
    return ranges


def _dry_run(spec: PipelineSpec, source: Source, store: CheckpointStore, upto: Position,
             reader: Reader) -> dict[str, Any]:
    """Read and cut the range as a run would; deliver nothing, move nothing."""
    from .batching import cut_sub_batches

    bounds = Bounds(spec.pipeline, upto, {s.id: None for s in spec.sinks})
    stored = store.checkpoints(spec.pipeline)
    bounds.sinks.update({sid: rec.position for sid, rec in stored.items() if sid in bounds.sinks})
    batches = events = size = 0
    for b in cut_sub_batches(reader(source, bounds.lowest, upto), max_events=spec.batch.max_events,
                             max_bytes=spec.batch.max_bytes, respect_source_tx=spec.batch.respect_source_tx):
        batches, events, size = batches + 1, events + b.event_count, size + b.byte_size
    return {"pipeline": spec.pipeline, "mode": "dry_run", "bounds": bounds.to_json(),
            "sub_batches": batches, "events": events, "bytes": size}


# --------------------------------------------------------------------------- release


def release(pipeline: str | PipelineSpec, *, resolve: Resolver | None = None,
            store: CheckpointStore | None = None) -> dict[str, Any]:
    """Let the source recycle its log up to the lowest committed sink checkpoint: a sink that
    is behind holds the log it still needs."""
    spec = find_spec(pipeline)
    with _opened(spec, resolve, store) as (source, st):
        stored = st.checkpoints(spec.pipeline)
        positions = [stored[s.id].position if s.id in stored else None for s in spec.sinks]
        low = lowest_start(positions)
        if low is not None:
            source.release(low)
        return {"pipeline": spec.pipeline, "released_to": position_to_json(low)}
