"""Capture a run's bounds; skip Spark when there is nothing to do (DESIGN.md, "One run" step 2)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Context, SkipMixin

from .._engine import engine
from .base import TidegateBaseOperator


class TidegateBoundsOperator(TidegateBaseOperator, SkipMixin):
    """The source head now (the run's upper bound) and each sink's checkpoint, as XCom.

    Returns (XCom ``return_value``) ``{"pipeline", "upto", "sinks": {sink_id: position | None},
    "nothing_to_do"}``. When every chosen sink already has everything up to the head, the
    operator short-circuits like ``ShortCircuitOperator``: the tasks directly downstream (the
    Spark deliver task) are skipped and the run still succeeds; tasks further down follow their
    trigger rules (``none_failed`` release/report tasks still run). A replay never
    short-circuits.

    :param pipeline: the pipeline name.
    :param short_circuit: skip downstream tasks when there is nothing to do.
    :param ignore_downstream_trigger_rules: skip every downstream task, not only the direct ones.
    :param source_conn_id: override the spec's source connection.
    """

    ui_color = "#e2ecf9"

    def __init__(self, *, pipeline: str, short_circuit: bool = True,
                 ignore_downstream_trigger_rules: bool = False, **kwargs: Any) -> None:
        super().__init__(pipeline=pipeline, **kwargs)
        self.short_circuit = short_circuit
        self.ignore_downstream_trigger_rules = ignore_downstream_trigger_rules

    def execute(self, context: Context) -> dict[str, Any]:
        spec = self.load_spec()
        plan = self.run_plan(context, spec)
        bounds = engine("runner").capture_bounds(spec, resolve=self.resolver(spec))
        idle = nothing_to_do(bounds, plan.sinks)
        self.log.info("pipeline %s: upper bound %s", spec.pipeline, bounds.get("upto"))
        for sink_id, pos in (bounds.get("sinks") or {}).items():
            self.log.info("pipeline %s: sink %s checkpoint %s", spec.pipeline, sink_id, pos)
        if not (idle and self.short_circuit and plan.mode != "replay"):
            return bounds
        to_skip = [t for t in self._downstream(context) if not getattr(t, "is_teardown", False)]
        self.log.info("pipeline %s: nothing new up to %s; skipping %s", spec.pipeline, bounds.get("upto"),
                      ", ".join(t.task_id for t in to_skip) or "nothing")
        if to_skip:
            # Skipping ends execute() with an exception, so the bounds are pushed first.
            context["ti"].xcom_push(key="return_value", value=bounds)
            self.skip(ti=context["ti"], tasks=to_skip)
        return bounds

    def _downstream(self, context: Context) -> list:
        task = context.get("task") or self
        if self.ignore_downstream_trigger_rules:
            return list(task.get_flat_relatives(upstream=False))
        return list(task.get_direct_relatives(upstream=False))


def nothing_to_do(bounds: dict[str, Any], sinks: list[str] | None = None) -> bool:
    """True when each chosen sink's checkpoint is at or past the upper bound."""
    if not sinks:
        return bool(bounds.get("nothing_to_do"))
    from tidegate.positions import position_from_json

    upto = position_from_json(bounds.get("upto"))
    stored = bounds.get("sinks") or {}
    for sink_id in sinks:
        pos = position_from_json(stored.get(sink_id))
        if pos is None or upto is None or pos < upto:
            return False
    return True
