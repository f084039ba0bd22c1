"""The operators' own logic on the engine's real guards, bounds and release, with a scripted source
(the task's ``parts``) and a SQLite store: no servers, no Spark, no engine function replaced."""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, DownstreamTasksSkipped

from tests.dags.conftest import make_context
from tests.dags.engine_fakes import MYSQL_OLD, MYSQL_UPTO, ScriptedSource, wire


def store_of():
    from tidegate.store import open_store

    return open_store()  # TIDEGATE_CHECKPOINT_STORE of the pipelines_dir fixture


def place(pipeline: str, positions: dict) -> None:
    """Checkpoints for the pipeline's sinks, as a run that delivered would leave them."""
    from tidegate.positions import position_from_json

    store = store_of()
    try:
        epoch = store.leases.acquire(pipeline, "r0")
        store.checkpoints.write_many(pipeline, {k: position_from_json(v) for k, v in positions.items()},
                                     run_id="r0", epoch=epoch)
    finally:
        store.close()


def purge_incident(pipeline: str, kind: str = "binlog_purged") -> int:
    from tidegate.positions import position_from_json

    store = store_of()
    try:
        return store.incidents.record(pipeline, kind, position_from_json(MYSQL_OLD),
                                      position_from_json(MYSQL_UPTO), detail=f"{kind} by hand").id
    finally:
        store.close()


def write_record(dag, bounds, *, conf: dict | None = None, run_id: str = "manual__2026-01-01") -> None:
    """The run's record, as the DAG's bounds task leaves it for deliver, release and report: the
    spec, the plan of the run's params and ``bounds``."""
    from tidegate import catalog
    from tidegate.bounds_step import recorded
    from tidegate.run import RunContext
    from tidegate_airflow.params import plan_for_run

    spec = catalog.find(bounds.pipeline)
    plan = plan_for_run(make_context(dag, conf=conf, run_id=run_id), sink_ids=[s.id for s in spec.sinks])
    store = store_of()
    try:
        recorded(RunContext(spec, plan, run_id), bounds, store)
    finally:
        store.close()


# --------------------------------------------------------------------------- run params


def test_plan_reason_required_with_resolve(dags):
    from tidegate_airflow.exceptions import InvalidRunParamsError
    from tidegate_airflow.params import plan_for_run

    dag = dags["cdc_shop_mysql"]
    with pytest.raises(InvalidRunParamsError) as e:
        plan_for_run(make_context(dag, conf={"resolve": "accept_gap", "reason": "  "}), sink_ids=["events"])
    assert isinstance(e.value, AirflowFailException)
    assert "reason is required when resolve is set" in str(e.value)

    plan = plan_for_run(make_context(dag, conf={"resolve": "accept_gap", "reason": "restored from backup"}),
                        sink_ids=["events", "bus", "cache"])
    assert (plan.resolve, plan.reason, plan.who, plan.mode, plan.sinks) == (
        "accept_gap", "restored from backup", "alice", "incremental", None)


@pytest.mark.parametrize(("conf", "needle"), [
    ({"mode": "replay"}, "mode=replay needs replay_of"),
    ({"replay_of": "scheduled__x"}, "needs mode=replay"),
    ({"sinks": ["events", "nope"]}, "unknown sink(s) nope"),
    ({"sinks": []}, "sinks is empty"),
    ({"max_events": "lots"}, "max_events must be a positive integer"),
    ({"mode": "snapshot"}, "mode 'snapshot' is not one of"),
])
def test_plan_rejects_inconsistent_params(dags, conf, needle):
    from tidegate_airflow.exceptions import InvalidRunParamsError
    from tidegate_airflow.params import plan_for_run

    with pytest.raises(InvalidRunParamsError, match=None) as e:
        plan_for_run(make_context(dags["cdc_shop_mysql"], conf=conf), sink_ids=["events", "bus", "cache"])
    assert needle in str(e.value)


def test_plan_subset_replay_and_backfill(dags):
    from tidegate_airflow.params import plan_for_run

    dag, ids = dags["cdc_shop_mysql"], ["events", "bus", "cache"]
    plan = plan_for_run(make_context(dag, conf={"sinks": ["cache"], "max_events": 100}), sink_ids=ids)
    assert plan.sinks == ["cache"] and plan.max_events == 100
    plan = plan_for_run(make_context(dag, conf={"mode": "replay", "replay_of": "scheduled__2026-01-01"}),
                        sink_ids=ids)
    assert (plan.mode, plan.replay_of) == ("replay", "scheduled__2026-01-01")
    # A backfill replays the range of the scheduled run for the same date.
    plan = plan_for_run(make_context(dag, run_id="backfill__2026-01-02T00:00:00+00:00", run_type="backfill"),
                        sink_ids=ids)
    assert (plan.mode, plan.replay_of) == ("replay", "scheduled__2026-01-02T00:00:00+00:00")


# --------------------------------------------------------------------------- guards


def test_guard_runs_checks_in_order_and_returns_warnings(dags, caplog):
    guard = dags["cdc_shop_mysql"].get_task("guard")
    source = wire(ScriptedSource(preflight=["binlog retention: 5.0 h left"]), guard)
    assert guard.execute(make_context(dags["cdc_shop_mysql"], guard)) is None  # no XCom nobody reads
    assert source.calls == ["identity", "retention", "preflight"]
    assert "binlog retention: 5.0 h left" in caplog.text
    pg = dags["cdc_shop_postgres"].get_task("guard")
    source = wire(ScriptedSource(kind="postgres"), pg)
    pg.execute(make_context(dags["cdc_shop_postgres"], pg))
    assert source.calls == ["identity", "retention", "preflight"]  # one order


def test_continuity_halt_fails_without_retry_and_names_the_range(dags):
    from tidegate.errors import PositionPurgedError
    from tidegate.positions import position_from_json
    from tidegate_airflow.exceptions import ContinuityHaltError

    place("shop_mysql", {"events": MYSQL_OLD, "bus": MYSQL_OLD, "cache": MYSQL_OLD})
    guard = dags["cdc_shop_mysql"].get_task("guard")
    lost = PositionPurgedError("binlog mysql-bin.000003 was purged",
                               earliest_available=position_from_json(MYSQL_UPTO))
    source = wire(ScriptedSource(retention=lost), guard)
    with pytest.raises(ContinuityHaltError) as e:
        guard.execute(make_context(dags["cdc_shop_mysql"], guard))
    assert isinstance(e.value, AirflowFailException)  # Airflow does not retry it
    msg = str(e.value)
    assert "incident #1 (binlog_purged)" in msg
    assert "from mysql-bin.000004:400" in msg and "to mysql-bin.000004:900" in msg
    assert "resolve=accept_gap" in msg  # the engine's message says how to resume
    assert e.value.incident.id == 1 and e.value.incident.kind == "binlog_purged"
    assert source.calls == ["identity", "retention"]  # stops at the first halt


def test_halted_pipeline_stops_at_the_first_check(dags):
    from tidegate_airflow.exceptions import ContinuityHaltError

    n = purge_incident("shop_postgres", "slot_dropped")
    guard = dags["cdc_shop_postgres"].get_task("guard")
    source = wire(ScriptedSource(kind="postgres"), guard)
    with pytest.raises(ContinuityHaltError, match=rf"incident #{n} \(slot_dropped\)"):
        guard.execute(make_context(dags["cdc_shop_postgres"], guard))
    assert source.calls == []


def test_guard_resolves_first_when_resolve_and_reason_are_given(dags):
    place("shop_mysql", {"events": MYSQL_OLD, "bus": MYSQL_OLD, "cache": MYSQL_OLD})
    n = purge_incident("shop_mysql")
    guard = dags["cdc_shop_mysql"].get_task("guard")
    source = wire(ScriptedSource(), guard)
    conf = {"resolve": "accept_gap", "reason": "binlog lost in restore; tables re-loaded"}
    guard.execute(make_context(dags["cdc_shop_mysql"], guard, conf=conf, user="bob", run_id="manual__resume"))
    store = store_of()
    try:
        inc = store.incidents.get(n)
        assert (inc.resolved, inc.resolution, inc.reason) == (True, "accept_gap", conf["reason"])
        assert inc.resolved_by == "bob"
        moved = store.checkpoints.current("shop_mysql")
        assert {r.kind for r in moved.values()} == {"accept_gap"}
        assert {r.position.pos for r in moved.values()} == {900}  # past the missing range
    finally:
        store.close()
    assert source.calls == ["identity", "retention", "preflight"]  # then every check


def test_guard_passes_a_resnapshot_with_its_tables(dags):
    """The tables param reaches the engine's resnapshot: one the pipeline does not capture is
    refused there, by name, and nothing is planned."""
    guard = dags["cdc_shop_mysql"].get_task("guard")
    source = wire(ScriptedSource(), guard)
    conf = {"resolve": "resnapshot", "reason": "search index rebuilt", "tables": ["shop.nope"]}
    with pytest.raises(AirflowFailException, match="does not capture shop.nope"):
        guard.execute(make_context(dags["cdc_shop_mysql"], guard, conf=conf, user="ann", run_id="manual__re"))
    store = store_of()
    try:
        assert store.snapshots.all("shop_mysql") == []
    finally:
        store.close()
    assert source.calls == []


def test_guard_refuses_resolve_without_reason(dags):
    from tidegate_airflow.exceptions import InvalidRunParamsError

    guard = dags["cdc_shop_mysql"].get_task("guard")
    source = wire(ScriptedSource(), guard)
    with pytest.raises(InvalidRunParamsError, match="reason is required"):
        guard.execute(make_context(dags["cdc_shop_mysql"], guard, conf={"resolve": "accept_gap"}))
    assert source.calls == []


def test_preflight_setting_error_fails_and_other_errors_are_retried(pipelines_dir):
    from tidegate.errors import SourceError
    from tidegate.sources.preflight import Problem
    from tidegate_airflow.exceptions import PreflightError
    from tidegate_airflow.operators import PreflightOperator

    op = PreflightOperator(task_id="pf", pipeline="shop_mysql")
    assert op.checks == ("preflight",)
    wire(ScriptedSource(preflight=[Problem("setting", "binlog_row_image",
                                           "binlog_row_image is MINIMAL; set binlog_row_image=FULL")]), op)
    with pytest.raises(PreflightError, match="binlog_row_image=FULL"):
        op.execute(make_context())
    wire(ScriptedSource(preflight=SourceError("cannot connect to 127.0.0.1:3306")), op)
    with pytest.raises(SourceError) as e:
        op.execute(make_context())
    assert not isinstance(e.value, AirflowFailException)  # retried by Airflow


def test_single_guard_operators(pipelines_dir):
    from tidegate_airflow.operators import BinlogPurgeGuardOperator, FailoverGuardOperator, SlotGuardOperator

    for cls, expected in ((FailoverGuardOperator, ["identity"]),
                          (SlotGuardOperator, ["retention"]),
                          (BinlogPurgeGuardOperator, ["retention"])):
        op = cls(task_id="g", pipeline="shop_postgres")
        source = wire(ScriptedSource(kind="postgres"), op)
        op.execute(make_context())
        assert source.calls == expected
    with pytest.raises(ValueError, match="unknown guard check"):
        FailoverGuardOperator(task_id="g2", pipeline="x", checks=("failover", "vibes"))


# --------------------------------------------------------------------------- bounds


def _bounds(cache=MYSQL_OLD):
    from tidegate.bounds_step import Bounds
    from tidegate.positions import position_from_json

    return Bounds("shop_mysql", position_from_json(MYSQL_UPTO), {
        "events": position_from_json(MYSQL_UPTO), "bus": position_from_json(MYSQL_UPTO),
        "cache": position_from_json(cache)})


def _pg_bounds(upto=None):
    from tidegate.bounds_step import Bounds
    from tidegate.positions import position_from_json

    upto = upto or {"lsn": "0/3000", "system_id": "1", "timeline": 1}
    return Bounds("shop_postgres", position_from_json({"kind": "postgres", **upto}), {})


def test_nothing_to_do_short_circuits_deliver_only(dags):
    place("shop_mysql", {"events": MYSQL_UPTO, "bus": MYSQL_UPTO, "cache": MYSQL_UPTO})
    dag = dags["cdc_shop_mysql"]
    bounds = dag.get_task("bounds")
    wire(ScriptedSource(), bounds)
    ctx = make_context(dag, bounds)
    with pytest.raises(DownstreamTasksSkipped) as e:
        bounds.execute(ctx)
    assert [getattr(t, "task_id", t) for t in e.value.tasks] == ["deliver"]  # release/report still run
    assert ctx["ti"].pushed["return_value"]["nothing_to_do"] is True  # XCom pushed before skipping


def test_work_to_do_does_not_short_circuit(dags):
    place("shop_mysql", {"events": MYSQL_UPTO, "bus": MYSQL_UPTO, "cache": MYSQL_OLD})
    dag = dags["cdc_shop_mysql"]
    bounds = dag.get_task("bounds")
    wire(ScriptedSource(), bounds)
    assert bounds.execute(make_context(dag, bounds))["upto"] == MYSQL_UPTO
    # Only the chosen sinks count: events is caught up, cache is not.
    with pytest.raises(DownstreamTasksSkipped):
        bounds.execute(make_context(dag, bounds, conf={"sinks": ["events"]}))


def test_replay_bounds_come_from_the_journal_and_skip_spark_when_it_delivered_nothing(dags):
    """A replay is judged by what the replayed run delivered (the journal), not by the head; a
    backfill over an interval whose scheduled run had nothing to do succeeds without Spark."""
    from tidegate.positions import position_from_json

    place("shop_mysql", {"events": MYSQL_UPTO, "bus": MYSQL_UPTO, "cache": MYSQL_UPTO})
    store = store_of()
    try:
        jid = store.runs.begin("shop_mysql", "scheduled__x")
        store.runs.sink(jid, "cache", start=position_from_json(MYSQL_OLD),
                        end=position_from_json(MYSQL_UPTO), events=3, bytes=300, status="ok")
        store.runs.finish(jid, "success")
    finally:
        store.close()
    dag = dags["cdc_shop_mysql"]
    bounds = dag.get_task("bounds")
    wire(ScriptedSource(idle=True), bounds)  # the head says nothing new: a replay does not ask it
    out = bounds.execute(make_context(dag, bounds, conf={"mode": "replay", "replay_of": "scheduled__x"}))
    assert (out["nothing_to_do"], out["replay_of"], list(out["ranges"])) == (False, "scheduled__x", ["cache"])
    ctx = make_context(dag, bounds, run_id="scheduled__idle", run_type="backfill")
    with pytest.raises(DownstreamTasksSkipped) as e:
        bounds.execute(ctx)
    assert [getattr(t, "task_id", t) for t in e.value.tasks] == ["deliver"]
    assert ctx["ti"].pushed["return_value"]["nothing_to_do"] is True


# --------------------------------------------------------------------------- deliver

SECRETS = ("s3cr3t-mysql-pw", "r3dis-pw-xyz", "k4fka-pw-abc")


@pytest.fixture()
def connections(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_CDC_MYSQL", f"mysql://cdc:{SECRETS[0]}@127.0.0.1:3306/shop")
    monkeypatch.setenv("AIRFLOW_CONN_CDC_REDIS", json.dumps(
        {"conn_type": "redis", "host": "127.0.0.1", "port": 6379, "password": SECRETS[1]}))
    monkeypatch.setenv("AIRFLOW_CONN_CDC_KAFKA", json.dumps(
        {"conn_type": "kafka", "password": SECRETS[2], "extra": {"bootstrap.servers": "127.0.0.1:9092"}}))
    monkeypatch.setenv("AIRFLOW_CONN_CDC_NATS", "nats://127.0.0.1:4222")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "local[2]"}')


def test_deliver_argv_has_no_secret_and_env_has_the_connections(spark_submit_specs, dags, connections,
                                                                pipelines_dir,
                                                                monkeypatch):
    """The argv names the run; the driver reads the rest from the run's record, which the bounds
    task wrote."""
    from tidegate.bounds_step import read_record

    dag = dags["cdc_shop_mysql"]
    deliver = dag.get_task("deliver")
    run_id = "scheduled__2026-01-01T00:01:00+00:00"
    conf = {"sinks": ["events", "cache"], "max_events": 500}
    write_record(dag, _bounds(), conf=conf, run_id=run_id)
    ctx = make_context(dag, deliver, conf=conf, run_id=run_id)
    monkeypatch.delenv("TIDEGATE_DATA_DIR", raising=False)
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):  # a Spark test in this process may have set them
        monkeypatch.delenv(name, raising=False)
    deliver.prepare(ctx, "/tmp/report.json")
    assert deliver.application_args == ["--pipeline", "shop_mysql", "--run-id", run_id,
                                        "--report-file", "/tmp/report.json"]
    with store_of() as store:
        record = read_record(store, "shop_mysql", run_id)
    assert record.spec_text == (pipelines_dir / "shop_mysql.yaml").read_text()  # the spec travels
    assert (record.plan.mode, record.plan.sinks, record.plan.max_events, record.bounds) == (
        "incremental", ["events", "cache"], 500, _bounds())
    assert deliver.py_files.endswith(".zip")  # the tidegate package travels too
    # The real spark-submit command line, as the provider's hook builds it.
    hook = deliver._get_hook()
    cmd = hook._build_spark_submit_command(deliver.application)
    assert cmd[cmd.index("--master") + 1] == "local[2]"
    assert cmd[cmd.index("--name") + 1] == "tidegate-shop_mysql"
    line = " ".join(cmd)
    assert not any(s in line for s in SECRETS), line
    assert "AIRFLOW_CONN" not in line
    assert not any(k.startswith("AIRFLOW_CONN_") for k in hook._env or {})
    env = deliver._driver_secrets  # spark-submit's own environment (see the next test)
    assert set(env) == {"AIRFLOW_CONN_CDC_MYSQL", "AIRFLOW_CONN_CDC_KAFKA", "AIRFLOW_CONN_CDC_NATS",
                        "AIRFLOW_CONN_CDC_REDIS"}
    from tidegate.connections import get_connection

    mysql = get_connection("cdc_mysql", env)  # what the engine in the driver reads
    assert (mysql.host, mysql.port, mysql.login, mysql.password, mysql.schema) == (
        "127.0.0.1", 3306, "cdc", SECRETS[0], "shop")
    assert get_connection("cdc_kafka", env).extra["bootstrap.servers"] == "127.0.0.1:9092"
    assert deliver._driver_env["PYSPARK_PYTHON"]  # local master: the driver uses this interpreter
    # The default Delta folder as this task sees it: the driver, importing tidegate from the zip,
    # could not find the project folder.
    from tidegate.spec import repo_dir

    assert deliver._driver_env["TIDEGATE_DATA_DIR"] == str(repo_dir() / ".state" / "data")


def test_a_deliver_task_without_a_bounds_task_runs_the_bounds_step_on_every_attempt(
        spark_submit_specs, dags, connections):
    """A DAG of one deliver task: the task runs the bounds step itself before it submits (a record
    always holds bounds), again on every attempt; the DAG factory's deliver task reads the record
    its bounds task wrote instead."""
    from airflow.sdk import DAG
    from tidegate.bounds_step import read_record
    from tidegate.positions import position_to_json
    from tidegate_airflow.operators.deliver import TidegateDeliverOperator

    assert dags["cdc_shop_mysql"].get_task("deliver").reads_record
    with DAG("deliver_only", schedule=None) as dag:
        deliver = TidegateDeliverOperator(task_id="deliver", pipeline="shop_mysql")
    assert not deliver.reads_record
    source = wire(ScriptedSource(), deliver)
    seen = []
    for checkpoint in (MYSQL_UPTO, MYSQL_OLD):  # the sinks move between the attempts
        place("shop_mysql", {"events": checkpoint, "bus": checkpoint, "cache": checkpoint})
        deliver.prepare(make_context(dag, deliver, run_id="manual__alone"), None)
        with store_of() as store:
            record = read_record(store, "shop_mysql", "manual__alone")
        assert record.bounds.upto == source.head() and record.plan.mode == "incremental"
        seen.append(record.bounds.checkpoints["cache"])
    assert [position_to_json(p) for p in seen] == [MYSQL_UPTO, MYSQL_OLD]  # decided afresh each time


def test_deliver_takes_spark_settings_from_the_spec(spark_submit_specs, pipelines_dir, connections,
                                                    monkeypatch):
    from tidegate_airflow.factory import build_dags

    spec = pipelines_dir / "shop_postgres.yaml"
    spec.write_text(spec.read_text() + "spark:\n  conn_id: my_spark\n  conf: {spark.driver.memory: 2g}\n"
                    "  packages: [org.example:lib:1.0]\n")
    monkeypatch.setenv("AIRFLOW_CONN_MY_SPARK", '{"conn_type": "spark", "host": "local[1]"}')
    monkeypatch.setenv("AIRFLOW_CONN_CDC_POSTGRES", "postgres://cdc:pw-pg-123@127.0.0.1:5432/shop")
    dag = build_dags()["cdc_shop_postgres"]
    deliver = dag.get_task("deliver")
    write_record(dag, _pg_bounds())
    deliver.prepare(make_context(dag, deliver), None)
    assert deliver._conn_id == "my_spark" and deliver.conf == {"spark.driver.memory": "2g"}
    assert deliver.packages == "org.example:lib:1.0"
    cmd = " ".join(deliver._get_hook()._build_spark_submit_command(deliver.application))
    assert "--master local[1]" in cmd and "--packages org.example:lib:1.0" in cmd
    assert "spark.driver.memory=2g" in cmd and "pw-pg-123" not in cmd


@pytest.mark.parametrize("master", ["yarn", "spark://127.0.0.1:7077"])
def test_client_mode_passes_connections_in_spark_submits_environment_only(spark_submit_specs, dags,
                                                                          connections, monkeypatch, master):
    """Whatever the master, in client mode the secrets reach spark-submit's environment and never
    its command line (the provider turns env_vars into --conf on YARN and Kubernetes; a Kubernetes
    master needs the kubernetes client, not installed here, to build the hook)."""
    import airflow.providers.apache.spark.hooks.spark_submit as hook_module

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": master}))
    seen = {}

    class Popen:
        def __init__(self, cmd, **kw):
            seen["cmd"], seen["env"] = list(cmd), dict(kw.get("env") or os.environ)
            self.stdout, self.returncode = iter(()), 0

        def wait(self):
            return 0

    monkeypatch.setattr(hook_module.subprocess, "Popen", Popen)
    dag = dags["cdc_shop_mysql"]
    deliver = dag.get_task("deliver")
    write_record(dag, _bounds())
    assert deliver.execute(make_context(dag, deliver)) is None
    line = " ".join(seen["cmd"])
    assert not any(s in line for s in SECRETS) and "AIRFLOW_CONN" not in line, line
    from tidegate.connections import get_connection

    assert get_connection("cdc_mysql", seen["env"]).password == SECRETS[0]
    assert seen["env"]["AIRFLOW_CONN_CDC_MYSQL"].startswith("{")  # built from Airflow's connection
    assert os.environ["AIRFLOW_CONN_CDC_MYSQL"].startswith("mysql://")  # this process: as it was
    # The driver runs here with this interpreter, even when the spec names the executors' one.
    assert f"spark.pyspark.driver.python={sys.executable}" in line


def test_deliver_refuses_to_put_secrets_on_a_cluster_mode_command_line(spark_submit_specs, dags, connections,
                                                                        monkeypatch):
    from tidegate_airflow.exceptions import UnsafeConnectionTransportError

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(
        {"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster"}}))
    dag = dags["cdc_shop_mysql"]
    deliver = dag.get_task("deliver")
    write_record(dag, _bounds())
    with pytest.raises(UnsafeConnectionTransportError, match="pass_connections=False"):
        deliver.prepare(make_context(dag, deliver), None)
    deliver.pass_connections = False
    deliver.prepare(make_context(dag, deliver), None)
    assert deliver._driver_secrets == {}
    assert not any(k.startswith(("AIRFLOW_CONN_", "TIDEGATE_")) for k in deliver.env_vars or {})


def test_deliver_returns_the_report_and_maps_fatal_exit(spark_submit_specs, dags, connections, monkeypatch):
    """spark-submit (a stand-in process object) ends three ways: done with a report; fatal (exit
    3 and a fatal report: not retried); failed (retried). This process's environment is never
    changed on the way."""
    import airflow.providers.apache.spark.hooks.spark_submit as hook_module
    from tidegate_airflow.exceptions import DeliverFatalError

    report = {"pipeline": "shop_mysql", "events": 3, "bytes": 300, "sub_batches": 1, "sinks": []}
    environ = dict(os.environ)

    def spark_submit(returncode: int, written: dict | None):
        class Popen:
            def __init__(self, cmd, **kw):
                assert "AIRFLOW_CONN_CDC_MYSQL" in kw["env"] and os.environ == environ
                if written is not None:
                    with open(cmd[cmd.index("--report-file") + 1], "w") as f:
                        json.dump(written, f)
                self.stdout, self.returncode = iter(()), returncode

            def wait(self):
                return self.returncode

        monkeypatch.setattr(hook_module.subprocess, "Popen", Popen)

    dag = dags["cdc_shop_mysql"]
    deliver = dag.get_task("deliver")
    write_record(dag, _bounds())
    spark_submit(0, report)
    returned = deliver.execute(make_context(dag, deliver))
    # the driver's report, and what this task process cost (its own CPU, its children's)
    assert returned == {**report, "task_process_cpu_s": returned["task_process_cpu_s"],
                        "task_children_cpu_s": returned["task_children_cpu_s"]}
    assert returned["task_process_cpu_s"] > 0

    spark_submit(3, {"fatal": True, "error": "FencedError: a newer run holds the lease"})
    with pytest.raises(DeliverFatalError, match="FencedError: a newer run holds the lease"):
        deliver.execute(make_context(dag, deliver))

    spark_submit(1, None)
    with pytest.raises(AirflowException) as e:
        deliver.execute(make_context(dag, deliver))
    assert not isinstance(e.value, AirflowFailException)
    assert os.environ == environ


# --------------------------------------------------------------------------- release and report


def test_release_only_in_incremental_mode(dags):
    place("shop_mysql", {"events": MYSQL_UPTO, "bus": MYSQL_UPTO, "cache": MYSQL_OLD})
    dag = dags["cdc_shop_mysql"]
    release = dag.get_task("release")
    source = wire(ScriptedSource(), release)
    write_record(dag, _bounds())
    assert release.execute(make_context(dag, release))["released_to"] == MYSQL_OLD  # the lowest
    write_record(dag, _bounds(), conf={"mode": "dry_run"}, run_id="manual__dry")
    assert release.execute(make_context(dag, release, conf={"mode": "dry_run"},
                                        run_id="manual__dry"))["released_to"] is None
    assert source.calls == ["release"]


class FakeStats:
    def __init__(self):
        self.sent = []

    def incr(self, name, count=1, rate=None, *, tags=None):
        self.sent.append(("incr", name, count))

    def gauge(self, name, value, rate=None, delta=None, *, tags=None):
        self.sent.append(("gauge", name, value))


def test_report_per_sink_numbers_and_metrics(dags, monkeypatch):
    from tidegate_airflow.operators import report as report_mod

    upto = {"lsn": "0/3000", "system_id": "1", "timeline": 1}
    run = {"pipeline": "shop_postgres", "events": 10, "bytes": 2000, "sub_batches": 2, "sinks": [
        {"id": "events", "kind": "kafka", "events": 10, "bytes": 2000, "status": "ok", "end": upto},
        {"id": "cache", "kind": "redis", "events": 4, "bytes": 800, "status": "failed",
         "end": {"lsn": "0/2000", "system_id": "1", "timeline": 1}, "error": "connection refused"}]}
    stats = FakeStats()
    real_emit = report_mod.emit_metrics
    monkeypatch.setattr(report_mod, "emit_metrics", lambda summary: real_emit(summary, stats))
    dag = dags["cdc_shop_postgres"]
    op = dag.get_task("report")
    write_record(dag, _pg_bounds(upto))
    summary = op.execute(make_context(dag, op, xcoms={
        "deliver": run, "release": {"released_to": {"lsn": "0/2000"}}}))
    by = {s["id"]: s for s in summary["sinks"]}
    assert (by["events"]["events"], by["events"]["lag_bytes"], by["events"]["behind"]) == (10, 0, False)
    assert (by["cache"]["status"], by["cache"]["lag_bytes"], by["cache"]["behind"]) == ("failed", 4096, True)
    # The DAG's report runs beside release, not after it: it does not read release's XCom.
    assert summary["events"] == 10 and summary["released_to"] is None
    assert "released to" not in report_mod.format_summary(summary)[0]
    # A report wired after release (release_task_id) names where the source was released to.
    sink = SimpleNamespace(id="events", kind="kafka", required=True)
    after = report_mod.summarize(SimpleNamespace(pipeline="shop_postgres", sinks=[sink]), report=run,
                                 bounds={"upto": upto}, released={"released_to": {"lsn": "0/2000"}})
    assert after["released_to"] == {"lsn": "0/2000"}
    assert "released to {'lsn': '0/2000'}" in report_mod.format_summary(after)[0]

    sent = {(kind, name): v for kind, name, v in stats.sent}
    assert sent == {("incr", "tidegate.events.shop_postgres.events"): 10,
                    ("incr", "tidegate.bytes.shop_postgres.events"): 2000,
                    ("incr", "tidegate.events.shop_postgres.cache"): 4,
                    ("incr", "tidegate.bytes.shop_postgres.cache"): 800}


def test_report_when_deliver_was_skipped(dags):
    from tidegate_airflow.operators.report import format_summary, summarize

    sink = SimpleNamespace(id="events", kind="kafka", required=True)
    spec = SimpleNamespace(pipeline="shop_mysql", sinks=[sink])
    s = summarize(spec, report=None, bounds=_bounds(MYSQL_UPTO).to_json(), released=None)
    assert s["nothing_to_do"] is True and s["sinks"][0]["status"] == "nothing_to_do"
    assert s["sinks"][0]["lag_bytes"] == 0
    assert "nothing to do" in format_summary(s)[0]


def test_real_stats_backend_accepts_the_metric_names():
    from tidegate_airflow.operators.report import emit_metrics

    summary = {"pipeline": "p", "events": 1, "bytes": 2, "nothing_to_do": False,
               "sinks": [{"id": "a-b", "kind": "kafka", "events": 1, "bytes": 2, "lag_bytes": 0,
                          "behind": False}]}
    emit_metrics(summary)  # Airflow's own Stats backend validates metric names: must not raise

    class Recorder:
        def __init__(self):
            self.names = []

        def incr(self, name, value, tags):
            self.names.append(name)

        gauge = incr

    rec = Recorder()
    emit_metrics(summary, stats=rec)
    assert rec.names == ["tidegate.events.p.a-b", "tidegate.bytes.p.a-b"]


# --------------------------------------------------------------------------- connections


def test_airflow_connection(monkeypatch):
    from tidegate.errors import ConnectionConfigError
    from tidegate_airflow import airflow_connection

    monkeypatch.setenv("AIRFLOW_CONN_SRC", json.dumps({
        "conn_type": "mysql", "host": "db", "port": 3307, "login": "cdc", "password": "pw-12345",
        "schema": "shop", "extra": {"ssl": "true"}}))
    c = airflow_connection("src")
    assert (c.conn_id, c.conn_type, c.host, c.port, c.login, c.password, c.schema, dict(c.extra)) == (
        "src", "mysql", "db", 3307, "cdc", "pw-12345", "shop", {"ssl": "true"})
    assert "pw-12345" not in repr(c)
    with pytest.raises(ConnectionConfigError, match="AIRFLOW_CONN_MISSING_ONE"):
        airflow_connection("missing_one")
