"""Deliver one run through spark-submit (docs/architecture.md, "One run"; docs/operations.md, "Spark")."""

from __future__ import annotations

import base64
import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowException

from ..connections import connection_env
from ..exceptions import DeliverFatalError, UnsafeConnectionTransportError
from ..package import package_zip
from .base import TaskRun, TidegateTaskMixin

DEFAULT_APPLICATION = str(Path(__file__).resolve().parents[3] / "spark_jobs" / "deliver.py")
PASSED_ENV = ("TIDEGATE_PIPELINES_DIR", "TIDEGATE_CHECKPOINT_STORE")


class TidegateDeliverOperator(TidegateTaskMixin, SparkSubmitOperator):
    """spark-submit ``spark_jobs/deliver.py`` for one bounded run of a pipeline.

    The job reads (lowest sink checkpoint, upper bound] in Spark, delivers sub-batch by
    sub-batch under the commit policy and commits checkpoints as it goes. What it needs travels
    with it: the spec's content (``--spec-b64``; a driver on a cluster never reads the Airflow
    worker's disk) and the ``tidegate`` package as a zip in ``--py-files`` (``ship_package``).
    Its argv holds positions, names and ids only; the connections the spec uses reach the driver
    as ``AIRFLOW_CONN_<ID>`` environment variables built from Airflow's connections, added at
    execute time (so they are in no rendered template field, no argv and no log), and the
    executors receive the source connection from the driver inside the job. On YARN,
    Kubernetes or in cluster deploy mode spark-submit would put environment variables on its
    command line: the operator refuses (``UnsafeConnectionTransportError``) unless
    ``pass_connections=False`` and the cluster gives the driver the connections itself.

    :param pipeline: the pipeline name.
    :param mode, sinks, max_events, replay_of: override the run's params (None: from the params /
        ``dag_run.conf``, validated as by the guard).
    :param upto: the run's upper bound (position JSON). None: taken from the XCom of
        ``bounds_task_id``; with neither, the job captures the head itself.
    :param bounds_task_id: the bounds task whose XCom holds ``upto``.
    :param spark_conn_id: the Spark connection (None: ``spark.conn_id`` of the spec).
    :param conf: Spark settings, merged over ``spark.conf`` of the spec.
    :param packages: Maven coordinates (comma-separated); None: ``spark.packages`` of the spec.
    :param source_conn_id: override the spec's source connection.
    :param pass_connections: pass the spec's connections to the driver as environment variables.
    :param ship_package: add a zip of the ``tidegate`` package to ``--py-files``.
    :param application: the entry point (default: this project's ``spark_jobs/deliver.py``).
    :return: (XCom) the run report ``{"pipeline", "run_id", "sub_batches", "events", "bytes",
        "end_position", "sinks": [...]}``, or None when the driver is remote (cluster mode).
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields, "pipeline", "mode", "sinks", "max_events", "replay_of",
        "upto", "spark_conn_id", "source_conn_id")
    ui_color = "#fde0c5"

    def __init__(self, *, pipeline: str, mode: str | None = None, sinks: list[str] | str | None = None,
                 max_events: int | str | None = None, replay_of: str | None = None,
                 upto: dict[str, Any] | str | None = None, bounds_task_id: str | None = "bounds",
                 spark_conn_id: str | None = None, conf: dict[str, Any] | None = None,
                 packages: str | None = None, source_conn_id: str | None = None,
                 pass_connections: bool = True, ship_package: bool = True, application: str | None = None,
                 name: str | None = None, **kwargs: Any) -> None:
        super().__init__(application=application or DEFAULT_APPLICATION,
                         conn_id=spark_conn_id or "spark_default", conf=conf, packages=packages,
                         name=name or f"tidegate-{pipeline}", **kwargs)
        self.pipeline = pipeline
        self.source_conn_id = source_conn_id
        self.mode, self.sinks, self.max_events, self.replay_of = mode, sinks, max_events, replay_of
        self.upto = upto
        self.bounds_task_id = bounds_task_id
        self.spark_conn_id = spark_conn_id
        self.pass_connections = pass_connections
        self.ship_package = ship_package

    def plan_overrides(self) -> Mapping[str, Any]:
        return {"mode": self.mode, "sinks": self.sinks, "max_events": self.max_events,
                "replay_of": self.replay_of}

    # ------------------------------------------------------------------ building the submit

    def prepare(self, context: Context, report_file: str | None, task: TaskRun | None = None) -> TaskRun:
        """Fill application_args, env_vars, conf, packages, py_files and the Spark connection
        for this run. Kept apart from running so it can be tested without Spark."""
        task = task or self.task_run(context)
        spec, plan = task.spec, task.plan
        self.spark_conn_id = self.spark_conn_id or spec.spark.conn_id
        self._conn_id = self.spark_conn_id
        self.conf = {**spec.spark.conf, **(self.conf or {})}
        if not self.packages and spec.spark.packages:
            self.packages = ",".join(spec.spark.packages)
        if self.ship_package:
            self.py_files = ",".join(p for p in (self.py_files, str(package_zip())) if p)
        self.application_args = build_args(spec=spec, run_id=task.run_id, plan=plan, upto=self._upto(context),
                                           report_file=report_file)
        env = dict(self.env_vars or {})
        env.update({k: os.environ[k] for k in PASSED_ENV if os.environ.get(k) and k not in env})
        master = self._check_transport()
        if master.startswith("local"):
            # The driver and local executors run the same interpreter as this worker (with tidegate).
            for k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
                if not os.environ.get(k) and k not in env:
                    env[k] = sys.executable
        if self.pass_connections:
            conn_ids = [spec.source.conn_id, *(s.conn_id for s in spec.sinks)]
            env.update(connection_env(conn_ids, task.resolve))
        self.env_vars = env
        self.log.info("pipeline %s: spark-submit %s on %s, run %s (%s), connections passed: %s",
                      spec.pipeline, self.application, master, task.run_id, plan.mode,
                      ", ".join(sorted(k for k in env if k.startswith("AIRFLOW_CONN_"))) or "none")
        return task

    def _upto(self, context: Context) -> dict[str, Any] | None:
        upto = self.upto
        if upto is None and self.bounds_task_id:
            bounds = context["ti"].xcom_pull(task_ids=self.bounds_task_id)
            upto = (bounds or {}).get("upto") if isinstance(bounds, dict) else None
        if isinstance(upto, str):
            upto = json.loads(upto) if upto.strip() else None
        return upto

    def _check_transport(self) -> str:
        """The Spark master; raises when connections would travel on a command line."""
        from airflow.sdk import BaseHook

        try:
            c = BaseHook.get_connection(self._conn_id)
        except AirflowException:
            raise UnsafeConnectionTransportError(
                f"Spark connection {self._conn_id!r} is not defined; define it, e.g. "
                f"AIRFLOW_CONN_{self._conn_id.upper()}='{{\"conn_type\":\"spark\",\"host\":\"local[2]\"}}'"
            ) from None
        master = f"{c.host}:{c.port}" if c.port else str(c.host or "yarn")
        deploy_mode = (c.extra_dejson or {}).get("deploy-mode") or ""
        unsafe = master.startswith(("yarn", "k8s://")) or deploy_mode == "cluster"
        if unsafe and self.pass_connections:
            raise UnsafeConnectionTransportError(
                f"Spark connection {self._conn_id!r} ({master}, deploy-mode {deploy_mode or 'client'}): "
                f"spark-submit would put the environment on its command line, so tidegate will not "
                f"pass connection secrets this way. Give the driver AIRFLOW_CONN_* through the "
                f"cluster's secrets (e.g. spark.kubernetes.driver.secretKeyRef.*) and set "
                f"pass_connections=False.")
        return master

    # ------------------------------------------------------------------ running

    def run(self, task: TaskRun, context: Context) -> dict[str, Any] | None:
        fd, report_file = tempfile.mkstemp(prefix="tidegate-report-", suffix=".json")
        os.close(fd)
        try:
            self.prepare(context, report_file, task)
            try:
                SparkSubmitOperator.execute(self, context)
            except AirflowException as exc:
                from tidegate.plan import EXIT_FATAL

                code = getattr(getattr(self._hook, "_submit_sp", None), "returncode", None)
                if code == EXIT_FATAL:
                    raise DeliverFatalError(
                        f"pipeline {task.spec.pipeline!r}: the Spark job stopped on a fatal error (exit "
                        f"{EXIT_FATAL}); see the driver log above. Not retried.") from exc
                raise
            report = _read_report(report_file)
        finally:
            Path(report_file).unlink(missing_ok=True)
        if report is None:
            self.log.warning("pipeline %s: no run report from the driver (remote driver?)",
                             task.spec.pipeline)
        else:
            self.log.info("pipeline %s: delivered %s events (%s bytes) in %s sub-batch(es)",
                          task.spec.pipeline, report.get("events"), report.get("bytes"),
                          report.get("sub_batches"))
        return report


def build_args(*, spec: Any, run_id: str, plan: Any, upto: dict[str, Any] | None = None,
               report_file: str | None = None) -> list[str]:
    """The argv of spark_jobs/deliver.py (no secrets: the spec, positions, names and ids)."""
    args = ["--pipeline", spec.pipeline, "--run-id", run_id, "--mode", plan.mode,
            "--spec-b64", base64.b64encode(spec.text.encode("utf-8")).decode("ascii")]
    if upto:
        args += ["--upto-json", json.dumps(upto, sort_keys=True, separators=(",", ":"))]
    if plan.sinks:
        args += ["--sinks", ",".join(plan.sinks)]
    if plan.max_events:
        args += ["--max-events", str(int(plan.max_events))]
    if plan.replay_of:
        args += ["--replay-of", plan.replay_of]
    if report_file:
        args += ["--report-file", report_file]
    return args


def _read_report(path: str) -> dict[str, Any] | None:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        return None
    return json.loads(text) if text.strip() else None
