"""What every tidegate task needs, resolved once per task: the run's context (spec, plan, run
id, and the parts its source and sinks are made by, on Airflow's connections); and one rule for
engine errors (a fatal one is not retried).

The tasks upstream of the run's record (the guard and the bounds task) read the spec and
validate the run's params; the bounds task writes the record. The tasks after it (deliver,
release, report) read the record instead: the spec it holds, the plan it holds, the bounds it
decided (docs/architecture.md, "One run").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator

from ..connections import airflow_connection, airflow_variable, aliased
from ..exceptions import TidegateFailure, fail_fast
from ..params import plan_for_run, run_id_of


class TidegateTaskMixin:
    """Mixed into every tidegate operator (also the Spark deliver operator, which must be a
    SparkSubmitOperator). Subclasses implement :meth:`run`; ``execute`` resolves the task's
    ``tidegate.run.RunContext`` and turns fatal engine errors into failures Airflow does not retry.

    :param pipeline: the pipeline name (``pipeline:`` in its spec; the DAG id is ``cdc_<pipeline>``).
    :param source_conn_id: use this Airflow connection for the source instead of the spec's
        ``source.conn_id`` (the engine still sees the spec's id).
    """

    template_fields: Sequence[str] = ("pipeline", "source_conn_id")
    pipeline: str
    source_conn_id: str | None
    #: What the task's source and sinks are made by (a ``tidegate.parts.Parts``); None: from
    #: Airflow's connections. Tests set one that hands out their fakes.
    parts: Any = None
    #: Whether the task reads the run's record (written by the bounds step) rather than the
    #: spec folder and the params: the tasks downstream of bounds do.
    reads_record: bool = False

    def plan_overrides(self) -> Mapping[str, Any] | None:
        """Operator arguments that override the run's params (the bounds operator has some)."""
        return None

    def run_context(self, context: Mapping[str, Any]) -> Any:
        """The run's context: from its record when this task reads one (the bounds step wrote
        it), else from the spec folder and the run's params (validated here)."""
        from tidegate import catalog  # the spec is read when the task runs, never at parse time
        from tidegate.bounds_step import from_record
        from tidegate.run import RunContext
        from tidegate.store import open_store

        run_id = run_id_of(context)
        if self.reads_record:  # a run without a record fails here, naming the bounds step
            with open_store() as store:
                run = from_record(store, self.pipeline, run_id)
            return dataclasses.replace(run, parts=self._parts(run.spec), store=None)
        spec = catalog.find(self.pipeline)
        plan = plan_for_run(context, sink_ids=[s.id for s in spec.sinks], overrides=self.plan_overrides())
        return RunContext(spec, plan, run_id, self._parts(spec))

    def _parts(self, spec: Any) -> Any:
        from tidegate.parts import Parts

        aliases = {spec.source.conn_id: self.source_conn_id} if self.source_conn_id else None
        return self.parts or Parts(aliased(airflow_connection, aliases), airflow_variable)

    def execute(self, context: Any) -> Any:
        from tidegate.errors import TidegateError

        try:
            return self.run(self.run_context(context), context)
        except TidegateFailure:
            raise
        except TidegateError as exc:
            fail_fast(exc)
            raise

    def run(self, run: Any, context: Any) -> Any:
        raise NotImplementedError


class TidegateBaseOperator(TidegateTaskMixin, BaseOperator):
    ui_color = "#d6f0f5"

    def __init__(self, *, pipeline: str, source_conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.source_conn_id = source_conn_id


def without_resolution(run: Any) -> Any:
    """The run's context with no incident resolution in its plan."""
    return dataclasses.replace(run, plan=dataclasses.replace(run.plan, resolve=None, reason=None))


__all__: list[str] = ["TidegateBaseOperator", "TidegateTaskMixin"]
