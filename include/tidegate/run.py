"""One run as one object (docs/architecture.md, "One run").

A run crosses several processes: the Airflow tasks (guard, bounds, deliver, release, report),
the Spark driver and its tasks, or one ``tidegate run``. Each step is handed a
:class:`RunContext`: the spec, the run's plan and id, the store and the :class:`~tidegate.parts.Parts`
its source and sinks are made by. What the bounds step decides (the frozen upper bound, each
sink's start, the replay ranges) is written once to the store as the run's :class:`RunRecord`,
keyed by ``(pipeline, run id)``, with the spec's text and the validated plan. The steps after it
receive only ``(pipeline, run id)`` and read the record: they parse the spec once, validate no
plan again and recompute nothing the bounds step decided.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .errors import RunError
from .parts import Parts
from .plan import RunPlan
from .positions import Position, lowest_start, position_from_json, position_to_json
from .segments import Segment, segment_from_json, segment_to_json
from .spec import PipelineSpec, load_spec_text
from .store import open_store

if TYPE_CHECKING:
    from .sources.base import Source
    from .store import CheckpointStore


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
    (parsed once by each process that reads the record), the validated plan and the bounds and
    the read plan. Bounds None: a deliver task without a bounds task wrote only the spec and the
    plan, for its Spark driver to read; the driver runs the bounds step (``runner.bounded``)."""

    pipeline: str
    run_id: str
    spec_text: str
    spec_path: str | None
    plan: RunPlan
    bounds: Bounds | None = None
    segments: tuple[Segment, ...] | None = None  # the read plan (reading.py); None: none made

    def to_json(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "run_id": self.run_id, "spec_text": self.spec_text,
                "spec_path": self.spec_path, "plan": self.plan.to_json(),
                "bounds": self.bounds.to_json() if self.bounds is not None else None,
                "segments": None if self.segments is None else [segment_to_json(s) for s in self.segments]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RunRecord:
        bounds, segments = d.get("bounds"), d.get("segments")
        return cls(d["pipeline"], d["run_id"], d["spec_text"], d.get("spec_path"),
                   RunPlan(**d["plan"]), Bounds.from_json(bounds) if bounds else None,
                   None if segments is None else tuple(segment_from_json(s) for s in segments))

    def spec(self) -> PipelineSpec:
        spec = load_spec_text(self.spec_text, origin=self.spec_path or f"<{self.pipeline}>")
        return dataclasses.replace(spec, path=self.spec_path)


@dataclasses.dataclass(frozen=True)
class RunContext:
    """What every step of one run is handed. ``store`` None: each step opens the default store
    (``TIDEGATE_CHECKPOINT_STORE``) for its own duration. ``parts`` makes the run's source and
    sinks (tests hand fakes through it). ``record``: the run's record, once the bounds step wrote
    it (or it was read)."""

    spec: PipelineSpec
    plan: RunPlan = dataclasses.field(default_factory=RunPlan)
    run_id: str = "manual"
    parts: Parts = dataclasses.field(default_factory=Parts)
    store: CheckpointStore | None = None
    record: RunRecord | None = None
    # The run's Spark Connect session (a spark.session.LazySession) while a Connect client
    # delivers it (spark/connect.py); the runner lends it to the sinks that write through Spark.
    spark: Any = None

    @property
    def pipeline(self) -> str:
        return self.spec.pipeline

    @property
    def bounds(self) -> Bounds | None:
        return self.record.bounds if self.record is not None else None

    @contextmanager
    def opened_store(self) -> Iterator[CheckpointStore]:
        """The run's store, or the default one opened (and closed) around the caller."""
        if self.store is not None:
            yield self.store
            return
        store = open_store()
        try:
            yield store
        finally:
            store.close()

    @contextmanager
    def opened(self) -> Iterator[tuple[Source, CheckpointStore]]:
        """The pipeline's source (made by the parts) and the store."""
        with self.opened_store() as store:
            source = self.parts.source(self.spec)
            source.use_store(store)  # facts a source keeps between runs (Postgres column sets)
            try:
                yield source, store
            finally:
                source.close()

    def with_store(self, store: CheckpointStore) -> RunContext:
        return dataclasses.replace(self, store=store)

    def readable(self) -> RunContext:
        """The run with a record another process can read it from: its own, or, when no bounds
        step ran (a deliver task alone), one holding the spec and the plan only (that process runs
        the bounds step, ``runner.bounded``)."""
        if self.record is not None:
            return self
        with self.opened_store() as store:
            return self.recorded(None, store)

    def recorded(self, bounds: Bounds | None, store: CheckpointStore,
                 segments: Sequence[Segment] | None = None, *, keep: bool = True) -> RunContext:
        """The context holding the run's record (what the bounds step decided), written to the
        store (``keep``) for the steps after it."""
        record = RunRecord(self.pipeline, self.run_id, self.spec.text, self.spec.path, self.plan, bounds,
                           None if segments is None else tuple(segments))
        if keep:
            store.runs.put_record(self.pipeline, self.run_id, record.to_json())
        return dataclasses.replace(self, record=record)


def read_record(store: CheckpointStore, pipeline: str, run_id: str) -> RunRecord | None:
    found = store.runs.record(pipeline, run_id)
    return RunRecord.from_json(found) if found is not None else None


def from_record(store: CheckpointStore, pipeline: str, run_id: str, parts: Parts | None = None) -> RunContext:
    """The context, on ``store``, of a run whose bounds step wrote its record (the Spark driver)."""
    record = read_record(store, pipeline, run_id)
    if record is None:
        raise RunError(f"pipeline {pipeline!r} has no run record for run {run_id!r}: its bounds step "
                       f"did not run (or wrote to another store than TIDEGATE_CHECKPOINT_STORE)")
    return RunContext(record.spec(), record.plan, run_id, parts or Parts(), store, record)


__all__ = ["Bounds", "RunContext", "RunRecord", "from_record", "read_record"]
