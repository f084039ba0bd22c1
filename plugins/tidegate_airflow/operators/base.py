"""Shared base of the tidegate operators: the spec, the run plan and the connection resolver."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator

from .._engine import find_spec
from ..connections import Resolver, airflow_resolver, aliased
from ..params import RunPlan, plan_for_run


class TidegateBaseOperator(BaseOperator):
    """Base of the operators that act on one tidegate pipeline.

    :param pipeline: the pipeline name (``pipeline:`` in its spec; the DAG id is ``cdc_<pipeline>``).
    :param source_conn_id: use this Airflow connection for the source instead of the spec's
        ``source.conn_id`` (the engine still sees the spec's id).
    """

    template_fields: Sequence[str] = ("pipeline", "source_conn_id")
    ui_color = "#d6f0f5"

    def __init__(self, *, pipeline: str, source_conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.source_conn_id = source_conn_id

    # The spec is read when the task runs, never at DAG parse time.
    def load_spec(self) -> Any:
        return find_spec(self.pipeline)

    def resolver(self, spec: Any) -> Resolver:
        aliases = {spec.source.conn_id: self.source_conn_id} if self.source_conn_id else None
        return aliased(airflow_resolver, aliases)

    def run_plan(self, context: Mapping[str, Any], spec: Any,
                 overrides: Mapping[str, Any] | None = None) -> RunPlan:
        return plan_for_run(context, sink_ids=[s.id for s in spec.sinks], overrides=overrides)

    @staticmethod
    def run_id_of(context: Mapping[str, Any]) -> str:
        run_id = context.get("run_id")
        if not run_id and context.get("dag_run") is not None:
            run_id = getattr(context["dag_run"], "run_id", None)
        return str(run_id or "manual")
