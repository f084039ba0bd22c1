"""What every tidegate task needs, resolved once per task: the spec, the run plan, the run id
and the parts its source and sinks are made by (from Airflow's connections); and one rule for
engine errors (a fatal one is not retried)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow.sdk import BaseOperator

from ..connections import airflow_resolver, aliased
from ..exceptions import TidegateFailure, fail_fast
from ..params import plan_for_run, run_id_of


@dataclass(frozen=True)
class TaskRun:
    """One task's view of its run."""

    spec: Any  # tidegate.spec.PipelineSpec
    plan: Any  # tidegate.plan.RunPlan
    run_id: str
    parts: Any  # tidegate.parts.Parts, on Airflow's connections


class TidegateTaskMixin:
    """Mixed into every tidegate operator (also the Spark deliver operator, which must be a
    SparkSubmitOperator). Subclasses implement :meth:`run`; ``execute`` resolves the task's
    :class:`TaskRun` and turns fatal engine errors into failures Airflow does not retry.

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

    def plan_overrides(self) -> Mapping[str, Any] | None:
        """Operator arguments that override the run's params (the deliver operator has some)."""
        return None

    def task_run(self, context: Mapping[str, Any]) -> TaskRun:
        from tidegate import catalog  # the spec is read when the task runs, never at parse time
        from tidegate.parts import Parts

        spec = catalog.find(self.pipeline)
        plan = plan_for_run(context, sink_ids=[s.id for s in spec.sinks], overrides=self.plan_overrides())
        aliases = {spec.source.conn_id: self.source_conn_id} if self.source_conn_id else None
        parts = self.parts or Parts(aliased(airflow_resolver, aliases))
        return TaskRun(spec, plan, run_id_of(context), parts)

    def execute(self, context: Any) -> Any:
        from tidegate.errors import TidegateError

        try:
            return self.run(self.task_run(context), context)
        except TidegateFailure:
            raise
        except TidegateError as exc:
            fail_fast(exc)
            raise

    def run(self, task: TaskRun, context: Any) -> Any:
        raise NotImplementedError


class TidegateBaseOperator(TidegateTaskMixin, BaseOperator):
    ui_color = "#d6f0f5"

    def __init__(self, *, pipeline: str, source_conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.source_conn_id = source_conn_id


__all__: list[str] = ["TaskRun", "TidegateBaseOperator", "TidegateTaskMixin"]
