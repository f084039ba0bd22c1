"""Capture a run's bounds and write its record; skip Spark when there is nothing to do
(docs/architecture.md, "One run")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk import Context, SkipMixin

from .base import TidegateBaseOperator


class TidegateBoundsOperator(TidegateBaseOperator, SkipMixin):
    """The source head now (the run's upper bound ``upto``) and each sink's checkpoint; sinks
    without a checkpoint are placed at the head under ``start: head``, and a range with nothing
    the pipeline delivers moves the checkpoints without Spark. What it decides is written to the
    store as the run's record (with the spec and the validated plan), which the deliver, release
    and report tasks read.

    Returns (XCom ``return_value``) ``{"pipeline", "upto", "checkpoints": {sink_id: position |
    None}, "nothing_to_do"}``. When every chosen sink already has everything up to ``upto``, the
    operator short-circuits like ``ShortCircuitOperator``: the tasks directly downstream (the
    Spark deliver task) are skipped and the run still succeeds; tasks further down follow their
    trigger rules (``none_failed`` release/report tasks still run).

    A replay (``mode=replay``, a backfill run, or a cleared run that already delivered) reads
    the range the replayed run delivered from the journal instead, adds ``replay_of`` and
    ``ranges`` to the XCom and moves nothing (it takes no lease, so it never fences a run in
    flight). When that run delivered nothing to the chosen sinks (a backfill over an interval
    whose scheduled run had nothing to do) it short-circuits the same way; an explicit
    ``replay_of`` that the journal does not know fails here, before Spark.

    :param pipeline: the pipeline name.
    :param mode, sinks, max_events, replay_of: override the run's params (None: from the params /
        ``dag_run.conf``); the record holds the plan the run follows.
    :param short_circuit: skip downstream tasks when there is nothing to do.
    :param ignore_downstream_trigger_rules: skip every downstream task, not only the direct ones.
    :param source_conn_id: override the spec's source connection.
    """

    ui_color = "#e2ecf9"

    def __init__(self, *, pipeline: str, short_circuit: bool = True,
                 ignore_downstream_trigger_rules: bool = False, mode: str | None = None,
                 sinks: list[str] | str | None = None, max_events: int | str | None = None,
                 replay_of: str | None = None, **kwargs: Any) -> None:
        super().__init__(pipeline=pipeline, **kwargs)
        self.short_circuit = short_circuit
        self.ignore_downstream_trigger_rules = ignore_downstream_trigger_rules
        self.mode, self.sinks, self.max_events, self.replay_of = mode, sinks, max_events, replay_of

    template_fields = (*TidegateBaseOperator.template_fields, "mode", "sinks", "max_events", "replay_of")

    def plan_overrides(self) -> Mapping[str, Any]:
        return {"mode": self.mode, "sinks": self.sinks, "max_events": self.max_events,
                "replay_of": self.replay_of}

    def run(self, run: Any, context: Context) -> dict[str, Any]:
        from tidegate import bounds_step

        bounds = bounds_step.prepare_bounds(run, missing_ok=_is_backfill(context)).bounds
        pipeline, replay_of = run.pipeline, bounds.replay_of
        if replay_of is not None:
            for sink_id, (start, end) in bounds.ranges.items():
                self.log.info("pipeline %s: replaying run %s to sink %s: (%s, %s]", pipeline, replay_of,
                              sink_id, start, end)
        else:
            self.log.info("pipeline %s: upper bound %s", pipeline, bounds.upto)
            for sink_id, pos in bounds.checkpoints.items():
                self.log.info("pipeline %s: sink %s checkpoint %s", pipeline, sink_id, pos)
        out = bounds.to_json()
        if not (bounds.nothing_to_do(run.plan.sinks) and self.short_circuit):
            return out
        to_skip = [t for t in self._downstream(context) if not getattr(t, "is_teardown", False)]
        why = (f"run {replay_of} delivered nothing to replay" if replay_of is not None
               else f"nothing new up to {bounds.upto}")
        self.log.info("pipeline %s: %s; skipping %s", pipeline, why,
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


def _is_backfill(context: Context) -> bool:
    dag_run = context.get("dag_run")
    run_type = getattr(dag_run, "run_type", None) if dag_run is not None else None
    return str(getattr(run_type, "value", run_type) or "") == "backfill"
