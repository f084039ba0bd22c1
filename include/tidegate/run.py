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

from .errors import RunError
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
    sinks (tests hand fakes through it). ``record``: the run's record, once the bounds step wrote
    it (or it was read)."""

    spec: PipelineSpec
    plan: RunPlan = dataclasses.field(default_factory=RunPlan)
    run_id: str = "manual"
    parts: Parts = dataclasses.field(default_factory=Parts)
    store: CheckpointStore | None = None
    record: Any = None  # a bounds_step.RunRecord
    # The run's Spark Connect session (a spark.session.LazySession) while a Connect client
    # delivers it (spark/connect.py); the runner lends it to the sinks that write through Spark.
    spark: Any = None

    @property
    def pipeline(self) -> str:
        return self.spec.pipeline

    @property
    def bounds(self) -> Any:  # a bounds_step.Bounds: the record's
        if self.record is None:  # the delivery never decides a bound itself
            raise RunError(f"pipeline {self.pipeline!r}, run {self.run_id!r} has no bounds: its bounds "
                           f"step (bounds_step.prepare_bounds) comes before the delivery")
        return self.record.bounds

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


__all__ = ["RunContext"]
