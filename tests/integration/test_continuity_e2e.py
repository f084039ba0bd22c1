"""Continuity as users meet it, through `airflow dags test` against the real servers, the deliver
tasks as clients of the `spark_connect` service.

- MariaDB: the pipeline's connection is repointed from the primary to its GTID replica (which
  keeps replicating, so binlog files and offsets differ); the first run after the failover is
  SIGKILLed mid-delivery; every change still reaches Kafka (exactly-once), NATS and Redis once,
  in order per key. A rewind of all three sinks then re-delivers exactly what followed the
  restored version on Kafka and Redis.
- PostgreSQL: a promoted standby behind the connection halts with the range; accept_gap creates
  the slot on the new primary and streaming resumes there; another cluster (another system id)
  behind the connection halts too.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import psycopg2
import pymysql
import pytest
from tidegate.store import open_store

from tests.conftest import SERVICES, services_cmd
from tests.integration.airflow_support import (
    VENV_BIN,
    dags_test,
    dags_test_killed_when,
    make_airflow_env,
    per_key,
    spark_connect_server,  # noqa: F401 - the spark_connect fixture
    task_ended,
)
from tests.integration.sink_readers import kafka_changes, nats_ids, nats_payloads, redis_events, redis_ids

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory, service_env, mysql, mysql_replica, postgres, postgres_standby, kafka,
                redis_service, nats_service, spark_connect):
    base = tmp_path_factory.mktemp("continuity")
    return make_airflow_env(base, service_env), base


class Workload:
    """Single-row transactions on one table; remembers every key's (op, status) in order."""

    def __init__(self, execute):
        self.execute = execute
        self.next_id = 1
        self.expected: dict[int, list[tuple]] = collections.defaultdict(list)

    def wave(self, n: int, table: str) -> dict[int, list[tuple]]:
        """n inserts, then an update of every 3rd and a delete of every 5th new row; returns
        this wave's changes per key."""
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        mine: dict[int, list[tuple]] = collections.defaultdict(list)
        for i in ids:
            self.execute(f"INSERT INTO {table} VALUES ({i}, 'new')")
            mine[i].append(("c", "new"))
        for i in ids[::3]:
            self.execute(f"UPDATE {table} SET status = 'paid' WHERE id = {i}")
            mine[i].append(("u", "paid"))
        for i in ids[::5]:
            self.execute(f"DELETE FROM {table} WHERE id = {i}")
            mine[i].append(("d", None))
        for k, v in mine.items():
            self.expected[k] += v
        return dict(mine)


def status_json(env: dict[str, str], pipeline: str) -> dict:
    out = subprocess.run([str(VENV_BIN / "tidegate"), "status", pipeline, "--json"], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["pipelines"][0]


def wait_replica_has(primary, replica, timeout: float = 30) -> None:
    with primary.cursor() as c:
        c.execute("SELECT @@gtid_binlog_pos")
        want = c.fetchone()[0]
    deadline = time.monotonic() + timeout
    with replica.cursor() as c:
        while True:
            c.execute("SELECT @@gtid_slave_pos")
            if c.fetchone()[0] == want:
                return
            assert time.monotonic() < deadline, "the replica did not catch up"
            time.sleep(0.1)


# --------------------------------------------------------------------------- MariaDB


def test_gtid_failover_with_a_kill_then_rewind_through_airflow(airflow_env, mysql, mysql_replica,
                                                               service_env, kafka_bootstrap,
                                                               nats_service, redis_service):
    env, base = airflow_env
    tag = uuid.uuid4().hex[:6]
    db, pipeline, stream = f"fo_{tag}", f"fo_{tag}", f"FO_{tag.upper()}"
    table = f"{db}.orders"
    env["AIRFLOW_CONN_CDC_SRC"] = service_env["AIRFLOW_CONN_CDC_MYSQL"]
    (base / "pipelines" / f"{pipeline}.yaml").write_text(textwrap.dedent(f"""
        pipeline: {pipeline}
        source: {{kind: mysql, conn_id: cdc_src, tables: [{table}], server_id: 48310, start: head}}
        batch: {{max_events: 4}}
        spark: {{conn_id: spark_connect}}
        sinks:
          - {{id: events, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}",
              exactly_once: true}}
          - {{id: bus, kind: nats, conn_id: cdc_nats, stream: {stream}, subject: "{{pipeline}}.{{table}}"}}
          - {{id: cache, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:{{table}}"}}
    """))
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    replica_admin = pymysql.connect(**mysql_replica.mysql_kwargs(autocommit=True))

    def sql(stmt: str) -> None:
        with admin.cursor() as c:
            c.execute(stmt)

    sql(f"CREATE DATABASE {db}")
    sql(f"CREATE TABLE {table} (id INT PRIMARY KEY, status VARCHAR(20))")
    work = Workload(sql)
    dag = f"cdc_{pipeline}"
    store = open_store(env["TIDEGATE_CHECKPOINT_STORE"])
    try:
        # two runs on the primary
        rc, log = dags_test(env, dag)
        assert rc == 0 and not task_ended(log, "deliver"), log[-3000:]
        work.wave(12, table)
        rc, log = dags_test(env, dag)
        assert rc == 0 and task_ended(log, "deliver"), log[-3000:]
        work.wave(9, table)  # not delivered before the failover

        # failover: the primary rotates its binlog, the connection moves to the replica, which
        # keeps replicating what the primary still writes
        sql("FLUSH BINARY LOGS")
        wait_replica_has(admin, replica_admin)
        env["AIRFLOW_CONN_CDC_SRC"] = service_env["AIRFLOW_CONN_CDC_MYSQL_REPLICA"]
        work.wave(400, table)
        wait_replica_has(admin, replica_admin)

        # the first run after the failover is killed once it has committed two sub-batches
        def two_sub_batches_on_the_replica() -> bool:
            hist = store.checkpoints.history(pipeline, "events")
            return sum(1 for h in hist if h.kind == "write" and h.position.server_id == 2) >= 2

        dags_test_killed_when(env, dag, two_sub_batches_on_the_replica)
        rc, log = dags_test(env, dag)
        assert rc == 0 and task_ended(log, "deliver"), log[-3000:]
        before_w4 = {sid: store.checkpoints.get(pipeline, sid).version for sid in ("events", "bus", "cache")}
        w4 = work.wave(10, table)
        wait_replica_has(admin, replica_admin)
        rc, log = dags_test(env, dag)
        assert rc == 0 and task_ended(log, "deliver"), log[-3000:]

        # every change once per sink, in order per key
        changes = kafka_changes(kafka_bootstrap, f"{pipeline}.orders")
        assert per_key(changes) == work.expected
        keys = [ch["idempotency_key"] for ch in changes]
        assert len(keys) == len(set(keys)) == sum(len(v) for v in work.expected.values())
        data_ids = [i for i in nats_ids(nats_service.cdc, stream) if "|__control|" not in i]
        assert collections.Counter(data_ids) == collections.Counter(keys)
        cached = [json.loads(e) for e in redis_events(redis_service.cdc, f"{pipeline}:orders")]
        assert per_key(cached) == work.expected
        assert len({e["idempotency_key"] for e in cached}) == len(cached) == len(keys)

        # the failover is on record: status, checkpoint history, journal
        status = status_json(env, pipeline)
        assert status["halted"] is False
        [fo] = status["failovers"]
        assert "server_id 1 -> 2" in fo["detail"] and fo["resolution"] == "auto"
        assert fo["from"]["server_id"] == 1 and fo["to"]["server_id"] == 2
        assert status["identity"]["server_id"] == 2
        assert all(s["position"]["server_id"] == 2 for s in status["sinks"])
        kinds = [h.kind for h in store.checkpoints.history(pipeline, "events")]
        assert kinds.count("failover") == 1
        # every control channel says so, once
        controls = {"kafka": kafka_changes(kafka_bootstrap, f"{pipeline}.__control"),
                    "nats": nats_payloads(nats_service.cdc, stream, f"{pipeline}.__control"),
                    "redis": [json.loads(e) for e in
                              redis_events(redis_service.cdc, f"{pipeline}:__control")]}
        for sink, control in controls.items():
            assert [(m["type"], m["from_identity"]["server_id"], m["to_identity"]["server_id"])
                    for m in control] == [("failover", 1, 2)], sink
            assert control[0]["incident"] == fo["incident"]
        assert any(e.mode == "failover" for e in store.runs.entries(pipeline))

        # rewind every sink to the version before wave 4: wave 4 arrives a second time
        for sid, version in before_w4.items():
            r = subprocess.run([str(VENV_BIN / "tidegate"), "checkpoints", "rewind", pipeline, sid,
                                "--to-version", str(version), "--reason", "consumer rebuilt its table"],
                               env=env, capture_output=True, text=True)
            assert r.returncode == 0 and "delivers again" in r.stdout, r.stderr
        rc, log = dags_test(env, dag)
        assert rc == 0 and task_ended(log, "deliver"), log[-3000:]
        again = {k: v + w4.get(k, []) for k, v in work.expected.items()}
        changes = kafka_changes(kafka_bootstrap, f"{pipeline}.orders")
        assert per_key(changes) == again
        counts = collections.Counter(ch["idempotency_key"] for ch in changes)
        assert sorted(set(counts.values())) == [1, 2]
        assert sum(1 for n in counts.values() if n == 2) == sum(len(v) for v in w4.values())
        cached = [json.loads(e) for e in redis_events(redis_service.cdc, f"{pipeline}:orders")]
        assert per_key(cached) == again
        first = redis_ids(redis_service.cdc, f"{pipeline}:orders")
        n4 = sum(len(v) for v in w4.values())
        assert first[-n4:] == first[-2 * n4:-n4]  # the same keys again, in the same order
    finally:
        store.close()
        sql(f"DROP DATABASE IF EXISTS {db}")
        admin.close()
        replica_admin.close()


# --------------------------------------------------------------------------- PostgreSQL


@pytest.fixture()
def other_cluster(service_env):
    """A throwaway PostgreSQL cluster of its own (another system identifier), started by the
    project's services script with its own folder and port; yields its CDC connection URI."""
    folder = Path(tempfile.mkdtemp(prefix="tidegate-other-pg-", dir="/var/tmp"))
    os.chmod(folder, 0o755)
    # Not a lane of the suite's servers (TIDEGATE_LANE): a folder and port of its own per worker.
    lane = int(os.environ.get("TIDEGATE_LANE") or 0)
    env = dict(os.environ, TIDEGATE_SERVICES_DIR=str(folder), TIDEGATE_POSTGRES_PORT=str(25491 + 200 * lane),
               TIDEGATE_LANE="")
    r = subprocess.run([sys.executable, str(SERVICES), "up", "postgres"], env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    try:
        lines = subprocess.run([sys.executable, str(SERVICES), "env"], env=env, capture_output=True,
                               text=True, check=True).stdout.splitlines()
        uri = next(ln.split("=", 1)[1].strip("'") for ln in lines
                   if ln.startswith("export AIRFLOW_CONN_CDC_POSTGRES="))
        yield uri
    finally:
        subprocess.run([sys.executable, str(SERVICES), "down", "postgres"], env=env, capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def test_postgres_promotion_halts_accept_gap_resumes_on_the_new_primary(
        airflow_env, postgres, postgres_standby, service_env, kafka_bootstrap, redis_service, other_cluster):
    env, base = airflow_env
    tag = uuid.uuid4().hex[:6]
    table, pipeline = f"pgfo_{tag}", f"pgfo_{tag}"
    env["AIRFLOW_CONN_CDC_PGSRC"] = service_env["AIRFLOW_CONN_CDC_POSTGRES"]
    (base / "pipelines" / f"{pipeline}.yaml").write_text(textwrap.dedent(f"""
        pipeline: {pipeline}
        source: {{kind: postgres, conn_id: cdc_pgsrc, tables: [public.{table}], slot: {pipeline}}}
        spark: {{conn_id: spark_connect}}
        sinks:
          - {{id: events, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}",
              exactly_once: true}}
          - {{id: cache, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:{{table}}"}}
    """))
    primary = psycopg2.connect(postgres.admin_dsn)
    primary.autocommit = True

    def on(conn):
        def execute(stmt: str) -> None:
            with conn.cursor() as c:
                c.execute(stmt)
        return execute

    on(primary)(f"CREATE TABLE {table} (id int PRIMARY KEY, status text)")
    on(primary)(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
    work = Workload(on(primary))
    dag = f"cdc_{pipeline}"
    store = open_store(env["TIDEGATE_CHECKPOINT_STORE"])
    promoted = None
    try:
        rc, log = dags_test(env, dag)  # creates the slot on the primary
        assert rc == 0, log[-3000:]
        work.wave(6, table)
        rc, log = dags_test(env, dag)
        assert rc == 0 and task_ended(log, "deliver"), log[-3000:]
        checkpoint = store.checkpoints.get(pipeline, "events").position
        work.wave(3, table)  # committed on the old primary after the last run: may be missed

        # the standby is promoted and the connection moves to it
        promoted = psycopg2.connect(postgres_standby.admin_dsn)
        promoted.autocommit = True
        deadline = time.monotonic() + 30
        with primary.cursor() as c:
            c.execute(f"SELECT count(*) FROM {table}")
            rows = c.fetchone()[0]
        with promoted.cursor() as c:
            while True:  # the standby has replayed the primary's last write
                c.execute(f"SELECT count(*) FROM {table}")
                if c.fetchone()[0] == rows:
                    break
                assert time.monotonic() < deadline
                time.sleep(0.1)
            c.execute("SELECT pg_promote(true, 30)")
        env["AIRFLOW_CONN_CDC_PGSRC"] = service_env["AIRFLOW_CONN_CDC_POSTGRES_STANDBY"]
        rc, log = dags_test(env, dag)
        assert rc != 0 and "CONTINUITY HALT" in log and "from timeline 1 to 2" in log, log[-3000:]
        [inc] = store.incidents.all(pipeline, unresolved_only=True)
        assert inc.kind == "failover" and inc.from_position == checkpoint
        assert (inc.to_position.system_id, inc.to_position.timeline) == (checkpoint.system_id, 2)

        rc, log = dags_test(env, dag, {"resolve": "accept_gap", "reason": "wave 2 re-sent by the app"})
        assert rc == 0, log[-3000:]
        assert store.incidents.get(inc.id).resolved
        with promoted.cursor() as c:
            c.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                      (pipeline,))
            assert c.fetchone() is not None, "no slot on the new primary"
        new_work = Workload(on(promoted))
        new_work.next_id = 100
        w3 = new_work.wave(7, table)
        rc, log = dags_test(env, dag)
        assert rc == 0 and task_ended(log, "deliver"), log[-3000:]
        changes = kafka_changes(kafka_bootstrap, f"{pipeline}.{table}")
        got = per_key(changes)
        assert {k: v for k, v in got.items() if k >= 100} == w3  # streaming resumed on the new primary
        assert all(v == work.expected[k] for k, v in got.items() if k <= 6)  # wave 1, once
        keys = [ch["idempotency_key"] for ch in changes]
        assert len(keys) == len(set(keys))
        assert sorted(redis_ids(redis_service.cdc, f"{pipeline}:{table}")) == sorted(keys)

        # another cluster behind the same connection: halt, naming both system identifiers
        env["AIRFLOW_CONN_CDC_PGSRC"] = other_cluster
        rc, log = dags_test(env, dag)
        assert rc != 0 and "another PostgreSQL cluster (system identifier" in log, log[-3000:]
        [inc2] = store.incidents.all(pipeline, unresolved_only=True)
        assert inc2.from_position.timeline == 2 and inc2.to_position.system_id != checkpoint.system_id
    finally:
        store.close()
        for conn in (promoted, primary):
            if conn is not None:
                try:
                    with conn.cursor() as c:
                        c.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                                  "WHERE slot_name = %s", (pipeline,))
                finally:
                    conn.close()
        with psycopg2.connect(postgres.admin_dsn) as conn, conn.cursor() as c:
            c.execute(f"DROP TABLE IF EXISTS {table}")
        services_cmd("reset", "postgres_standby")
