"""The product as users meet it: `airflow dags test` runs the DAG of a pipeline spec against the
real servers, Spark and all. Three runs with a workload in between deliver every change exactly
once (Kafka read_committed; NATS and Redis counted by idempotency_key), in order per key; a run
with nothing new does not start Spark; a purged binlog halts the DAG at its guard until a run
triggered with resolve=accept_gap and a reason resumes it.

The MariaDB and PostgreSQL three-run pipelines deliver as Spark Connect clients (their
``spark.conn_id`` is the `spark_connect` service's connection): no spark-submit; the MariaDB
ranges span several binlog files, so the server's Python workers decode slices through a data
source, with the tidegate of the package the task shipped with its session and no
AIRFLOW_CONN_*/TIDEGATE_* variable of their own (each task says so in a note the task logs).
The purged-binlog pipeline keeps the default spark-submit path (local[2]) up to and including the
accept_gap run; the one run after it (a plain delivery, the same driver code either way) is a
Spark Connect client, which spares a Spark JVM start."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import textwrap
import uuid

import psutil
import psycopg2
import pymysql
import pytest
from tidegate.store import open_store

from tests.integration.airflow_support import (
    VENV_BIN,
    connect_task_workers,
    dags_test,
    dags_test_cmd,
    executor_notes,
    make_airflow_env,
    per_key,
    spark_connect_server,  # noqa: F401 - the spark_connect fixture
    task_ended,
    wait_for,
)
from tests.integration.sink_readers import kafka_changes, nats_ids, redis_events, redis_ids

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory, service_env, mysql, postgres, kafka, redis_service, nats_service):
    """A private AIRFLOW_HOME with a migrated metadata DB, the project's dags/ and plugins/, a
    pipelines folder of this test's own and a fresh checkpoint store."""
    base = tmp_path_factory.mktemp("airflow")
    return make_airflow_env(base, service_env), base


# --------------------------------------------------------------------------- MariaDB


def test_mariadb_to_kafka_eos_nats_redis_three_runs_exactly_once(airflow_env, mysql, kafka_bootstrap,
                                                                nats_service, redis_service, spark_connect):
    env, base = airflow_env
    tag = uuid.uuid4().hex[:6]
    db, pipeline, stream = f"e2e_{tag}", f"e2e_my_{tag}", f"E2E_MY_{tag.upper()}"
    (base / "pipelines" / f"{pipeline}.yaml").write_text(textwrap.dedent(f"""
        pipeline: {pipeline}
        tenant: e2e
        source: {{kind: mysql, conn_id: cdc_mysql, tables: [{db}.orders], server_id: 48300, start: head}}
        batch: {{max_events: 4}}
        sinks:
          - {{id: events, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{schema}}.{{table}}",
              exactly_once: true}}
          - {{id: bus, kind: nats, conn_id: cdc_nats, stream: {stream}, subject: "{{pipeline}}.{{table}}"}}
          - {{id: cache, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:{{table}}", required: false}}
        spark: {{conn_id: spark_connect, conf: {{spark.tidegate.delivery: gathered}}}}
    """))
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    with admin.cursor() as c:
        c.execute(f"CREATE DATABASE {db}")
        c.execute(f"CREATE TABLE {db}.orders (id INT PRIMARY KEY, status VARCHAR(20))")

    def sql(*stmts: str) -> None:
        with admin.cursor() as c:
            for s in stmts:
                c.execute(s)

    dag = f"cdc_{pipeline}"
    rc, log = dags_test(env, dag)  # first run: sinks placed at the head, nothing to read
    assert rc == 0, log[-3000:]
    assert not task_ended(log, "deliver") and "spark-submit" not in log

    # Each workload spans two binlog files: two slices, decoded by the cluster's executors.
    sql(f"INSERT INTO {db}.orders VALUES (1, 'new'), (2, 'new'), (3, 'new')", "FLUSH BINARY LOGS",
        "BEGIN", f"UPDATE {db}.orders SET status = 'paid' WHERE id = 1",
        f"INSERT INTO {db}.orders VALUES (4, 'new')", "COMMIT")
    rc, log = dags_test(env, dag)
    assert rc == 0 and task_ended(log, "deliver"), log[-3000:]
    notes = executor_notes(log, pipeline)
    assert "as a Spark Connect client of" in log and "spark-submit" not in log, log[-3000:]
    # two slices (gathered: the default reads the log in the delivery task): a Spark task each
    # reads one, and one more delivers them in order
    assert "by a Spark task on the server" in log, log[-3000:]
    assert f"pipeline {pipeline}: 2 part(s) read by Spark tasks side by side (2 task(s))" in log, log[-3000:]

    sql(f"DELETE FROM {db}.orders WHERE id = 2", "FLUSH BINARY LOGS",
        f"UPDATE {db}.orders SET status = 'shipped' WHERE id = 1",
        f"INSERT INTO {db}.orders VALUES (5, 'new')")
    rc, log = dags_test(env, dag)
    assert rc == 0 and task_ended(log, "deliver"), log[-3000:]
    notes += executor_notes(log, pipeline)

    rc, log = dags_test(env, dag)  # caught up: no Spark
    assert rc == 0 and not task_ended(log, "deliver"), log[-3000:]
    admin.close()

    changes = kafka_changes(kafka_bootstrap, f"{pipeline}.{db}.orders")
    assert per_key(changes) == {
        1: [("c", "new"), ("u", "paid"), ("u", "shipped")],
        2: [("c", "new"), ("d", None)],
        3: [("c", "new")],
        4: [("c", "new")],
        5: [("c", "new")],
    }
    keys = [ch["idempotency_key"] for ch in changes]
    assert len(keys) == len(set(keys)) == 8
    assert collections.Counter(nats_ids(nats_service.cdc, stream)) == collections.Counter(keys)
    assert redis_ids(redis_service.cdc, f"{pipeline}:orders") == keys  # one stream: source order

    store = open_store(env["TIDEGATE_CHECKPOINT_STORE"])
    try:
        entries = store.runs.entries(pipeline)
        assert [e.status for e in entries] == ["success", "success"]
        assert [sum(s.events for s in e.sinks.values()) for e in entries] == [3 * 5, 3 * 3]
    finally:
        store.close()

    # The server's Python workers decoded the slices with the package the task shipped with its
    # session (the server keeps it in its session's files, not the checkout's include/), and had
    # no connection or tidegate setting of their own.
    assert len(notes) >= 4, notes  # two runs, two slices each
    events = [int(re.search(r": (\d+) events in", n).group(1)) for n in notes]
    assert sum(events) == 5 + 3
    for note in notes:
        source = re.search(r"tidegate imported from (\S+);", note).group(1)
        assert source.startswith(str(spark_connect)) and ".zip/" in source, note
        assert note.endswith("AIRFLOW_CONN_*/TIDEGATE_* in the environment: none"), note


def test_purged_binlog_halts_the_dag_until_accept_gap(airflow_env, mysql, kafka_bootstrap, redis_service,
                                                      spark_connect):
    """A purge past the checkpoint halts; accept_gap moves every sink, the Kafka exactly-once one
    included, to the earliest position still there (its sink-side record from before the purge
    does not pull it back); what was purged never arrives, what follows arrives once."""
    env, base = airflow_env
    tag = uuid.uuid4().hex[:6]
    db, pipeline = f"e2e_{tag}", f"e2e_purge_{tag}"
    spec = textwrap.dedent(f"""
        pipeline: {pipeline}
        source: {{kind: mysql, conn_id: cdc_mysql, tables: [{db}.t], server_id: 48301, start: head}}
        sinks:
          - {{id: events, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}",
              exactly_once: true}}
          - {{id: cache, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:{{table}}"}}
    """)
    (base / "pipelines" / f"{pipeline}.yaml").write_text(spec)
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    dag = f"cdc_{pipeline}"

    def sql(*stmts: str) -> None:
        with admin.cursor() as c:
            for st in stmts:
                c.execute(st)

    try:
        sql(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t (id INT PRIMARY KEY, status VARCHAR(20))")
        rc, log = dags_test(env, dag)
        assert rc == 0, log[-3000:]
        sql(f"INSERT INTO {db}.t VALUES (1, 'a')")  # delivered: Kafka keeps a sink-side record
        rc, log = dags_test(env, dag)
        assert rc == 0 and task_ended(log, "deliver"), log[-3000:]
        assert "spark-submit" in log and "Spark Connect" not in log, log[-3000:]  # the default path
        sql(f"INSERT INTO {db}.t VALUES (2, 'lost')", "FLUSH BINARY LOGS",
            f"INSERT INTO {db}.t VALUES (3, 'after the gap')")
        with admin.cursor() as c:
            c.execute("SHOW MASTER STATUS")
            newest = c.fetchone()[0]
        from tests.integration.test_smoke_mysql import purge_to

        purge_to(admin, newest)

        rc, log = dags_test(env, dag)
        assert rc != 0 and "CONTINUITY HALT" in log and "binlog_purged" in log, log[-3000:]
        assert not task_ended(log, "bounds")
        store = open_store(env["TIDEGATE_CHECKPOINT_STORE"])
        inc = store.incidents.all(pipeline)[0]
        assert (inc.kind, inc.resolved, inc.to_position.file, inc.to_position.pos) == (
            "binlog_purged", False, newest, 4)
        assert inc.from_position == store.checkpoints.get(pipeline, "events").position

        rc, log = dags_test(env, dag)  # later runs halt too
        assert rc != 0 and f"incident #{inc.id}" in log

        rc, log = dags_test(env, dag, {"resolve": "accept_gap", "reason": "row 2 reloaded by hand"})
        assert rc == 0 and task_ended(log, "deliver"), log[-3000:]
        resolved = store.incidents.get(inc.id)
        assert (resolved.resolved, resolved.resolution, resolved.reason) == (
            True, "accept_gap", "row 2 reloaded by hand")
        for sink in ("events", "cache"):
            history = store.checkpoints.history(pipeline, sink)
            gap = [h for h in history if h.kind == "accept_gap"]
            assert [h.position for h in gap] == [inc.to_position], sink
            after = history[history.index(gap[0]) + 1:]
            # the same run resumed from the earliest position; nothing moved it back
            assert after and all(h.position > inc.to_position for h in after), sink
        sql(f"INSERT INTO {db}.t VALUES (4, 'later')")
        # The run after the gap delivers as a Spark Connect client: the spark-submit path is
        # proven by the runs before (the delivery, the accept_gap run); this one spares a JVM start.
        (base / "pipelines" / f"{pipeline}.yaml").write_text(spec + "spark: {conn_id: spark_connect}\n")
        rc, log = dags_test(env, dag)
        assert rc == 0 and task_ended(log, "deliver"), log[-3000:]
        assert "as a Spark Connect client of" in log and "spark-submit" not in log, log[-3000:]
        store.close()
        changes = kafka_changes(kafka_bootstrap, f"{pipeline}.t")
        assert [(c["key"]["id"], c["after"]["status"]) for c in changes] == [
            (1, "a"), (3, "after the gap"), (4, "later")]
        cached = [json.loads(e) for e in redis_events(redis_service.cdc, f"{pipeline}:t")]
        assert [e["after"]["id"] for e in cached] == [1, 3, 4]
        # Consumers are told, in-band: one gap message per sink, with the incident's exact range
        # and reason, sitting where the gap is (at the first position after it).
        for sink, control in (("kafka", kafka_changes(kafka_bootstrap, f"{pipeline}.__control")),
                              ("redis", [json.loads(e) for e in
                                         redis_events(redis_service.cdc, f"{pipeline}:__control")])):
            assert [m["type"] for m in control] == ["gap"], sink
            gap = control[0]
            expected = (inc.id, "row 2 reloaded by hand", inc.from_position.to_json(),
                        inc.to_position.to_json())
            assert (gap["incident"], gap["reason"], gap["from"], gap["to"]) == expected, sink
            assert gap["position"] == inc.to_position.to_json()
        after_gap = [c for c in changes if c["after"]["id"] >= 3]
        assert all(c["source"]["position"]["file"] == inc.to_position.file for c in after_gap)
    finally:
        sql(f"DROP DATABASE IF EXISTS {db}")
        admin.close()


# --------------------------------------------------------------------------- Postgres


def write_postgres_pipeline(base, pipeline: str, table: str, *, max_events: int, kafka: str,
                            redis: str) -> None:
    """A PostgreSQL pipeline of ``table`` to a Kafka and a Redis sink (``kafka``, ``redis``: more
    fields of each), delivered through the `spark_connect` server."""
    kafka, redis = (f", {more}" if more else "" for more in (kafka, redis))
    (base / "pipelines" / f"{pipeline}.yaml").write_text(textwrap.dedent(f"""
        pipeline: {pipeline}
        tenant: e2e
        source: {{kind: postgres, conn_id: cdc_postgres, tables: [public.{table}], slot: {pipeline},
                 start: head}}
        batch: {{max_events: {max_events}}}
        sinks:
          - {{id: events, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{schema}}.{{table}}"{kafka}}}
          - {{id: cache, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:{{table}}"{redis}}}
        spark: {{conn_id: spark_connect}}
    """))


def test_postgres_to_kafka_and_redis_three_runs_exactly_once(airflow_env, postgres, kafka_bootstrap,
                                                            redis_service, spark_connect):
    env, base = airflow_env
    tag = uuid.uuid4().hex[:6]
    table, pipeline = f"e2e_orders_{tag}", f"e2e_pg_{tag}"
    write_postgres_pipeline(base, pipeline, table, max_events=3, kafka="", redis="required: false")
    admin = psycopg2.connect(postgres.admin_dsn)
    admin.autocommit = True

    def sql(*stmts: str) -> None:
        with admin.cursor() as c:
            for s in stmts:
                c.execute(s)

    sql(f"CREATE TABLE {table} (id int PRIMARY KEY, status text)",
        f"ALTER TABLE {table} REPLICA IDENTITY FULL")
    dag = f"cdc_{pipeline}"
    try:
        rc, log = dags_test(env, dag)  # creates the slot; nothing to read yet
        assert rc == 0 and not task_ended(log, "deliver"), log[-3000:]
        sql(f"INSERT INTO {table} VALUES (1, 'new'), (2, 'new')",
            f"BEGIN; UPDATE {table} SET status = 'paid' WHERE id = 1; "
            f"INSERT INTO {table} VALUES (3, 'new'); COMMIT")
        rc, log = dags_test(env, dag)
        assert rc == 0 and task_ended(log, "deliver"), log[-3000:]
        # One slice (a slot is one stream): one Spark task on the server reads and delivers it.
        assert "as a Spark Connect client of" in log and "spark-submit" not in log, log[-3000:]
        assert "by a Spark task on the server" in log, log[-3000:]
        # The pipeline's first task, in a new session's first worker, found the client libraries
        # imported: the server's Python daemon is tidegate's (tidegate/spark/daemon.py), which
        # imports them before it forks a worker (the engine it leaves to the session's package).
        assert "'clients_preloaded': True" in log and "'worker_warm': False" in log, log[-3000:]
        sql(f"DELETE FROM {table} WHERE id = 2", f"UPDATE {table} SET status = 'shipped' WHERE id = 1")
        rc, log = dags_test(env, dag)
        assert rc == 0 and task_ended(log, "deliver"), log[-3000:]
        rc, log = dags_test(env, dag)
        assert rc == 0 and not task_ended(log, "deliver"), log[-3000:]

        changes = kafka_changes(kafka_bootstrap, f"{pipeline}.public.{table}")
        assert per_key(changes) == {
            1: [("c", "new"), ("u", "paid"), ("u", "shipped")],
            2: [("c", "new"), ("d", None)],
            3: [("c", "new")],
        }
        keys = [ch["idempotency_key"] for ch in changes]
        assert len(keys) == len(set(keys)) == 6
        assert sorted(redis_ids(redis_service.cdc, f"{pipeline}:{table}")) == sorted(keys)
        # The release task advanced the slot to the lowest committed checkpoint.
        store = open_store(env["TIDEGATE_CHECKPOINT_STORE"])
        lowest = min(r.position for r in store.checkpoints.current(pipeline).values())
        store.close()
        with admin.cursor() as c:
            c.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                      (pipeline,))
            assert c.fetchone()[0] == str(lowest.lsn)
    finally:
        sql("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            f"WHERE slot_name = '{pipeline}'", f"DROP TABLE IF EXISTS {table}")
        admin.close()


def test_a_killed_deliver_task_stops_its_spark_task_and_the_rerun_delivers_the_rest_once(
        airflow_env, postgres, kafka, kafka_bootstrap, redis_service, spark_connect):
    """A run delivered by a Spark task goes on without its Airflow task unless the task stops it:
    SIGTERM the deliver task (Airflow's kill: on_kill) while its Spark task delivers, held still
    by SIGSTOP so that only an interrupt can end it. The server kills the stopped worker, the run
    is left part-delivered, and the next run delivers the rest: every change once, in order."""
    env, base = airflow_env
    tag = uuid.uuid4().hex[:6]
    table, pipeline = f"kill_orders_{tag}", f"e2e_kill_{tag}"
    write_postgres_pipeline(base, pipeline, table, max_events=20, kafka="exactly_once: true", redis="")
    admin = psycopg2.connect(postgres.admin_dsn)
    admin.autocommit = True
    with admin.cursor() as c:
        c.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, status text)")
    dag, rows = f"cdc_{pipeline}", 5000
    sink_ports = {kafka.port, redis_service.port}
    try:
        rc, log = dags_test(env, dag)  # creates the slot
        assert rc == 0, log[-3000:]
        with admin.cursor() as c:
            for first in range(0, rows, 20):  # 250 transactions, a sub-batch each
                c.execute(f"INSERT INTO {table} SELECT g, 'new' "
                          f"FROM generate_series({first}, {first + 19}) g")
        stream = f"{pipeline}:{table}"
        workers: list = []
        with tempfile.TemporaryFile() as out:
            task = subprocess.Popen(dags_test_cmd(dag), env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                wait_for(lambda: delivering(sink_ports) and len(redis_ids(redis_service.cdc, stream)) > 0,
                         120, "the Spark task delivering", every=0.05)
                # Every worker with a sink connection: the delivering one, and maybe an idle worker
                # another test's session keeps (workers are reused); only an interrupt ends one.
                workers = delivering(sink_ports)
                for w in workers:
                    w.suspend()
                held = len(redis_ids(redis_service.cdc, stream))
                # Airflow's kill of a task: SIGTERM (its on_kill), then SIGKILL after a grace period
                # (here: once the Spark task ended, before `dags test` could retry the task).
                task.send_signal(signal.SIGTERM)
                wait_for(lambda: any(not w.is_running() or w.status() == "zombie" for w in workers), 60,
                         "the server ending the stopped Spark task", every=0.05)
            finally:
                os.killpg(task.pid, signal.SIGKILL)
                task.wait()
                for w in workers:  # the idle ones go on
                    with contextlib.suppress(psutil.Error):
                        w.resume()
            out.seek(0)
            killed_log = out.read().decode(errors="replace")
        assert "Spark operation(s) of the run interrupted" in killed_log, killed_log[-3000:]
        assert 0 < held < rows and len(redis_ids(redis_service.cdc, stream)) == held
        rc, log = dags_test(env, dag)
        assert rc == 0 and "by a Spark task on the server" in log, log[-3000:]
        changes = kafka_changes(kafka_bootstrap, f"{pipeline}.public.{table}")
        assert sorted(ch["after"]["id"] for ch in changes) == list(range(rows))
        keys = [ch["idempotency_key"] for ch in changes]
        assert len(set(keys)) == rows and sorted(redis_ids(redis_service.cdc, stream)) == sorted(keys)
    finally:
        with admin.cursor() as c:
            c.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                      f"WHERE slot_name = '{pipeline}' AND NOT active")
            c.execute(f"DROP TABLE IF EXISTS {table}")
        admin.close()


def delivering(ports: set[int]) -> list:
    """The `spark_connect` server's task workers connected to one of ``ports`` (the sinks'):
    the Spark task delivering a run."""
    found = []
    for w in connect_task_workers():
        try:
            if any(c.raddr and c.raddr.port in ports for c in w.net_connections("tcp")):
                found.append(w)
        except psutil.Error:
            continue
    return found


def test_runs_through_the_server_reuse_its_python_worker(airflow_env, postgres, kafka_bootstrap,
                                                         redis_service, spark_connect):
    """Runs delivered by a Spark task, one after the other, are delivered by the same Python
    worker of the server: the task reads its input to the end, so PySpark gives the worker back
    to the pool instead of ending it (which cost every run a new worker). `tidegate run` delivers
    as the deliver task does."""
    env, base = airflow_env
    tag = uuid.uuid4().hex[:6]
    table, pipeline = f"reuse_{tag}", f"e2e_reuse_{tag}"
    write_postgres_pipeline(base, pipeline, table, max_events=100, kafka="exactly_once: true", redis="")
    admin = psycopg2.connect(postgres.admin_dsn)
    admin.autocommit = True
    with admin.cursor() as c:
        c.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, status text)")

    def run() -> dict:
        r = subprocess.run([str(VENV_BIN / "tidegate"), "run", pipeline], env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout)

    try:
        run()  # creates the slot at the head
        tasks = []
        for i in range(3):
            with admin.cursor() as c:
                c.execute(f"INSERT INTO {table} VALUES ({i}, 'new')")
            report = run()
            assert (report["events"], report["delivered_by"]) == (1, "executor"), report
            tasks.append(report["delivery_task"])
        assert len({t["pid"] for t in tasks}) == 1, tasks  # one worker for the three runs
        assert [t["worker_warm"] for t in tasks] == [False, True, True], tasks
        changes = kafka_changes(kafka_bootstrap, f"{pipeline}.public.{table}")
        assert [ch["after"]["id"] for ch in changes] == [0, 1, 2]
    finally:
        with admin.cursor() as c:
            c.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                      f"WHERE slot_name = '{pipeline}' AND NOT active")
            c.execute(f"DROP TABLE IF EXISTS {table}")
        admin.close()
