"""Capture a run's bounds; skip Spark when there is nothing to do (docs/architecture.md, "One run")."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Context, SkipMixin

from .base import TaskRun, TidegateBaseOperator


class TidegateBoundsOperator(TidegateBaseOperator, SkipMixin):
    """The source head now (the run's upper bound ``upto``) and each sink's checkpoint, as XCom;
    sinks without a checkpoint are placed at the head under ``start: head``, and a range with
    nothing the pipeline delivers moves the checkpoints without Spark.

    Returns (XCom ``return_value``) ``{"pipeline", "upto", "checkpoints": {sink_id: position |
    None}, "nothing_to_do"}``. When every chosen sink already has everything up to ``upto``, the
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

    def run(self, task: TaskRun, context: Context) -> dict[str, Any]:
        from tidegate import runner

        bounds = runner.prepare_bounds(task.spec, resolve=task.resolve)
        out = bounds.to_json()
        self.log.info("pipeline %s: upper bound %s", task.spec.pipeline, bounds.upto)
        for sink_id, pos in bounds.checkpoints.items():
            self.log.info("pipeline %s: sink %s checkpoint %s", task.spec.pipeline, sink_id, pos)
        idle = bounds.nothing_to_do(task.plan.sinks)
        if not (idle and self.short_circuit and task.plan.mode != "replay"):
            return out
        to_skip = [t for t in self._downstream(context) if not getattr(t, "is_teardown", False)]
        self.log.info("pipeline %s: nothing new up to %s; skipping %s", task.spec.pipeline, bounds.upto,
                      ", ".join(t.task_id for t in to_skip) or "nothing")
        if to_skip:
            # Skipping ends execute() with an exception, so the bounds are pushed first.
            context["ti"].xcom_push(key="return_value", value=out)
            self.skip(ti=context["ti"], tasks=to_skip)
        return out

    def _downstream(self, context: Context) -> list:
        task = context.get("task") or self
        if self.ignore_downstream_trigger_rules:
            return list(task.get_flat_relatives(upstream=False))
        return list(task.get_direct_relatives(upstream=False))
