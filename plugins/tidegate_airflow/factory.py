"""Build one Airflow DAG ``cdc_<pipeline>`` per pipeline spec (used by ``dags/``).

Parse time stays cheap: only the spec module (PyYAML) and the operator classes are imported;
the engine (sources, sinks, store, Spark) is imported when a task runs. Each spec file is
loaded on its own, so one invalid file costs only its own DAG: :func:`load_specs` returns the
valid specs and one problem line per invalid file (file, field, problem).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

START_DATE = datetime(2024, 1, 1, tzinfo=UTC)
RETRY_DELAY_S = 20
RETRY_DELAY_ENV = "TIDEGATE_AIRFLOW_RETRY_DELAY_S"


def retry_delay() -> timedelta:
    """The delay before a failed task's first retry (Airflow doubles it for each next one, with
    jitter): ``RETRY_DELAY_S``, or ``$TIDEGATE_AIRFLOW_RETRY_DELAY_S`` seconds (1 to 3600), for a
    deployment (or a test) whose faults heal faster. Read when the DAGs are built."""
    raw = os.environ.get(RETRY_DELAY_ENV, "").strip()
    if not raw:
        return timedelta(seconds=RETRY_DELAY_S)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 1 <= seconds <= 3600:
        raise ValueError(f"{RETRY_DELAY_ENV}={raw!r}: not a number of seconds between 1 and 3600; set "
                         f"it so (or unset it for the default {RETRY_DELAY_S} s)")
    return timedelta(seconds=seconds)


DEFAULT_ARGS: dict[str, Any] = {
    "owner": "tidegate",
    "retries": 3,
    "retry_delay": timedelta(seconds=RETRY_DELAY_S),
    "retry_exponential_backoff": 2.0,
    "max_retry_delay": timedelta(minutes=10),
    "execution_timeout": timedelta(minutes=15),
}
DELIVER_TIMEOUT = timedelta(hours=1)
DAGRUN_TIMEOUT = timedelta(hours=2)


def load_specs(directory: str | Path | None = None) -> tuple[list[Any], list[str]]:
    """(valid specs, problem lines) of the pipelines folder (see :mod:`tidegate.catalog`)."""
    from tidegate.catalog import scan

    catalog = scan(directory)
    return catalog.specs, catalog.problems


def doc_md(spec: Any) -> str:
    text = spec.text or ""
    if not text:
        import yaml

        text = yaml.safe_dump(spec.raw, sort_keys=False)

    sinks = "\n".join(
        f"| `{s.id}` | {s.kind} | `{s.conn_id}` | {'yes' if s.required else 'no'} | {s.guarantee} |"
        for s in spec.sinks)
    policy = spec.batch.commit_policy
    if policy == "quorum":
        policy += f" ({spec.batch.quorum})"
    return f"""\
### tidegate pipeline `{spec.pipeline}` (tenant `{spec.tenant}`)

Change data capture from **{spec.source.kind}** (connection `{spec.source.conn_id}`) in bounded
micro-batches: `guard` → `bounds` → `deliver` (Spark) → `release` and `report` side by side.
Schedule: `{spec.schedule or 'manual only'}`. Commit policy: **{policy}**.
Sub-batches: at most {spec.batch.max_events} events / {spec.batch.max_bytes} bytes.

| sink | kind | connection | required | guarantee |
|---|---|---|---|---|
{sinks}

**Trigger params**: `mode` (incremental, replay with `replay_of`, dry_run), `sinks`, `max_events`,
`resolve` (accept_gap, resnapshot with optional `tables`, continue) with a `reason` to resolve
a continuity incident.
A halted run fails at `guard` without retries; the message names the missing range.

Spec file: `{spec.path}`

```yaml
{text.rstrip()}
```
"""


def create_dag(spec: Any) -> Any:
    """The DAG of one pipeline."""
    from airflow.sdk import DAG

    from .assets import delivered_alias
    from .metrics import on_task_failure
    from .operators import (
        TidegateBoundsOperator,
        TidegateDeliverOperator,
        TidegateGuardOperator,
        TidegateReleaseOperator,
        TidegateReportOperator,
    )
    from .params import run_params

    sink_kinds = sorted({s.kind for s in spec.sinks})
    with DAG(
        dag_id=spec.dag_id,
        description=f"CDC {spec.source.kind} → {', '.join(s.id for s in spec.sinks)}",
        schedule=spec.schedule,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        dagrun_timeout=DAGRUN_TIMEOUT,
        # Metrics also when a run fails or halts (tidegate_airflow/metrics.py).
        default_args={**DEFAULT_ARGS, "retry_delay": retry_delay(), "on_failure_callback": on_task_failure,
                      "on_retry_callback": on_task_failure},
        tags=["cdc", spec.source.kind, *sink_kinds],
        doc_md=doc_md(spec),
        params=run_params([s.id for s in spec.sinks]),
    ) as dag:
        p = spec.pipeline
        guard = TidegateGuardOperator(task_id="guard", pipeline=p)
        bounds = TidegateBoundsOperator(task_id="bounds", pipeline=p)
        # One deliver per pipeline at a time, whatever started the run: max_active_runs does not
        # hold back backfill runs, and two delivers would fence each other (the store lease, the
        # Kafka transactional.id). A second one waits, scheduled, until the first ends.
        deliver = TidegateDeliverOperator(
            task_id="deliver", pipeline=p, spark_conn_id=spec.spark.conn_id,
            conf=dict(spec.spark.conf) or None, packages=",".join(spec.spark.packages) or None,
            execution_timeout=DELIVER_TIMEOUT, max_active_tis_per_dag=1,
            # One asset event per delivered target goes through this alias (tidegate_airflow/assets.py).
            outlets=[delivered_alias(p)])
        release = TidegateReleaseOperator(task_id="release", pipeline=p, trigger_rule="none_failed")
        # Report and release side by side after deliver: neither needs the other, and a run of
        # a @continuous DAG ends (and the next one can start) one task process sooner. So the
        # report does not wait for release's XCom; release logs where it released to.
        report = TidegateReportOperator(task_id="report", pipeline=p, trigger_rule="none_failed",
                                        release_task_id=None)
        guard >> bounds >> deliver >> [release, report]
    return dag


def build_dags(directory: str | Path | None = None) -> dict[str, Any]:
    """``{dag_id: DAG}`` for every valid spec (invalid ones are reported by
    ``dags/tidegate_spec_errors.py``). In a task's process Airflow names the DAG it runs (the
    parsing context): only that pipeline's spec is read and only its DAG is built."""
    running = _pipeline_being_run()
    if running is not None:
        from tidegate.catalog import find
        from tidegate.errors import TidegateError

        try:
            spec = find(running, directory)
        except TidegateError:
            pass  # renamed or broken since the run began: build them all, the task then says why
        else:
            return {spec.dag_id: create_dag(spec)}
    specs, _ = load_specs(directory)
    return {spec.dag_id: create_dag(spec) for spec in specs}


def _pipeline_being_run() -> str | None:
    """The pipeline whose task this process runs (None when Airflow parses the folder)."""
    from airflow.sdk import get_parsing_context

    dag_id = get_parsing_context().dag_id
    return dag_id[len("cdc_"):] if dag_id and dag_id.startswith("cdc_") else None
