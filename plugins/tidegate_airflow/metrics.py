"""tidegate's metrics through Airflow's ``Stats`` (StatsD or OpenTelemetry, as configured in
Airflow's ``[metrics]`` section), emitted by the report task after every run and by a failure
callback on every task, so a failed or halted run reports too.

Every name carries the pipeline (and the sink) so that plain StatsD, which has no tags, can
tell them apart; the same values also go out with ``pipeline``/``sink`` tags for backends that
keep tags (Datadog / InfluxDB StatsD, OpenTelemetry):

==============================================  =======  ==========================================
name                                            type     value
==============================================  =======  ==========================================
``tidegate.events.<pipeline>.<sink>``           counter  events the sink received in the run
``tidegate.bytes.<pipeline>.<sink>``            counter  bytes the sink received in the run
``tidegate.dlq.<pipeline>.<sink>``              counter  events sent to the sink's dead-letter queue
``tidegate.duplicates.<pipeline>.<sink>``       counter  NATS: messages JetStream reported as duplicates
``tidegate.skipped.<pipeline>.<sink>``          counter  NATS: messages a retry or a new run found stored
                                                         after the last commit marker and did not send
``tidegate.lag_bytes.<pipeline>.<sink>``        gauge    source log bytes between checkpoint and head
``tidegate.lag_seconds.<pipeline>.<sink>``      gauge    0 at the head, else seconds since the
                                                         checkpoint last moved
``tidegate.checkpoint_age_seconds.<p>.<sink>``  gauge    seconds since the checkpoint was written
``tidegate.incidents_open.<pipeline>``          gauge    open continuity incidents (halted when > 0)
``tidegate.retention_headroom_seconds.<p>``     gauge    MySQL/MariaDB: binlog expiry minus the age
                                                         of the oldest checkpoint (sent by the guard
                                                         task, on every run, when an expiry is set)
``tidegate.retention_headroom_bytes.<p>``       gauge    PostgreSQL: WAL the slot may still fall
                                                         behind before the server invalidates it
                                                         (safe_wal_size; when max_slot_wal_keep_size
                                                         is set)
==============================================  =======  ==========================================

``dlq``, ``duplicates`` and ``skipped`` are sent when the run report carries them. A dry run
emits no counters. Emitting never fails a task: a metrics problem is logged and swallowed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

COUNTERS = ("events", "bytes", "dlq", "duplicates", "skipped")
SINK_GAUGES = ("lag_bytes", "lag_seconds", "checkpoint_age_seconds")


def _stats(stats: Any) -> Any:
    if stats is not None:
        return stats
    from airflow.sdk.observability.stats import Stats

    return Stats


def emit_run(summary: Mapping[str, Any], stats: Any = None) -> None:
    """Per-sink counters of one run (the report task's summary)."""
    if summary.get("mode") == "dry_run":
        return
    stats = _stats(stats)
    p = summary["pipeline"]
    for s in summary.get("sinks") or []:
        tags = {"pipeline": p, "sink": s["id"]}
        for name in COUNTERS:
            if s.get(name) is not None:
                stats.incr(f"tidegate.{name}.{p}.{s['id']}", int(s[name]), tags=tags)


def emit_state(pipeline: str, *, stats: Any = None, parts: Any = None, status: Any = None) -> None:
    """Gauges of where the pipeline stands now (store + source head): open incidents, and per
    sink the checkpoint's age and the lag. Needs no XCom, so it works from a failure callback."""
    try:
        stats = _stats(stats)
        if status is None:
            from tidegate.status import pipelines_status

            status = pipelines_status(pipelines=[pipeline], parts=parts)["pipelines"][0]
        tags = {"pipeline": pipeline}
        stats.gauge(f"tidegate.incidents_open.{pipeline}", status["incidents_open"], tags=tags)
        for s in status["sinks"]:
            for name in SINK_GAUGES:
                if s.get(name) is not None:
                    stats.gauge(f"tidegate.{name}.{pipeline}.{s['id']}", s[name],
                                tags={**tags, "sink": s["id"]})
        if status.get("head_error"):
            log.warning("pipeline %s: lag unknown: %s", pipeline, status["head_error"])
    except Exception:  # noqa: BLE001 - metrics must never fail a task or mask its error
        log.exception("pipeline %s: could not emit the state metrics", pipeline)


def emit_headroom(pipeline: str, headroom: Mapping[str, float], stats: Any = None) -> None:
    """The retention headroom the guard's preflight measured (``seconds`` / ``bytes``), so an
    alert can fire before the source drops changes the pipeline still needs."""
    try:
        stats = _stats(stats)
        for unit, value in headroom.items():
            stats.gauge(f"tidegate.retention_headroom_{unit}.{pipeline}", value, tags={"pipeline": pipeline})
    except Exception:  # noqa: BLE001 - metrics must never fail a task or mask its error
        log.exception("pipeline %s: could not emit the headroom metrics", pipeline)


def pipeline_of(context: Mapping[str, Any]) -> str | None:
    """The tidegate pipeline of a task context: the operator's ``pipeline``, else the DAG id."""
    task = context.get("task")
    p = getattr(task, "pipeline", None)
    if isinstance(p, str) and p:
        return p
    dag_id = getattr(context.get("dag"), "dag_id", None) or getattr(task, "dag_id", None) or ""
    return dag_id[len("cdc_"):] if dag_id.startswith("cdc_") else None


def on_task_failure(context: Mapping[str, Any]) -> None:
    """``on_failure_callback`` / ``on_retry_callback`` of the pipeline DAGs' tasks: a failed or
    halted run still reports open incidents, checkpoint age and lag."""
    pipeline = pipeline_of(context)
    if pipeline:
        from tidegate.parts import Parts

        from .connections import airflow_connection

        emit_state(pipeline, parts=Parts(airflow_connection))
