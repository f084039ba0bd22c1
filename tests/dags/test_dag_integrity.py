"""The DAG folder: every pipeline spec becomes a well-formed DAG; a broken spec is a readable
import error that does not take the other DAGs down; parsing is cheap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest
import yaml

from tests.dags.conftest import DAGS, EXAMPLES, ROOT, dagbag

TASKS = ["guard", "bounds", "deliver", "release", "report"]
PARAM_KEYS = {"mode", "sinks", "max_events", "replay_of", "resolve", "reason", "tables"}


def _specs() -> dict[str, dict]:
    out = {}
    for f in sorted(EXAMPLES.glob("*.yaml")):
        raw = yaml.safe_load(f.read_text())
        out[f"cdc_{raw['pipeline']}"] = raw
    return out


def test_no_import_errors_one_dag_per_spec(pipelines_dir):
    bag = dagbag()
    assert bag.import_errors == {}
    assert sorted(bag.dags) == sorted(_specs()) == ["cdc_shop_mysql", "cdc_shop_postgres"]


def test_every_dag_is_configured_for_micro_batches(dags):
    specs = _specs()
    for dag_id, dag in dags.items():
        raw = specs[dag_id]
        assert dag.max_active_runs == 1
        assert dag.catchup is False
        assert dag.owner == "tidegate"
        assert dag.dagrun_timeout and dag.dagrun_timeout > timedelta(0)
        assert set(dag.tags) == {"cdc", raw["source"]["kind"], *(s["kind"] for s in raw["sinks"])}
        assert dag.schedule == raw["schedule"]
        assert f"pipeline: {raw['pipeline']}" in dag.doc_md  # the spec's YAML is shown
        assert set(dag.params.keys()) == PARAM_KEYS
        for task in dag.tasks:
            assert task.owner == "tidegate"
            assert task.retries >= 2, task.task_id
            assert task.retry_exponential_backoff and task.retry_exponential_backoff > 1
            assert task.max_retry_delay is not None
            assert task.execution_timeout is not None, task.task_id


def test_tasks_are_wired_guard_bounds_deliver_then_release_and_report(dags):
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from tidegate.plan import GUARD_ORDER

    for dag in dags.values():
        assert sorted(dag.task_ids) == sorted(TASKS)
        assert dag.get_task("guard").downstream_task_ids == {"bounds"}
        assert dag.get_task("bounds").downstream_task_ids == {"deliver"}
        # Release and report side by side: a run ends one task process sooner.
        assert dag.get_task("deliver").downstream_task_ids == {"release", "report"}
        assert dag.get_task("release").downstream_task_ids == set()
        assert dag.get_task("report").downstream_task_ids == set()
        assert dag.get_task("report").release_task_id is None  # it does not wait for release's XCom
        assert dag.get_task("release").trigger_rule == "none_failed"
        assert dag.get_task("report").trigger_rule == "none_failed"
        deliver = dag.get_task("deliver")
        assert isinstance(deliver, SparkSubmitOperator)
        # the examples run through the long-lived Spark Connect server (a spark_connect connection)
        assert deliver._conn_id == deliver.spark_conn_id == "spark_connect"
        assert os.path.isfile(deliver.application) and deliver.application.endswith("spark_jobs/deliver.py")
        # One Spark job per pipeline at a time, backfill runs included (max_active_runs does not
        # count them); the scheduler test shows a backfill's deliver waiting for a scheduled one.
        assert deliver.max_active_tis_per_dag == 1
        assert dag.get_task("guard").checks == GUARD_ORDER  # one order for every source kind


def test_trigger_form_validates_values(dags):
    from airflow.sdk.exceptions import ParamValidationError

    dag = dags["cdc_shop_mysql"]
    defaults = dag.params.validate()
    assert defaults["mode"] == "incremental"
    assert defaults["sinks"] == ["events", "bus", "cache"]
    assert defaults["max_events"] is None and defaults["resolve"] is None
    for key, bad in (("mode", "snapshot_everything"), ("sinks", ["nope"]), ("sinks", []),
                     ("sinks", ["events", "events"]), ("max_events", 0), ("max_events", "ten"),
                     ("resolve", "ignore"), ("replay_of", 7), ("tables", ["no_schema"]),
                     ("tables", "shop.orders")):
        with pytest.raises(ParamValidationError):
            dag.params.get_param(key).resolve(bad)
    assert dag.params.get_param("resolve").resolve("accept_gap") == "accept_gap"
    assert dag.params.get_param("resolve").resolve("resnapshot") == "resnapshot"
    assert dag.params.get_param("tables").resolve(["shop.orders"]) == ["shop.orders"]
    assert dag.params.get_param("sinks").resolve(["cache"]) == ["cache"]
    assert dag.params.get_param("max_events").resolve(500) == 500
    # validated against draft-07's metaschema, a third of the default's cost (params.SCHEMA_DIALECT)
    assert {dag.params.get_param(k).schema["$schema"] for k in dag.params} == {
        "http://json-schema.org/draft-07/schema#"}


BROKEN = textwrap.dedent("""\
    pipeline: broken_one
    source:
      kind: oracle
      conn_id: db
    sinks:
      - {id: events, kind: kafka, conn_id: k, topic: "t"}
    """)


def test_broken_spec_is_a_readable_import_error_and_others_still_load(pipelines_dir):
    (pipelines_dir / "broken_one.yaml").write_text(BROKEN)
    (pipelines_dir / "not_yaml.yaml").write_text("pipeline: [unclosed\n")
    dup = (pipelines_dir / "shop_mysql.yaml").read_text()
    (pipelines_dir / "zz_duplicate.yaml").write_text(dup)
    bag = dagbag()
    assert sorted(bag.dags) == ["cdc_shop_mysql", "cdc_shop_postgres"]  # the good ones load
    assert list(bag.import_errors) and all(k.endswith("tidegate_spec_errors.py") for k in bag.import_errors)
    (message,) = bag.import_errors.values()
    assert "InvalidPipelineSpecError" in message
    lines = message.splitlines()
    # One line per problem, naming the file, the field and what is allowed.
    assert any(f"{pipelines_dir / 'broken_one.yaml'}: source.kind: unknown value 'oracle'; allowed: "
               "mysql | postgres" in ln for ln in lines), message
    assert any("not_yaml.yaml: line" in ln and "not valid YAML" in ln for ln in lines), message
    assert any("zz_duplicate.yaml: pipeline: 'shop_mysql' is already defined in" in ln for ln in lines)
    # short: a header, three problems, and a traceback of this one-line module
    assert len(message) < 2000


# the subprocesses import this checkout's engine and plugin (not an installed tidegate)
CHECKOUT_PATH = os.pathsep.join([str(ROOT / "plugins"), str(ROOT / "include")])

PARSE_PROBE = textwrap.dedent("""\
    import json, sys, time
    from airflow.dag_processing.dagbag import DagBag   # Airflow itself is loaded before parsing
    t0 = time.process_time()
    bag = DagBag(dag_folder=sys.argv[1])
    cpu = time.process_time() - t0
    # the kind packages' light spec modules (tidegate.sinks.kafka.spec, ...) are what specs are
    # made of; the sink and source code itself, and their bases, are the engine
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "confluent_kafka", "redis",
                   "nats", "pymysql", "psycopg2", "pymysqlreplication")
                   or m in ("tidegate.runner", "tidegate.coordinator", "tidegate.guards", "tidegate.store",
                            "tidegate.sources.base", "tidegate.sinks.base", "tidegate.spark")
                   or (m.startswith("tidegate.") and m.rsplit(".", 1)[-1] in ("sink", "source")))
    print(json.dumps({"cpu": cpu, "dags": sorted(bag.dags), "errors": bag.import_errors, "heavy": heavy}))
    """)


def test_parsing_20_specs_takes_under_2s_cpu_and_imports_no_engine(tmp_path):
    pdir = tmp_path / "pipelines"
    pdir.mkdir()
    template = yaml.safe_load((EXAMPLES / "shop_mysql.yaml").read_text())
    for i in range(20):
        # one replication client id each: validate refuses two readers of one server with one
        raw = dict(template, pipeline=f"load_{i:02d}", source=dict(template["source"], server_id=48200 + i))
        (pdir / f"load_{i:02d}.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    env = {**os.environ, "TIDEGATE_PIPELINES_DIR": str(pdir), "PYTHONPATH": CHECKOUT_PATH}
    out = subprocess.run([sys.executable, "-c", PARSE_PROBE, str(DAGS)], capture_output=True, text=True,
                         env=env, cwd=str(tmp_path), timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["errors"] == {}
    assert result["dags"] == [f"cdc_load_{i:02d}" for i in range(20)]
    assert result["heavy"] == [], "DAG parsing must not import the engine or client libraries"
    assert result["cpu"] < 2.0, f"parsing 20 specs took {result['cpu']:.2f} s CPU"


def test_a_tasks_parse_builds_only_the_dag_it_runs(tmp_path):
    """In a task's process Airflow sets the parsing context to the DAG being run: only that spec is
    read (a broken neighbour costs nothing) and only that DAG is built."""
    pdir = tmp_path / "pipelines"
    pdir.mkdir()
    template = yaml.safe_load((EXAMPLES / "shop_mysql.yaml").read_text())
    for i in range(20):
        # one replication client id each: validate refuses two readers of one server with one
        raw = dict(template, pipeline=f"load_{i:02d}", source=dict(template["source"], server_id=48200 + i))
        (pdir / f"load_{i:02d}.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    (pdir / "broken.yaml").write_text("pipeline: [unclosed\n")
    env = {**os.environ, "TIDEGATE_PIPELINES_DIR": str(pdir), "PYTHONPATH": CHECKOUT_PATH,
           "_AIRFLOW_PARSING_CONTEXT_DAG_ID": "cdc_load_07", "_AIRFLOW_PARSING_CONTEXT_TASK_ID": "bounds"}
    out = subprocess.run([sys.executable, "-c", PARSE_PROBE, str(DAGS / "tidegate_dags.py")],
                         capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert (result["dags"], result["errors"], result["heavy"]) == (["cdc_load_07"], {}, [])


FORKSERVER_PROBE = textwrap.dedent("""\
    import json, multiprocessing, os, sys

    def task_parse(dag_file, out):
        # what a task process forked from a LocalExecutor worker does first: parse the DAG file
        # as Airflow's task runner does (task_runner.parse)
        before = set(sys.modules)
        from airflow.dag_processing.dagbag import BundleDagBag

        bag = BundleDagBag(dag_folder=dag_file, safe_mode=False, load_op_links=False,
                           bundle_path=os.path.dirname(dag_file), bundle_name="dags-folder")
        dags = sorted(bag.dags)
        # the DAG file itself is the one module a parse adds (Airflow names it unusual_prefix_...)
        new = sorted(m for m in set(sys.modules) - before if not m.startswith("unusual_prefix_"))
        preloaded = "tidegate.runner" in before and "tidegate.sources.mysql.source" in before
        out.put({"dags": dags, "imported": new, "engine_preloaded": preloaded,
                 "connect_client": "pyspark.sql.connect.session" in before,
                 "jvm": "pyspark" in sys.modules
                        and sys.modules["pyspark"].SparkContext._gateway is not None})

    if __name__ == "__main__":
        from airflow.utils.process_utils import set_component_mp_start_method

        set_component_mp_start_method("scheduler")  # as the scheduler does, from its config
        out = multiprocessing.SimpleQueue()
        p = multiprocessing.Process(target=task_parse, args=(sys.argv[1], out))
        p.start()
        p.join()
        print(json.dumps({"method": multiprocessing.get_start_method(), **out.get()}))
    """)


def test_forkserver_preload_leaves_a_task_process_nothing_to_import(tmp_path, pipelines_dir):
    """scripts/services' deployment: the LocalExecutor's workers come from a forkserver that
    imported tidegate_airflow.preload (found on PYTHONPATH), so a task process (a fork of one)
    parses its DAG file as the task runner does without importing any module (the DagBag's
    imports alone were 0.4 s of every task) and holds the engine and the Spark Connect client
    already (a deliver task's session); no JVM was started (no classic Spark session's gateway)."""
    probe = tmp_path / "probe.py"
    probe.write_text(FORKSERVER_PROBE)
    env = {**os.environ, "PYTHONPATH": CHECKOUT_PATH, "AIRFLOW__SCHEDULER__MP_START_METHOD": "forkserver",
           "AIRFLOW__SCHEDULER__MP_FORKSERVER_PRELOAD": "tidegate_airflow.preload",
           "_AIRFLOW_PARSING_CONTEXT_DAG_ID": "cdc_shop_mysql"}
    out = subprocess.run([sys.executable, str(probe), str(DAGS / "tidegate_dags.py")], capture_output=True,
                         text=True, env=env, cwd=str(tmp_path), timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"method": "forkserver", "dags": ["cdc_shop_mysql"], "imported": [],
                      "engine_preloaded": True, "connect_client": True, "jvm": False}


def test_loading_the_plugin_imports_neither_the_page_nor_fastapi():
    """Every task's process loads Airflow plugins; the page's app is built on its first request."""
    probe = textwrap.dedent("""\
        import sys
        import tidegate_plugin
        print(sorted(m for m in sys.modules if m.split(".")[0] == "fastapi" or m == "tidegate_airflow.ui"))
        """)
    env = {**os.environ, "PYTHONPATH": CHECKOUT_PATH}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_lazy_page_app_serves_once_mounted():
    from starlette.applications import Starlette
    from starlette.routing import Mount
    from starlette.testclient import TestClient
    from tidegate_plugin import URL_PREFIX, TidegatePlugin

    (entry,) = TidegatePlugin.fastapi_apps
    client = TestClient(Starlette(routes=[Mount(URL_PREFIX, app=entry["app"])]))
    r = client.get(URL_PREFIX + "/api/status")  # built now; no login: refused as the page refuses
    assert r.status_code == 401
