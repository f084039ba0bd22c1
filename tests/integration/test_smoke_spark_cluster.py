"""The `spark` service: a standalone master and one worker from the venv's pyspark, on loopback.

A pipeline with two Delta sinks (merge and changelog) delivers a small MariaDB change set through
``spark-submit spark_jobs/deliver.py`` on that cluster, as the deliver task submits it (the spec's
spark connection ``spark_cluster``, the Delta settings of the sink kind, the tidegate zip in
``--py-files``): the change set spans two binlog files, so the worker's executors run Python tasks
that decode the slices, and they write the Delta files. The merged table then equals the source
table row by row, the changelog holds every change once, the application's event log and the
worker's executor log show where the tasks ran, and the master lists the application. (It
replaced a job that only summed numbers on the cluster: this one proves that and more, for one
JVM start.)"""

from __future__ import annotations

import collections
import datetime as dt
import json
import os
import random
import subprocess
import sys
import textwrap
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pymysql
import pytest
from tidegate.spark.package import package_zip

from tests.conftest import ROOT, SERVICES, services_env

pytestmark = [pytest.mark.integration]

SPARK_SUBMIT = Path(sys.executable).parent / "spark-submit"


@pytest.fixture(scope="module")
def cluster(service_env) -> dict:
    r = subprocess.run([sys.executable, str(SERVICES), "up", "spark"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    master = services_env()["TIDEGATE_SPARK_MASTER"]
    return {"master": master, "port": int(master.rsplit(":", 1)[1])}


def cluster_state(port: int) -> dict:
    """The JSON of the master's UI."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port + 1004}/json/", timeout=5) as resp:
        return json.load(resp)


# --------------------------------------------------------------------------- Delta on the cluster


def delta_rows(table: Path) -> list[dict]:
    """The rows of the Delta table at ``table`` as the Delta protocol defines them, without Spark:
    the data files the log's ``add`` actions name and no later ``remove`` took away, in commit
    order (a partition column is not in its files: the changelog's ``date`` is left out)."""
    live: dict[str, None] = {}
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                assert not action["add"].get("deletionVector"), "a deletion vector: read it with Spark"
                live[action["add"]["path"]] = None
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    files = [table / urllib.parse.unquote(path) for path in live]
    return [row for f in files for row in pq.ParquetFile(f).read().to_pylist()]


def event_log(folder: Path) -> list[dict]:
    """The events of the one application that logged to ``folder`` (Spark 4 rolls its event log:
    a folder ``eventlog_v2_<app>`` of ``events_<n>_<app>`` files)."""
    (app,) = list(folder.iterdir())
    parts = sorted(app.glob("events_*"), key=lambda p: int(p.name.split("_")[1])) if app.is_dir() else [app]
    return [json.loads(line) for p in parts for line in p.read_text().splitlines()]


def spec_text(pipeline: str, db: str, lake: Path, events: Path) -> str:
    return textwrap.dedent(f"""
        pipeline: {pipeline}
        source: {{kind: mysql, conn_id: cdc_mysql, tables: [{db}.items],
                  server_id: {48600 + random.randint(0, 99)}, start: head}}
        spark:
          conn_id: spark_cluster
          conf: {{spark.pyspark.python: "{sys.executable}", spark.eventLog.enabled: "true",
                  spark.eventLog.dir: "file://{events}", spark.eventLog.compress: "false",
                  spark.ui.enabled: "false", spark.sql.shuffle.partitions: "2"}}
        sinks:
          - {{id: merged, kind: delta, mode: merge, path: "{lake}/{{pipeline}}/merged/{{schema}}/{{table}}"}}
          - {{id: log, kind: delta, mode: changelog, path: "{lake}/{{pipeline}}/log/{{schema}}/{{table}}"}}
    """)


def guards_and_bounds(pipeline: str, run_id: str):
    """The DAG's guard and bounds tasks, in this process (they need no Spark): the run's record."""
    from tidegate import bounds_step, catalog, guards
    from tidegate.plan import RunPlan
    from tidegate.run import RunContext
    from tidegate.store import open_store

    spec = catalog.find(pipeline)
    with open_store() as store:
        plan = RunPlan.from_values({"mode": "incremental"}, sink_ids=[s.id for s in spec.sinks], who="test")
        run = RunContext(spec, plan, run_id, store=store)
        guards.run_guards(run)
        return bounds_step.prepare_bounds(run), spec


def submit(spec, run_id: str, tmp_path: Path) -> dict:
    """spark-submit of the deliver job as the deliver operator builds it: the master of the spec's
    spark connection, the sink kinds' settings then the spec's spark.conf, the tidegate zip; the
    connections and the store in spark-submit's own environment. Returns the run report."""
    from tidegate.connections import get_connection
    from tidegate.kinds import spark_settings

    conn = get_connection(spec.spark.conn_id)
    master = f"{conn.host}:{conn.port}"
    conf = {**spark_settings(spec), **spec.spark.conf, "spark.pyspark.driver.python": sys.executable}
    report_file = tmp_path / "report.json"
    cmd = [str(SPARK_SUBMIT), "--master", master, "--name", f"tidegate-{spec.pipeline}",
           "--py-files", str(package_zip(tmp_path)),
           *(a for k, v in conf.items() for a in ("--conf", f"{k}={v}")),
           str(ROOT / "spark_jobs" / "deliver.py"), "--pipeline", spec.pipeline, "--run-id", run_id,
           "--report-file", str(report_file)]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
                       timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(report_file.read_text())


def write_changes(sql) -> collections.Counter:
    """Inserts, updates (one key twice), a primary-key change, deletes and a delete then re-insert
    of one key, over two binlog files; the changes' ops as the changelog must count them."""
    sql("INSERT INTO items VALUES (1, 'a', 1), (2, 'b', 2), (3, 'c', 3), (4, 'd', 4), (5, 'e', 5), "
        "(6, 'f', 6)")
    sql("UPDATE items SET qty = 20 WHERE id = 2")
    sql("UPDATE items SET qty = 21, name = 'b+' WHERE id = 2")
    sql("UPDATE items SET name = 'c+' WHERE id = 3")
    sql("FLUSH BINARY LOGS")  # the rest in the next file: two slices, decoded by Spark tasks
    sql("UPDATE items SET id = 40 WHERE id = 4")  # a delete of 4 and a create of 40
    sql("DELETE FROM items WHERE id = 5")
    sql("DELETE FROM items WHERE id = 6")
    sql("INSERT INTO items VALUES (6, 'f again', 60)")
    sql("UPDATE items SET qty = qty + 1 WHERE id = 1")
    return collections.Counter({"c": 8, "u": 4, "d": 3})


def test_delta_sinks_delivered_by_spark_submit_on_the_cluster(cluster, mysql, tmp_path, monkeypatch):
    from tidegate import runner
    from tidegate.bounds_step import from_record
    from tidegate.store import open_store

    db = pipeline = f"dlc_{uuid.uuid4().hex[:6]}"
    lake, events = tmp_path / "lake", tmp_path / "events"
    (tmp_path / "pipelines").mkdir()
    events.mkdir()
    (tmp_path / "pipelines" / f"{pipeline}.yaml").write_text(spec_text(pipeline, db, lake, events))
    monkeypatch.setenv("TIDEGATE_PIPELINES_DIR", str(tmp_path / "pipelines"))
    monkeypatch.setenv("TIDEGATE_CHECKPOINT_STORE", f"sqlite:///{tmp_path / 'store.sqlite'}")
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))

    def sql(stmt: str) -> None:
        with admin.cursor() as c:
            c.execute(stmt)

    try:
        sql(f"CREATE DATABASE {db}")
        admin.select_db(db)
        sql("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40), qty INT)")
        placed, _ = guards_and_bounds(pipeline, "place")  # start: head places both sinks at the head
        assert placed.bounds.nothing_to_do(placed.plan.sinks)
        ops = write_changes(sql)
        run_id = "cluster__" + dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
        run, spec = guards_and_bounds(pipeline, run_id)
        slices = [s for s in run.record.segments if type(s).__name__ == "Slice"]
        assert len(slices) == 2, run.record.segments  # one slice per binlog file
        report = submit(spec, run_id, tmp_path)
        with open_store() as store:
            runner.release(from_record(store, pipeline, run_id))
        with admin.cursor(pymysql.cursors.DictCursor) as c:
            c.execute("SELECT * FROM items")
            source = sorted(c.fetchall(), key=lambda r: r["id"])
    finally:
        sql(f"DROP DATABASE IF EXISTS {db}")
        admin.close()

    assert report["events"] == sum(ops.values())
    merged = sorted(delta_rows(lake / pipeline / "merged" / db / "items"), key=lambda r: r["id"])
    assert merged == source == [{"id": 1, "name": "a", "qty": 2}, {"id": 2, "name": "b+", "qty": 21},
                                {"id": 3, "name": "c+", "qty": 3}, {"id": 6, "name": "f again", "qty": 60},
                                {"id": 40, "name": "d", "qty": 4}]
    changes = delta_rows(lake / pipeline / "log" / db / "items")
    assert collections.Counter(r["op"] for r in changes) == ops
    assert len({r["idempotency_key"] for r in changes}) == len(changes)

    # Where it ran: every task on an executor of the cluster's worker, Delta's writes among them,
    # and the slices decoded there (the note each slice's task writes to its executor's log).
    log = event_log(events)
    app = next(e["App ID"] for e in log if e["Event"] == "SparkListenerApplicationStart")
    executors = {e["Executor ID"]: e["Executor Info"]["Host"] for e in log
                 if e["Event"] == "SparkListenerExecutorAdded"}
    tasks = [e for e in log if e["Event"] == "SparkListenerTaskEnd"]
    assert executors and "driver" not in executors
    assert {t["Task Info"]["Executor ID"] for t in tasks} <= set(executors)
    written = sum(t.get("Task Metrics", {}).get("Output Metrics", {}).get("Records Written", 0)
                  for t in tasks)
    assert written >= len(changes)  # the changelog's rows at least, and the merge's
    work = Path(os.environ.get("TIDEGATE_SERVICES_DIR") or ROOT / ".services") / "spark" / "work" / app
    notes = "".join(p.read_text() for p in work.glob("*/stderr"))
    assert f"pipeline {pipeline} slice 1/2" in notes and f"pipeline {pipeline} slice 2/2" in notes
    assert notes.count("AIRFLOW_CONN_*/TIDEGATE_* in the environment: none") == 2  # the job carried them
    state = cluster_state(cluster["port"])
    assert state["status"] == "ALIVE" and state["aliveworkers"] >= 1
    assert app in {a["id"] for a in state["completedapps"]}
