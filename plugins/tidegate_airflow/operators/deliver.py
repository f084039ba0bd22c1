"""Deliver one run through spark-submit (docs/architecture.md, "One run"; docs/operations.md, "Spark")."""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseHook, Context
from airflow.sdk.exceptions import AirflowException
from tidegate.kinds import spark_settings
from tidegate.spec import DATA_DIR_ENV, data_dir

from ..assets import emit_asset_events
from ..connections import connection_env, salt_env
from ..exceptions import DeliverFatalError, UnsafeConnectionTransportError
from .base import TidegateTaskMixin
from .bounds import TidegateBoundsOperator

DEFAULT_APPLICATION = str(Path(__file__).resolve().parents[3] / "spark_jobs" / "deliver.py")


class TidegateDeliverOperator(TidegateTaskMixin, SparkSubmitOperator):
    """spark-submit ``spark_jobs/deliver.py`` for one bounded run of a pipeline.

    The job reads (lowest sink checkpoint, upper bound] in Spark, delivers sub-batch by
    sub-batch under the commit policy and commits checkpoints as it goes. Its argv holds the
    pipeline name and the run id only: the driver reads the run's record from the checkpoint
    store (the spec's text, the plan, the bounds the bounds task decided), so a driver on a
    cluster never reads the Airflow worker's disk; the ``tidegate`` package travels as a zip in
    ``--py-files`` (``ship_package``). Without a bounds task upstream, this task runs the bounds
    step itself (and writes the record) on every attempt. In client deploy mode (the driver runs in this
    task: ``local[N]``, a standalone master, YARN or Kubernetes in client mode) the connections
    the spec uses reach the driver as ``AIRFLOW_CONN_<ID>`` variables of the spark-submit
    process's own environment, built from Airflow's connections at execute time: they are in no
    rendered template field, no ``env_vars`` (which the Spark provider turns into ``--conf`` on
    YARN and Kubernetes), no argv and no log. The executors receive the source connection from
    the driver inside the job. In cluster deploy mode the driver runs elsewhere and only a
    command line could carry them: the operator refuses (``UnsafeConnectionTransportError``)
    unless ``pass_connections=False`` and the cluster gives the driver ``AIRFLOW_CONN_*`` and
    ``TIDEGATE_CHECKPOINT_STORE`` itself (docs/operations.md, "Spark").

    :param pipeline: the pipeline name.
    :param spark_conn_id: the Spark connection (None: ``spark.conn_id`` of the spec).
    :param conf: Spark settings, merged over ``spark.conf`` of the spec.
    :param packages: Maven coordinates (comma-separated); None: ``spark.packages`` of the spec.
    :param source_conn_id: override the spec's source connection.
    :param pass_connections: pass the spec's connections to the driver in spark-submit's environment
        (client deploy mode only).
    :param ship_package: add a zip of the ``tidegate`` package to ``--py-files``.
    :param application: the entry point (default: this project's ``spark_jobs/deliver.py``).
    :return: (XCom) the run report ``{"pipeline", "run_id", "sub_batches", "events", "bytes",
        "end_position", "sinks": [...]}``, or None when the driver is remote (cluster mode).
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields, "pipeline", "spark_conn_id", "source_conn_id")
    ui_color = "#fde0c5"

    def __init__(self, *, pipeline: str, spark_conn_id: str | None = None, conf: dict[str, Any] | None = None,
                 packages: str | None = None, source_conn_id: str | None = None,
                 pass_connections: bool = True, ship_package: bool = True, application: str | None = None,
                 name: str | None = None, **kwargs: Any) -> None:
        super().__init__(application=application or DEFAULT_APPLICATION,
                         conn_id=spark_conn_id or "spark_default", conf=conf, packages=packages,
                         name=name or f"tidegate-{pipeline}", **kwargs)
        self.pipeline = pipeline
        self.source_conn_id = source_conn_id
        self.spark_conn_id = spark_conn_id
        self.pass_connections = pass_connections
        self.ship_package = ship_package
        # AIRFLOW_CONN_* for the driver: only ever in the spark-submit process's environment.
        self._driver_secrets: dict[str, str] = {}
        self._driver_env: dict[str, str] = {}  # the secrets and the settings spark-submit gets
        self._client_mode = True
        self._given_env_vars: dict[str, Any] | None = None
        self._connected = False  # the run is in this task, a Spark Connect client
        self._delivered: tuple[Any, dict[str, Any] | None] | None = None  # (run, its report)

    # ------------------------------------------------------------------ the run's record

    @property
    def reads_record(self) -> bool:
        """Whether a bounds task upstream wrote the run's record (the DAG factory's shape)."""
        return any(isinstance(t, TidegateBoundsOperator) for t in self.get_flat_relatives(upstream=True))

    def recorded_run(self, run: Any) -> Any:
        """The run with its record: the bounds task's, or, in a DAG without one, the bounds step
        run here, on every attempt (a cleared run that delivered then replays its range, as a
        bounds task would make it)."""
        if self.reads_record:
            return run
        from tidegate.bounds_step import prepare_bounds  # the engine is imported when the task runs

        return prepare_bounds(run)

    # ------------------------------------------------------------------ building the submit

    def prepare(self, context: Context, report_file: str | None, run: Any = None) -> Any:
        """Fill application_args, env_vars, conf, packages, py_files and the Spark connection
        for this run, whose record the driver reads. Kept apart from running so it can be tested
        without Spark."""
        run = run or self.recorded_run(self.run_context(context))
        spec, plan = run.spec, run.plan
        self.spark_conn_id = self.spark_conn_id or spec.spark.conn_id
        self._conn_id = self.spark_conn_id
        # What the spec's sink kinds need of the session (Delta: its jars and SQL extension) first;
        # the spec's spark.conf and the operator's conf may override.
        self.conf = {**spark_settings(spec), **spec.spark.conf, **(self.conf or {})}
        if not self.packages and spec.spark.packages:
            self.packages = ",".join(spec.spark.packages)
        if self.ship_package:  # (imported here: a DAG's parse imports none of the engine's Spark code)
            from tidegate.spark.package import package_zip

            self.py_files = ",".join(p for p in (self.py_files, str(package_zip())) if p)
        self.application_args = build_args(pipeline=spec.pipeline, run_id=run.run_id, report_file=report_file)
        master, deploy_mode = self._check_transport()
        self._client_mode = deploy_mode == "client"
        self._driver_env = self._driver_environment(spec, run, master) if self._client_mode else {}
        self.log.info("pipeline %s: spark-submit %s on %s (%s deploy mode), run %s (%s), connections "
                      "passed in its environment: %s", spec.pipeline, self.application, master, deploy_mode,
                      run.run_id, plan.mode, ", ".join(sorted(self._driver_secrets)) or "none")
        return run

    def _driver_environment(self, spec: Any, run: Any, master: str) -> dict[str, str]:
        """Client deploy mode: what spark-submit's process (and so the driver) gets on top of
        this task's environment, which it inherits (TIDEGATE_CHECKPOINT_STORE and
        TIDEGATE_PIPELINES_DIR need no copy, and the store URL may hold a password). Sets
        ``_driver_secrets``. ``env_vars`` keep the provider's meaning: the driver's environment."""
        env: dict[str, str] = {}
        # In client mode the driver runs here, with this worker's interpreter (it has tidegate and
        # the clients); so do local executors. A cluster's executors use spark.pyspark.python of
        # the spec's spark.conf, which would also name the driver's unless the driver's own
        # setting (it takes precedence over any environment variable) says otherwise.
        if master.startswith("local"):
            env.update({k: sys.executable for k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
                        if not os.environ.get(k)})
        elif not os.environ.get("PYSPARK_DRIVER_PYTHON"):
            self.conf.setdefault("spark.pyspark.driver.python", sys.executable)
        # The default Delta table folder as this task sees it (the driver imports tidegate from the
        # zip, where the project folder cannot be found).
        if not os.environ.get(DATA_DIR_ENV):
            env[DATA_DIR_ENV] = data_dir()
        self._driver_secrets = {}
        if self.pass_connections:
            conn_ids = [spec.source.conn_id, *(s.conn_id for s in spec.sinks if s.conn_id)]
            self._driver_secrets = {**connection_env(conn_ids, run.parts.connection),
                                    **salt_env(spec, run.parts)}
        if self._given_env_vars is None:  # as rendered; prepare() may run again
            self._given_env_vars = dict(self.env_vars or {})
        user = self._given_env_vars
        if user and (master.startswith("yarn") or master.startswith("k8s")):
            # The provider turns env_vars into the driver's environment by --conf on YARN and
            # Kubernetes; on YARN it would also replace the whole environment submit() is given.
            prefix = ("spark.yarn.appMasterEnv." if master.startswith("yarn")
                      else "spark.kubernetes.driverEnv.")
            self.conf.update({prefix + k: str(v) for k, v in user.items()})
        env.update({k: str(v) for k, v in user.items()})
        self.env_vars = {}  # all of it travels in submit()'s environment (and conf), never twice
        return {**env, **self._driver_secrets}

    def _check_transport(self) -> tuple[str, str]:
        """The Spark master and deploy mode, as spark-submit will get them; raises when the
        connections could only reach the driver on a command line (cluster deploy mode)."""
        from airflow.sdk import BaseHook

        try:
            BaseHook.get_connection(self._conn_id)
        except AirflowException:
            raise UnsafeConnectionTransportError(
                f"Spark connection {self._conn_id!r} is not defined; define it, e.g. "
                f"AIRFLOW_CONN_{self._conn_id.upper()}='{{\"conn_type\":\"spark\",\"host\":\"local[2]\"}}'"
            ) from None
        resolved = self._get_hook()._connection
        master = str(resolved["master"])
        deploy_mode = (resolved.get("deploy_mode") or (self.conf or {}).get("spark.submit.deployMode")
                       or ("cluster" if master == "yarn-cluster" else "client"))
        if deploy_mode == "cluster" and self.pass_connections:
            raise UnsafeConnectionTransportError(
                f"Spark connection {self._conn_id!r} ({master}, cluster deploy mode): the driver runs "
                f"on the cluster, and only spark-submit's command line could carry the connections to "
                f"it, so tidegate will not pass them. Give the driver AIRFLOW_CONN_* and "
                f"TIDEGATE_CHECKPOINT_STORE through the cluster's secrets (e.g. "
                f"spark.kubernetes.driver.secretKeyRef.*) and set pass_connections=False, or use "
                f"client deploy mode.")
        return master, deploy_mode

    # ------------------------------------------------------------------ running

    def _submit(self, context: Context) -> None:
        """spark-submit with the driver's environment given to that process alone (this task's
        own stays as it was). In cluster deploy mode nothing is passed and the provider submits
        as it does (tracking a remote driver)."""
        if not self._client_mode:
            SparkSubmitOperator.execute(self, context)
            return
        self._hook = self._get_hook()
        self._hook.submit(self.application, env={**os.environ, **self._driver_env})

    def run(self, run: Any, context: Context) -> dict[str, Any] | None:
        report = self.deliver(run, context)
        if report is not None:  # what orchestrating cost this process (benchmarks/task_share.py)
            report["task_process_cpu_s"] = _cpu_seconds(resource.RUSAGE_SELF)
            report["task_children_cpu_s"] = _cpu_seconds(resource.RUSAGE_CHILDREN)
        self._delivered = (run, report)  # what the lineage of this run is read from (on complete)
        uris = emit_asset_events(context, run.pipeline, report, run.spec, run.parts.connection)
        if uris:
            self.log.info("pipeline %s: asset events for %s", run.pipeline, ", ".join(uris))
        return report

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (called by the provider's listener, only when a transport is set): the
        source tables the run delivered as inputs, the targets as outputs (tidegate_airflow/lineage.py)."""
        from ..lineage import deliver_lineage

        run, report = self._delivered or (None, None)
        return deliver_lineage(run, report)

    def deliver(self, run: Any, context: Context) -> dict[str, Any] | None:
        run = self.recorded_run(run)
        conn_id = self.spark_conn_id or run.spec.spark.conn_id
        if spark_conn_type(conn_id) == SparkConnectHook.conn_type:
            return self.deliver_connected(run, conn_id)
        fd, report_file = tempfile.mkstemp(prefix="tidegate-report-", suffix=".json")
        os.close(fd)
        try:
            run = self.prepare(context, report_file, run)
            try:
                self._submit(context)
            except AirflowException as exc:
                ended = _read_report(report_file) or {}
                if ended.get("fatal"):
                    raise DeliverFatalError(
                        f"pipeline {run.pipeline!r}: the Spark job stopped on a fatal error, not "
                        f"retried: {ended.get('error')}") from exc
                raise
            report = _read_report(report_file)
        finally:
            Path(report_file).unlink(missing_ok=True)
        if report is None or report.get("fatal"):
            self.log.warning("pipeline %s: no run report from the driver (remote driver?)",
                             run.pipeline)
        else:
            self.log.info("pipeline %s: delivered %s events (%s bytes) in %s sub-batch(es)",
                          run.pipeline, report.get("events"), report.get("bytes"),
                          report.get("sub_batches"))
        return report


    # ------------------------------------------------------------------ Spark Connect

    def deliver_connected(self, run: Any, conn_id: str) -> dict[str, Any]:
        """The run through the Spark Connect server of connection ``conn_id`` (conn type
        ``spark_connect``): no spark-submit. The run is one Spark job there whose task delivers
        (a snapshot's chunks read by tasks of their own); this task submits and waits. A spec
        with a Delta sink is delivered here, Spark tasks reading the parts
        (tidegate/spark/delivery.py). The connections travel pickled inside the job; the server
        URL may hold a token and is not logged."""
        from tidegate.spark.connect import deliver_remote
        from tidegate.spark.package import package_zip

        self._connected = True
        hook = SparkConnectHook(conn_id)
        where = BaseHook.get_connection(conn_id)
        self.log.info("pipeline %s: run %s (%s) as a Spark Connect client of %s:%s (connection %s)",
                      run.pipeline, run.run_id, run.plan.mode, where.host, where.port, conn_id)
        conf = {**run.spec.spark.conf, **(self.conf or {})}
        report = deliver_remote(hook.get_connection_url(), run, conf=conf,
                                py_files=[str(package_zip())] if self.ship_package else ())
        by = ("a Spark task on the server" if report.get("delivered_by") == "executor" else
              "this task, Spark tasks reading" if report.get("spark_session_opened") else "this task")
        self.log.info("pipeline %s: delivered %s events (%s bytes) in %s sub-batch(es) by %s; timings %s%s",
                      run.pipeline, report.get("events"), report.get("bytes"), report.get("sub_batches"), by,
                      report.get("connect_timings"),
                      f"; the Spark task: {report['delivery_task']}" if "delivery_task" in report else "")
        return report


    def on_kill(self) -> None:
        if not self._connected:
            super().on_kill()  # the spark-submit process
            return
        # A Spark Connect client: the run's Spark operations go on without this process (a run
        # delivered by a Spark task would deliver to its end), so they are interrupted.
        from tidegate.spark.session import interrupt_run

        self.log.info("deliver task killed: %d Spark operation(s) of the run interrupted", interrupt_run())


def spark_conn_type(conn_id: str) -> str:
    """The conn type of the Spark connection ``conn_id``: ``spark_connect`` makes the deliver task
    a Spark Connect client, anything else (``spark``) spark-submits."""
    try:
        return BaseHook.get_connection(conn_id).conn_type or ""
    except AirflowException:
        raise UnsafeConnectionTransportError(
            f"Spark connection {conn_id!r} is not defined; define it, e.g. "
            f"AIRFLOW_CONN_{conn_id.upper()}='{{\"conn_type\":\"spark\",\"host\":\"local[2]\"}}' "
            f"(spark-submit) or '{{\"conn_type\":\"spark_connect\",\"host\":\"sc://HOST\",\"port\":15002}}' "
            f"(a Spark Connect server)") from None


def build_args(*, pipeline: str, run_id: str, report_file: str | None = None) -> list[str]:
    """The argv of spark_jobs/deliver.py: names and ids, no secret (the driver reads the rest
    from the run's record)."""
    args = ["--pipeline", pipeline, "--run-id", run_id]
    if report_file:
        args += ["--report-file", report_file]
    return args


def _read_report(path: str) -> dict[str, Any] | None:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        return None
    return json.loads(text) if text.strip() else None


def _cpu_seconds(who: int) -> float:
    """User + system CPU seconds of this process (or of its ended children: spark-submit)."""
    r = resource.getrusage(who)
    return round(r.ru_utime + r.ru_stime, 3)
