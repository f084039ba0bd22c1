"""One run as one object (docs/architecture.md, "One run").

A run crosses several processes: the Airflow tasks (guard, bounds, deliver, release, report),
the Spark driver and its tasks, or one ``tidegate run``. Each step is handed a
:class:`RunContext`: the spec, the run's plan and id, the store and the :class:`~tidegate.parts.Parts`
its source and sinks are made by. What the bounds step decides (the frozen upper bound, each
sink's start, the replay ranges) is written once to the store as the run's record
(``bounds_step.RunRecord``),
keyed by ``(pipeline, run id)``, with the spec's text and the validated plan. The steps after it
receive only ``(pipeline, run id)`` and read the record: they parse the spec once, validate no
plan again and recompute nothing the bounds step decided.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .parts import Parts
from .plan import RunPlan
from .spec import PipelineSpec
from .store import open_store

if TYPE_CHECKING:
    from .sources.base import Source
    from .store import CheckpointStore


@dataclasses.dataclass(frozen=True)
class RunContext:
    """What every step of one run is handed. ``store`` None: each step opens the default store
    (``TIDEGATE_CHECKPOINT_STORE``) for its own duration. ``parts`` makes the run's source and
    sinks (tests hand fakes through it). The steps before the bounds step (guard, bounds) hold
    this; the bounds step's decision makes it a :class:`PlannedRun`."""

    spec: PipelineSpec
    plan: RunPlan = dataclasses.field(default_factory=RunPlan)
    run_id: str = "manual"
    parts: Parts = dataclasses.field(default_factory=Parts)
    store: CheckpointStore | None = None
    # The run's Spark Connect session (a spark.session.LazySession) while a Connect client
    # delivers it (spark/connect.py); the runner lends it to the sinks that write through Spark.
    spark: Any = None

    @property
    def pipeline(self) -> str:
        return self.spec.pipeline

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
        return dataclasses.replace(self, store=store)  # keeps the type: a PlannedRun stays one

    def planned(self, record: Any) -> PlannedRun:  # a bounds_step.RunRecord
        """This run with the bounds step's decision (written by it, or read back)."""
        return PlannedRun(**{f.name: getattr(self, f.name) for f in dataclasses.fields(RunContext)},
                          record=record)


@dataclasses.dataclass(frozen=True)
class PlannedRun(RunContext):
    """A run whose bounds step has decided: what the steps after it (deliver, release, report)
    are handed. Its record cannot be absent, so no step after the bounds step decides a bound."""

    # a bounds_step.RunRecord (not imported: bounds_step imports this module)
    record: Any = dataclasses.field(kw_only=True)

    @property
    def bounds(self) -> Any:  # a bounds_step.Bounds: the record's
        return self.record.bounds


__all__ = ["PlannedRun", "RunContext"]
