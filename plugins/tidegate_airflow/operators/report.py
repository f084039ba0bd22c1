"""Report a run: events, bytes and lag per sink, in the task log and as Airflow metrics."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Context

from .. import metrics
from .base import TidegateBaseOperator


class TidegateReportOperator(TidegateBaseOperator):
    """Summarise the run from its record (the bounds) and the XComs of the deliver task (and of
    the release task, when this one runs after it); log one line per sink and emit metrics
    through Airflow's ``Stats`` (names in tidegate_airflow/metrics.py): the run's
    ``tidegate.events`` / ``bytes`` (/ ``dlq`` / ``duplicates``) per sink, then the pipeline's
    state from the store: ``incidents_open``, and per sink ``lag_bytes``, ``lag_seconds``
    (against the run's upper bound: the report contacts no source and reads no spec folder),
    ``checkpoint_age_seconds``. A dry run emits only the state.

    :param pipeline: the pipeline name.
    :param deliver_task_id: task whose XCom is the run report (None when it was skipped).
    :param release_task_id: task whose XCom says where the source was released to (None: not
        read; the DAG factory runs report beside release, not after it, and release logs it).
    :param emit_metrics: send metrics.
    """

    ui_color = "#f0e6f5"
    reads_record = True

    def __init__(self, *, pipeline: str, deliver_task_id: str | None = "deliver",
                 release_task_id: str | None = "release",
                 emit_metrics: bool = True, **kwargs: Any) -> None:
        super().__init__(pipeline=pipeline, **kwargs)
        self.deliver_task_id = deliver_task_id
        self.release_task_id = release_task_id
        self.emit_metrics = emit_metrics

    def run(self, run: Any, context: Context) -> dict[str, Any]:
        ti = context["ti"]

        def pull(task_id: str | None) -> Any:
            return ti.xcom_pull(task_ids=task_id) if task_id else None

        spec, plan = run.spec, run.plan
        summary = summarize(spec, report=pull(self.deliver_task_id), bounds=run.bounds.to_json(),
                            released=pull(self.release_task_id), mode=plan.mode)
        summary["run_id"] = run.run_id
        for line in format_summary(summary):
            self.log.info("%s", line)
        for s in summary["sinks"]:
            if s.get("dlq"):
                self.log.warning("pipeline %s: sink %s sent %d event(s) to its dead-letter queue in this "
                                 "run (on_poison: dlq); the DLQ records name each event and the error",
                                 spec.pipeline, s["id"], s["dlq"])
        if self.emit_metrics and plan.mode != "dry_run":
            emit_metrics(summary)
        if self.emit_metrics:
            metrics.emit_state(spec.pipeline, parts=run.parts, status=_state(run))
        return summary


def _state(run: Any) -> dict[str, Any] | None:
    """The pipeline's state from the store, its lag against the run's upper bound (None: the
    store could not be read, and the state is read as the status page reads it)."""
    from tidegate.status import pipeline_status

    try:
        with run.opened_store() as store:
            return pipeline_status(store, run.pipeline, run.spec, (run.bounds.upto, None, None))
    except Exception:  # noqa: BLE001 - metrics never fail the task: read the state the usual way
        return None


def summarize(spec: Any, *, report: dict | None, bounds: dict, released: dict | None,
              mode: str = "incremental") -> dict[str, Any]:
    """Pure: the run's per-sink numbers from its bounds and the XComs (the deliver and release
    ones may be None: skipped, or not read)."""
    from tidegate.positions import position_from_json

    upto = position_from_json(bounds.get("upto"))
    by_id = {s.get("id"): s for s in (report or {}).get("sinks") or []}
    sinks = []
    for s in spec.sinks:
        r = by_id.get(s.id) or {}
        at = r.get("end") or r.get("checkpoint") or (bounds.get("checkpoints") or {}).get(s.id)
        position = position_from_json(at)
        if report is None or mode == "dry_run":
            status = "nothing_to_do" if bounds.get("nothing_to_do") else ("dry_run" if mode == "dry_run"
                                                                            else "not_run")
        else:
            status = r.get("status") or ("not_chosen" if not r else "unknown")
        lag = position.bytes_to(upto) if position is not None and upto is not None else None
        behind = None if upto is None else (position is None or lag is None or lag > 0)
        sinks.append({"id": s.id, "kind": s.kind, "required": s.required, "status": status,
                      "events": int(r.get("events") or 0), "bytes": int(r.get("bytes") or 0),
                      "position": at, "lag_bytes": lag, "behind": behind, "error": r.get("error"),
                      "dlq": r.get("dlq"), "duplicates": r.get("duplicates")})
    return {"pipeline": spec.pipeline, "mode": mode,
            "nothing_to_do": bool(bounds.get("nothing_to_do")) and report is None,
            "events": int((report or {}).get("events") or 0),
            "bytes": int((report or {}).get("bytes") or 0),
            "sub_batches": int((report or {}).get("sub_batches") or 0),
            "upto": bounds.get("upto"), "released_to": (released or {}).get("released_to"), "sinks": sinks}


def format_summary(summary: dict[str, Any]) -> list[str]:
    head = (f"pipeline {summary['pipeline']} ({summary['mode']}): "
            + ("nothing to do" if summary["nothing_to_do"] else
               f"{summary['events']} events, {summary['bytes']} bytes in {summary['sub_batches']} "
               f"sub-batch(es)")
            + f"; upper bound {summary['upto']}"
            # Known only when the report runs after release (the DAG factory runs them side by side).
            + (f"; released to {summary['released_to']}" if summary["released_to"] is not None else ""))
    lines = [head]
    for s in summary["sinks"]:
        lines.append(f"  sink {s['id']} ({s['kind']}{', required' if s['required'] else ''}): "
                     f"{s['status']}, {s['events']} events, {s['bytes']} bytes, at {s['position']}, "
                     f"lag {s['lag_bytes'] if s['lag_bytes'] is not None else '?'} bytes"
                     + (f", error: {s['error']}" if s.get("error") else ""))
    return lines


def emit_metrics(summary: dict[str, Any], stats: Any = None) -> None:
    """The run's counters (names and types: tidegate_airflow/metrics.py)."""
    metrics.emit_run(summary, stats)
