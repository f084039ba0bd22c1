"""The Delta sink as users meet it, through `airflow dags test` against real MariaDB and
PostgreSQL, with two Delta sinks per pipeline: ``merged`` (mode merge) and ``log`` (mode changelog).

Each pipeline starts with a snapshot, then runs with inserts, updates (some changing the primary
key) and deletes. After every run the merged table equals the source table row by row (every
column, compared in the envelope's JSON form), and the changelog holds every change exactly once
(no idempotency key twice; as many rows per op as the writes made).

MariaDB then goes through the faults: the deliver task SIGKILLed before any Delta commit of its
sub-batch (when the first data file of the run appears), and SIGKILLed after the Delta commits and
before the checkpoint-store write (another process holds the SQLite store's write lock from the first
data commit, so the run is stopped right there, and the kill comes once both checkpoint tables show
the commit); each rerun leaves the tables exact. Then a replay of an earlier run and a rewind of
both sinks to an older version: the merged table stays exact, and the changelog shows no
re-delivery (the sink skips what its checkpoint table says the tables hold; docs/operations.md).
"""

from __future__ import annotations

import collections
import datetime as dt
import random
import re
import sqlite3
import subprocess
import textwrap
import uuid
from pathlib import Path

import psycopg2
import pymysql
import pytest
from tidegate.events import encode_value
from tidegate.store import open_store

from tests.integration.airflow_support import (
    VENV_BIN,
    dags_test,
    dags_test_killed_when,
    make_airflow_env,
    task_ended,
)

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory, service_env, mysql, postgres):
    base = tmp_path_factory.mktemp("delta")
    return make_airflow_env(base, service_env), base


@pytest.fixture(scope="module")
def spark():
    """A reader of the tables (its own JVM; the deliver task's job writes them)."""
    from pyspark.sql import SparkSession
    from tidegate.sinks.delta.jars import spark_conf

    b = (SparkSession.builder.master("local[1]").appName("tidegate-delta-e2e")
         .config("spark.ui.enabled", "false"))
    for k, v in {**spark_conf(), "spark.sql.shuffle.partitions": "1"}.items():
        b = b.config(k, v)
    s = b.getOrCreate()
    yield s
    s.stop()


def spec_text(pipeline: str, source: str, lake: Path) -> str:
    return textwrap.dedent(f"""
        pipeline: {pipeline}
        source: {source}
        batch: {{max_events: 5000}}
        sinks:
          - {{id: merged, kind: delta, mode: merge, path: "{lake}/{{pipeline}}/merged/{{schema}}/{{table}}"}}
          - {{id: log, kind: delta, mode: changelog, path: "{lake}/{{pipeline}}/log/{{schema}}/{{table}}"}}
    """)


class Lake:
    """The pipeline's Delta tables as a reader sees them."""

    def __init__(self, spark, lake: Path, pipeline: str, schema: str, table: str = "items"):
        self.spark = spark
        self.merged = lake / pipeline / "merged" / schema / table
        self.log = lake / pipeline / "log" / schema / table
        self.checkpoints = [lake / pipeline / s / "_tidegate" / f"checkpoint_{s}" for s in ("merged", "log")]

    def rows(self) -> dict:
        return {r["id"]: r.asDict() for r in self.spark.read.format("delta").load(str(self.merged)).collect()}

    def changelog(self) -> list:
        return self.spark.read.format("delta").load(str(self.log)).select("idempotency_key", "op").collect()

    @staticmethod
    def commits(table: Path) -> int:
        return len(list((table / "_delta_log").glob("*.json"))) if (table / "_delta_log").exists() else 0

    @staticmethod
    def data_files(table: Path) -> int:
        return sum(1 for p in table.rglob("*.parquet") if "_delta_log" not in p.parts)


class Writes:
    """Inserts, updates, key changes and deletes of the ``items`` table; counts the changelog rows
    each makes (a key change is a delete and a create)."""

    def __init__(self, execute, table: str, row_sql, first_id: int = 1):
        self.execute, self.table, self.row_sql = execute, table, row_sql
        self.rng = random.Random(11)
        self.live: list[int] = []
        self.next_id = first_id
        self.ops: collections.Counter = collections.Counter()
        self.moved: list[int] = []  # the old keys of primary-key changes

    def insert(self, n: int) -> None:
        for _ in range(n):
            self.execute(f"INSERT INTO {self.table} VALUES ({self.row_sql(self.next_id)})")
            self.live.append(self.next_id)
            self.next_id += 1
            self.ops["c"] += 1

    def wave(self) -> None:
        self.insert(6)
        for k in self.rng.sample(self.live, 6):
            self.execute(f"UPDATE {self.table} SET qty = qty + 1, name = CONCAT(name, '+') WHERE id = {k}")
            self.ops["u"] += 1
        for k in self.rng.sample(self.live, 2):
            self.execute(f"UPDATE {self.table} SET id = {self.next_id} WHERE id = {k}")
            self.moved.append(k)
            self.live[self.live.index(k)] = self.next_id
            self.next_id += 1
            self.ops.update({"d": 1, "c": 1})
        for k in self.rng.sample(self.live, 3):
            self.execute(f"DELETE FROM {self.table} WHERE id = {k}")
            self.live.remove(k)
            self.ops["d"] += 1


TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?$")


def same_value(v):
    """A timestamp as its time: the PostgreSQL source writes fractional seconds without trailing
    zeros (.00001), Python's isoformat with six digits (.000010); both are the same instant."""
    return dt.datetime.fromisoformat(v) if isinstance(v, str) and TIMESTAMP.match(v) else v


def check(lake: Lake, source_rows: dict, ops: collections.Counter) -> None:
    got = lake.rows()
    assert sorted(got) == sorted(source_rows)
    for k, row in source_rows.items():
        have = {c: same_value(v) for c, v in got[k].items()}
        assert have == {c: same_value(v) for c, v in row.items()}, (k, got[k], row)
    log = lake.changelog()
    keys = collections.Counter(r["idempotency_key"] for r in log)
    assert [k for k, n in keys.items() if n > 1] == []
    assert collections.Counter(r["op"] for r in log) == ops


def run_ok(env, dag: str, conf: dict | None = None) -> str:
    rc, log = dags_test(env, dag, conf)
    assert rc == 0 and task_ended(log, "deliver"), log[-4000:]
    return log


# --------------------------------------------------------------------------- MariaDB

MARIADB_TABLE = ("id INT PRIMARY KEY, name VARCHAR(40), price DECIMAL(10,2), qty BIGINT, ratio DOUBLE, "
                 "flag TINYINT, d DATE, ts DATETIME(6), t TIME, b VARBINARY(16), e ENUM('x','y'), "
                 "note TEXT NULL")


def mariadb_row(i: int) -> str:
    return (f"{i}, 'n{i}', {i}.25, {i * 1000}, {i / 8}, {i % 2}, '2026-01-{1 + i % 28:02d}', "
            f"'2026-02-03 04:05:{i % 60:02d}.{i:06d}', '{i % 24:02d}:30:00', UNHEX('{i:04x}ff'), "
            f"'{'xy'[i % 2]}', {'NULL' if i % 3 == 0 else repr(f'note {i}')}")


def test_mariadb_snapshot_changes_kills_replay_and_rewind(airflow_env, spark, mysql):
    env, base = airflow_env
    tag = uuid.uuid4().hex[:6]
    db = pipeline = f"dlm_{tag}"
    dag = f"cdc_{pipeline}"
    (base / "pipelines" / f"{pipeline}.yaml").write_text(spec_text(
        pipeline, f"{{kind: mysql, conn_id: cdc_mysql, tables: [{db}.items], "
                  f"server_id: {48700 + random.randint(0, 99)}, start: snapshot}}", base / "lake"))
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))

    def sql(stmt: str) -> None:
        with admin.cursor() as c:
            c.execute(stmt)

    def source_rows() -> dict:
        with admin.cursor(pymysql.cursors.DictCursor) as c:
            c.execute(f"SELECT * FROM {db}.items")
            return {r["id"]: {k: encode_value(v) for k, v in r.items()} for r in c.fetchall()}

    lake = Lake(spark, base / "lake", pipeline, db)
    store = open_store(env["TIDEGATE_CHECKPOINT_STORE"])
    try:
        sql(f"CREATE DATABASE {db}")
        sql(f"CREATE TABLE {db}.items ({MARIADB_TABLE})")
        w = Writes(sql, f"{db}.items", mariadb_row)
        w.insert(40)
        snapshot_rows = len(w.live)
        w.ops.clear()
        run_ok(env, dag)
        check(lake, source_rows(), collections.Counter({"r": snapshot_rows}))

        # killed before any Delta commit of the sub-batch: at its first new data file
        w.wave()
        commits = [Lake.commits(t) for t in (lake.merged, lake.log)]
        files = [Lake.data_files(t) for t in (lake.merged, lake.log)]
        dags_test_killed_when(env, dag, lambda: any(
            Lake.data_files(t) > n for t, n in zip((lake.merged, lake.log), files, strict=True)))
        assert [Lake.commits(t) for t in (lake.merged, lake.log)] == commits  # nothing committed
        run_ok(env, dag)
        check(lake, source_rows(), w.ops + collections.Counter({"r": snapshot_rows}))

        # killed after the Delta commits, before the store write
        w.wave()
        store_path = env["TIDEGATE_CHECKPOINT_STORE"].removeprefix("sqlite:///")
        before = {s: store.checkpoints.get(pipeline, s).version for s in ("merged", "log")}
        marks = [Lake.commits(t) for t in lake.checkpoints]
        data = [Lake.commits(t) for t in (lake.merged, lake.log)]
        lock = sqlite3.connect(store_path, isolation_level=None, timeout=30)

        def committed_not_stored() -> bool:
            if not lock.in_transaction and any(
                    Lake.commits(t) > n for t, n in zip((lake.merged, lake.log), data, strict=True)):
                lock.execute("BEGIN IMMEDIATE")  # from now on the run cannot write the store
            return lock.in_transaction and all(
                Lake.commits(t) > n for t, n in zip(lake.checkpoints, marks, strict=True))

        try:
            dags_test_killed_when(env, dag, committed_not_stored)
        finally:
            lock.rollback() if lock.in_transaction else None
            lock.close()
        assert {s: store.checkpoints.get(pipeline, s).version for s in ("merged", "log")} == before
        run_ok(env, dag)  # adopts both sinks' records: nothing is written again
        check(lake, source_rows(), w.ops + collections.Counter({"r": snapshot_rows}))
        for s in ("merged", "log"):  # the rerun took the records the killed run left
            after = [h.kind for h in store.checkpoints.history(pipeline, s) if h.version > before[s]]
            assert after[0] == "adopt", after

        # a replay of the run that delivered the first wave, and a rewind past two waves
        runs = [e for e in store.runs.entries(pipeline) if e.status == "success"]
        run_ok(env, dag, {"mode": "replay", "replay_of": runs[1].run_id})
        check(lake, source_rows(), w.ops + collections.Counter({"r": snapshot_rows}))
        for sid in ("merged", "log"):
            version = store.checkpoints.history(pipeline, sid)[1].version
            r = subprocess.run([str(VENV_BIN / "tidegate"), "checkpoints", "rewind", pipeline, sid,
                                "--to-version", str(version), "--reason", "test rewind"],
                               env=env, capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
        w.wave()
        run_ok(env, dag)
        check(lake, source_rows(), w.ops + collections.Counter({"r": snapshot_rows}))
    finally:
        sql(f"DROP DATABASE IF EXISTS {db}")
        admin.close()
        store.close()


# --------------------------------------------------------------------------- PostgreSQL

PG_TABLE = ("id int PRIMARY KEY, name text, price numeric(10,2), qty bigint, ratio double precision, "
            "flag boolean, d date, ts timestamp, b bytea, u uuid, note text")


def pg_row(i: int) -> str:
    return (f"{i}, 'n{i}', {i}.25, {i * 1000}, {i / 8}, {'true' if i % 2 else 'false'}, "
            f"'2026-01-{1 + i % 28:02d}', '2026-02-03 04:05:{i % 60:02d}.{i:06d}', '\\x{i:04x}ff', "
            f"'{uuid.UUID(int=i)}', {'NULL' if i % 3 == 0 else repr(f'note {i}')}")


def test_postgres_snapshot_then_changes(airflow_env, spark, postgres):
    env, base = airflow_env
    tag = uuid.uuid4().hex[:6]
    schema = pipeline = f"dlp_{tag}"
    dag = f"cdc_{pipeline}"
    (base / "pipelines" / f"{pipeline}.yaml").write_text(spec_text(
        pipeline, f"{{kind: postgres, conn_id: cdc_postgres, slot: {pipeline}, tables: [{schema}.items], "
                  f"start: snapshot}}", base / "lake"))
    admin = psycopg2.connect(postgres.admin_dsn)
    admin.autocommit = True

    def sql(stmt: str) -> None:
        with admin.cursor() as c:
            c.execute(stmt)

    def source_rows() -> dict:
        with admin.cursor() as c:
            c.execute(f"SELECT * FROM {schema}.items")
            cols = [d[0] for d in c.description]
            return {r[0]: {k: encode_value(v) for k, v in zip(cols, r, strict=True)} for r in c.fetchall()}

    lake = Lake(spark, base / "lake", pipeline, schema)
    try:
        sql(f"CREATE SCHEMA {schema}")
        sql(f"CREATE TABLE {schema}.items ({PG_TABLE})")
        sql(f"GRANT USAGE ON SCHEMA {schema} TO {postgres.cdc.login}")
        sql(f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {postgres.cdc.login}")
        w = Writes(sql, f"{schema}.items", pg_row)
        w.execute = lambda s: sql(s.replace("CONCAT(name, '+')", "name || '+'"))
        w.insert(40)
        snapshot_rows = len(w.live)
        w.ops.clear()
        run_ok(env, dag)
        check(lake, source_rows(), collections.Counter({"r": snapshot_rows}))
        w.wave()
        run_ok(env, dag)
        check(lake, source_rows(), w.ops + collections.Counter({"r": snapshot_rows}))
        assert w.moved and not set(w.moved) & set(lake.rows()), "a key change left its old key behind"
    finally:
        sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        sql("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = "
            f"'{pipeline}' AND NOT active")
        admin.close()
