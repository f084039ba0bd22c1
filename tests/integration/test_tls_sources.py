"""Sources over TLS, through `airflow dags test` against TLS-only servers (scripts/services):

- `mysql_tls`: MariaDB with ``require_secure_transport=ON``, the CDC user ``REQUIRE X509``;
- `postgres_tls`: PostgreSQL whose pg_hba.conf has only ``hostssl ... clientcert=verify-full``
  lines for TCP.

Both refuse any connection that is not TLS with a client certificate of the test CA, so every
read that succeeds proves the connection it came through used the connection's TLS settings:
the guard and bounds tasks (control connections), the snapshot's chunks (Spark tasks: the log
line says so), the MariaDB log read as two binlog slices in Spark tasks (the log line and the
tasks' notes say so), each run delivered by one more Spark task, the PostgreSQL log (read by
the Spark task that delivers each run on the Connect server).

The MariaDB pipeline spark-submits its deliver task for the snapshot and the first log run (the
one over two binlog files, decoded in Spark tasks); its two other log runs are clients of the
`spark_connect` service, as every run of the PostgreSQL pipeline is, so the connection's TLS
settings are proven to reach Spark tasks both ways (the snapshot's chunks of the PostgreSQL
pipeline are read by the Connect server's Python workers) with two Spark JVM starts fewer.

Per source: a pipeline with ``start: snapshot`` delivers to a Redis stream (the plain `redis`
service), then three log runs; the stream holds every change once, in order per key. Then the
same pipeline with a connection that trusts another CA, and one that names host 127.0.0.1 (the
certificate carries only "localhost") with the host name checked, each with changes waiting:
the guard fails with TlsVerificationError naming the connection, no retry, nothing delivered,
no checkpoint moved, no incident opened, nothing journaled.
"""

from __future__ import annotations

import json
import re
import textwrap
import traceback
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg2
import pymysql
import pytest
from tidegate.store import open_store

from tests.conftest import _service
from tests.integration.airflow_support import (
    dags_test,
    make_airflow_env,
    per_key,
    spark_connect_server,  # noqa: F401 - the spark_connect fixture
    task_ended,
)
from tests.integration.sink_readers import redis_events

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def mysql_tls(service_env):
    return _service("mysql_tls", "cdc_mysql_tls", "cdc_mysql_tls_admin", service_env)


@pytest.fixture(scope="module")
def postgres_tls(service_env):
    return _service("postgres_tls", "cdc_postgres_tls", "cdc_postgres_tls_admin", service_env)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, service_env, mysql_tls, postgres_tls, redis_service, spark_connect) -> dict:
    """Both pipelines at once, each in an Airflow home of its own (migrated once): a run is
    mostly one busy process (Airflow, then the Spark driver), so two at a time on two cores take
    about half the wall time of one after the other. Each test then reports its own pipeline's
    outcome (the exception, with its assertion message, or None)."""
    jobs = {"mariadb": (mariadb_pipeline, mysql_tls), "postgres": (postgres_pipeline, postgres_tls)}
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {name: pool.submit(job, tmp_path_factory.mktemp(f"tls_{name}"), service_env, svc,
                                     redis_service)
                   for name, (job, svc) in jobs.items()}
        return {name: f.exception() for name, f in futures.items()}


def write_spec(base: Path, pipeline: str, source: str, spark_conn: str = "spark_default") -> str:
    (base / "pipelines" / f"{pipeline}.yaml").write_text(textwrap.dedent(f"""
        pipeline: {pipeline}
        tenant: tls
        source: {{{source}, start: snapshot}}
        snapshot: {{chunk_rows: 2, parallelism: 2}}
        spark: {{conn_id: {spark_conn}, conf: {{spark.tidegate.delivery: gathered}}}}
        sinks:
          - {{id: cache, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:{{table}}"}}
    """))
    return f"cdc_{pipeline}"


def delivered(redis_service, stream: str) -> list[dict]:
    return [json.loads(e) for e in redis_events(redis_service.cdc, stream)]


# What every pipeline's workload does, after a snapshot of rows 1..3 ('new'): three rounds of
# changes, one log run each. The MariaDB round 1 spans two binlog files (two Spark slices; the
# specs gather them, so each is read by a Spark task of its own over TLS).
ROUNDS = [
    ["INSERT INTO {t} VALUES (4, 'new')", "UPDATE {t} SET status = 'paid' WHERE id = 1", "{flush}",
     "UPDATE {t} SET status = 'paid' WHERE id = 2", "DELETE FROM {t} WHERE id = 3"],
    ["UPDATE {t} SET status = 'shipped' WHERE id = 1", "INSERT INTO {t} VALUES (5, 'new')"],
    ["DELETE FROM {t} WHERE id = 4", "UPDATE {t} SET status = 'paid' WHERE id = 5"],
]
EXPECTED = {
    1: [("r", "new"), ("u", "paid"), ("u", "shipped")],
    2: [("r", "new"), ("u", "paid")],
    3: [("r", "new"), ("d", None)],
    4: [("c", "new"), ("d", None)],
    5: [("c", "new"), ("u", "paid")],
}
WAITING = ["UPDATE {t} SET status = 'lost?' WHERE id = 1"]  # changes the failing runs must not deliver


def dags_test_kept(env: dict, dag: str) -> tuple[int, str]:
    """`airflow dags test`, its output also kept in the test's folder for a post-mortem."""
    rc, log = dags_test(env, dag)
    logs = Path(env["AIRFLOW_HOME"]).parent / "runs"
    logs.mkdir(exist_ok=True)
    (logs / f"{dag}-{len(list(logs.glob(dag + '-*')))}.log").write_text(log)
    return rc, log


def run_pipeline_over_tls(env: dict, dag: str, pipeline: str, stream: str, sql: Callable[[str], None],
                          table: str, redis_service, flush: str,
                          after_first_round: Callable[[], None] | None = None) -> list[str]:
    """The snapshot run and three log runs (``after_first_round`` called between the first and
    the second); returns their logs."""
    logs = []
    rc, log = dags_test_kept(env, dag)
    assert rc == 0 and task_ended(log, "deliver"), log[-4000:]
    # the chunks read by Spark tasks side by side and delivered by one more (the driver relogs its log)
    for line in (rf"pipeline {pipeline}: \d+ part\(s\) read by Spark tasks side by side",
                 rf"\[Spark task [0-9:.]+ UTC\] pipeline {pipeline}: snapshot \S+: reading chunks"):
        assert re.search(line, log), log[-4000:]
    logs.append(log)
    assert per_key(delivered(redis_service, stream)) == {k: [("r", "new")] for k in (1, 2, 3)}
    for stmts in ROUNDS:
        for stmt in stmts:
            if stmt == "{flush}":
                if flush:
                    sql(flush)
                continue
            sql(stmt.format(t=table))
        rc, log = dags_test_kept(env, dag)
        assert rc == 0 and task_ended(log, "deliver"), log[-4000:]
        logs.append(log)
        if len(logs) == 2 and after_first_round:
            after_first_round()
    changes = delivered(redis_service, stream)
    assert per_key(changes) == EXPECTED
    keys = [c["idempotency_key"] for c in changes]
    assert len(keys) == len(set(keys)) == 11
    return logs


def fails_closed(env: dict, dag: str, pipeline: str, conn_id: str, bad: dict, stream: str,
                 redis_service) -> str:
    """Run the DAG with connection ``conn_id`` replaced by ``bad``: the guard fails with the
    named error and nothing moves. Returns the run's log."""
    store = open_store(env["TIDEGATE_CHECKPOINT_STORE"])
    try:
        checkpoints = {s: (r.version, r.position) for s, r in store.checkpoints.current(pipeline).items()}
        journal = len(store.runs.entries(pipeline))
    finally:
        store.close()
    before = redis_events(redis_service.cdc, stream)
    rc, log = dags_test_kept({**env, "AIRFLOW_CONN_" + conn_id.upper(): json.dumps(bad)}, dag)
    assert rc != 0, log[-4000:]
    assert f"TlsVerificationError: connection '{conn_id}': the TLS certificate of the server" in log, \
        log[-4000:]
    assert "up_for_retry" not in log.lower() and "try_number=2" not in log, log[-4000:]  # no retry
    assert not task_ended(log, "bounds") and not task_ended(log, "deliver"), log[-4000:]
    assert bad.get("password") and bad["password"] not in log
    assert redis_events(redis_service.cdc, stream) == before  # nothing delivered
    store = open_store(env["TIDEGATE_CHECKPOINT_STORE"])
    try:
        assert {s: (r.version, r.position) for s, r in store.checkpoints.current(pipeline).items()} \
            == checkpoints
        assert store.incidents.all(pipeline) == []
        assert len(store.runs.entries(pipeline)) == journal
    finally:
        store.close()
    return log


def mariadb_pipeline(base: Path, service_env: dict, mysql_tls, redis_service) -> None:
    env = make_airflow_env(base, service_env)
    tag = uuid.uuid4().hex[:6]
    db, pipeline = f"tls_{tag}", f"tls_my_{tag}"
    table, stream = f"{db}.orders", f"{pipeline}:orders"
    source = f"kind: mysql, conn_id: cdc_mysql_tls, tables: [{table}], server_id: 48600"
    dag = write_spec(base, pipeline, source)
    a = mysql_tls.admin
    ssl_files = a.extra["ssl"]
    admin = pymysql.connect(host=a.host, port=a.port, user=a.login, password=a.password, autocommit=True,
                            ssl_ca=ssl_files["ca"], ssl_cert=ssl_files["cert"], ssl_key=ssl_files["key"],
                            ssl_verify_cert=True, ssl_verify_identity=True)

    def sql(stmt: str) -> None:
        with admin.cursor() as c:
            c.execute(stmt)

    try:
        sql(f"CREATE DATABASE {db}")
        sql(f"CREATE TABLE {table} (id INT PRIMARY KEY, status VARCHAR(20))")
        sql(f"INSERT INTO {table} VALUES (1, 'new'), (2, 'new'), (3, 'new')")
        # The snapshot and the first log run spark-submit; the two other log runs are Spark
        # Connect clients (the same driver-side read of one slice, without a JVM start each).
        logs = run_pipeline_over_tls(env, dag, pipeline, stream, sql, table, redis_service,
                                     flush="FLUSH BINARY LOGS", after_first_round=lambda: write_spec(
                                         base, pipeline, source, spark_conn="spark_connect"))
        # The round over two binlog files was decoded by Spark tasks, over TLS (the server
        # refuses anything else), with the connection the driver shipped them, and delivered by
        # one more (the run's job of two stages).
        assert f"pipeline {pipeline}: 2 part(s) read by Spark tasks side by side" in logs[1], logs[1][-4000:]
        notes = re.findall(rf"tidegate: pipeline {pipeline} slice [12]/2: ", logs[1])
        assert len(notes) >= 2, logs[1][-4000:]
        assert all("spark-submit" in log and "Spark Connect client" not in log for log in logs[:2]), \
            logs[1][-4000:]
        assert all("as a Spark Connect client of" in log for log in logs[2:]), logs[2][-4000:]

        for stmt in WAITING:
            sql(stmt.format(t=table))
        cdc = json.loads(service_env["AIRFLOW_CONN_CDC_MYSQL_TLS"])
        other_ca = {"ssl": {**cdc["extra"]["ssl"], "ca": str(Path(service_env["TIDEGATE_TLS_DIR"]) /
                                                             "other-ca.crt")}}
        # check_hostname is on in the service's extra
        wrong_ca_and_wrong_host_fail_closed(env, dag, pipeline, "cdc_mysql_tls", cdc, other_ca, stream,
                                            redis_service)
    finally:
        sql(f"DROP DATABASE IF EXISTS {db}")
        admin.close()


def postgres_pipeline(base: Path, service_env: dict, postgres_tls, redis_service) -> None:
    env = make_airflow_env(base, service_env)
    tag = uuid.uuid4().hex[:6]
    table = pipeline = f"tls_pg_{tag}"
    stream = f"{pipeline}:{table}"
    dag = write_spec(base, pipeline, f"kind: postgres, conn_id: cdc_postgres_tls, "
                                     f"tables: [public.{table}], slot: {pipeline}",
                     spark_conn="spark_connect")
    a = postgres_tls.admin
    admin = psycopg2.connect(host=a.host, port=a.port, dbname=a.schema, user=a.login, password=a.password,
                             **a.extra)
    admin.autocommit = True

    def sql(stmt: str) -> None:
        with admin.cursor() as c:
            c.execute(stmt)

    try:
        sql(f"CREATE TABLE {table} (id int PRIMARY KEY, status text)")
        sql(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
        sql(f"INSERT INTO {table} VALUES (1, 'new'), (2, 'new'), (3, 'new')")
        logs = run_pipeline_over_tls(env, dag, pipeline, stream, sql, table, redis_service, flush="")
        # The slot's one slice: one Spark task on the Connect server reads and delivers it, over
        # TLS (the server takes nothing else), with the connection the deliver task shipped it.
        assert all(f"pipeline {pipeline}: delivered" in log and "by a Spark task on the server" in log
                   for log in logs[1:]), logs[1][-4000:]

        for stmt in WAITING:
            sql(stmt.format(t=table))
        cdc = json.loads(service_env["AIRFLOW_CONN_CDC_POSTGRES_TLS"])
        other_ca = {**cdc["extra"],
                    "sslrootcert": str(Path(service_env["TIDEGATE_TLS_DIR"]) / "other-ca.crt")}
        # sslmode verify-full in the service's extra
        wrong_ca_and_wrong_host_fail_closed(env, dag, pipeline, "cdc_postgres_tls", cdc, other_ca, stream,
                                            redis_service)
    finally:
        sql(f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            f"WHERE slot_name = '{pipeline}'")
        sql(f"DROP TABLE IF EXISTS {table}")
        admin.close()


def wrong_ca_and_wrong_host_fail_closed(env, dag, pipeline, conn_id, cdc, other_ca_extra, stream,
                                        redis_service) -> None:
    """The pipeline's connection trusting another CA, then naming a host its server's certificate
    does not carry: each run fails closed with the named error."""
    log = fails_closed(env, dag, pipeline, conn_id, {**cdc, "extra": other_ca_extra}, stream, redis_service)
    assert "is not signed by the CA the connection trusts" in log, log[-4000:]
    log = fails_closed(env, dag, pipeline, conn_id, {**cdc, "host": "127.0.0.1"}, stream, redis_service)
    assert "does not carry the connection's host '127.0.0.1'" in log, log[-4000:]


def failure_text(exc: BaseException | None) -> str:
    return "".join(traceback.format_exception(exc))[-6000:] if exc else ""


def test_mariadb_x509_snapshot_and_three_log_runs_then_wrong_ca_and_wrong_host_fail_closed(outcomes):
    assert outcomes["mariadb"] is None, failure_text(outcomes["mariadb"])


def test_postgres_clientcert_snapshot_and_three_log_runs_then_wrong_ca_and_wrong_host_fail_closed(outcomes):
    assert outcomes["postgres"] is None, failure_text(outcomes["postgres"])
