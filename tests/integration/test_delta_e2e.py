"""The Delta sink as users meet it, through `airflow dags test` against real MariaDB and
PostgreSQL, with two Delta sinks per pipeline: ``merged`` (mode merge) and ``log`` (mode changelog).

The deliver tasks are Spark Connect clients of the shared `spark_connect` server (``spark.conn_id:
spark_connect``; the sinks write through sessions of their own on it), but for one: MariaDB's
kill-before-commit run spark-submits, so that path stays proven, and it is the case that needs the
writer itself to die (a Connect server may finish a write whose client was killed). The test reads
the tables through the same server.

Each pipeline starts with a snapshot, then runs with inserts, updates (some changing the primary
key) and deletes. After every run the merged table equals the source table row by row (every
column, compared in the envelope's JSON form, over every column type of the sources' type tests:
MariaDB JSON, SET, ENUM, BIT, YEAR, TIME, DECIMAL, BLOB...; PostgreSQL timestamptz, jsonb, int[],
text[], numeric, uuid, bytea, interval...), and the changelog holds every change exactly once (no
idempotency key twice; as many rows per op as the writes made).

MariaDB then goes through the faults: the deliver task SIGKILLed before any Delta commit of its
sub-batch (when the first data file of the run appears; spark-submit: the kill takes the Spark
driver writing it), and SIGKILLed after the Delta commits and before the checkpoint-store write
(Connect: the server made the commits; another process holds the SQLite store's write lock from the
first data commit, so the task is stopped right there, and the kill comes once both checkpoint tables
show the commit); each rerun leaves the tables exact. Then a replay of an earlier run and a rewind of
both sinks to an older version: the merged table stays exact, and the changelog shows no
re-delivery (the sink skips what its checkpoint table says the tables hold; docs/operations.md).
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import os
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
    spark_connect_server,  # noqa: F401 - the spark_connect fixture
    task_ended,
)

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory, service_env, mysql, postgres, spark_connect):
    base = tmp_path_factory.mktemp("delta")
    return make_airflow_env(base, service_env), base


@pytest.fixture(scope="module")
def spark(service_env, spark_connect):
    """A reader of the tables: a session on the shared Spark Connect server (no JVM of its own)."""
    from pyspark.sql import SparkSession

    # A Connect session marks the whole process as Spark Connect (SPARK_CONNECT_MODE_ENABLED, which
    # pyspark's functions dispatch on) and stop() does not unmark it: the later test modules' local
    # sessions need it gone.
    marked = "SPARK_CONNECT_MODE_ENABLED" in os.environ
    conn = json.loads(service_env["AIRFLOW_CONN_SPARK_CONNECT"])
    s = SparkSession.builder.remote(f"{conn['host']}:{conn['port']}").appName("tidegate-delta-e2e").create()
    try:
        if "Delta" not in (s.conf.get("spark.sql.extensions", "") or ""):
            pytest.fail("the spark_connect server runs without Delta Lake: it was started before the jars "
                        "were in jars/delta; restart it (scripts/services down spark_connect)", pytrace=False)
        yield s
    finally:
        s.stop()
        if not marked:
            os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)


def spec_text(pipeline: str, source: str, lake: Path, spark_conn: str = "spark_connect") -> str:
    return textwrap.dedent(f"""
        pipeline: {pipeline}
        source: {source}
        batch: {{max_events: 5000}}
        spark: {{conn_id: {spark_conn}}}
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


class MariaDb:
    """The test's admin connection to MariaDB, on the test's database ``db``."""

    def __init__(self, mysql, db: str):
        self.db = db
        self.admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))

    def sql(self, stmt: str) -> None:
        with self.admin.cursor() as c:
            c.execute(stmt)

    def rows(self, table: str = "items", value=lambda column, v: v) -> dict:
        """The table's rows by id, each value as ``value`` gives it."""
        with self.admin.cursor(pymysql.cursors.DictCursor) as c:
            c.execute(f"SELECT * FROM {self.db}.{table}")
            return {r["id"]: {k: value(k, v) for k, v in r.items()} for r in c.fetchall()}

    def close(self) -> None:
        self.sql(f"DROP DATABASE IF EXISTS {self.db}")
        self.admin.close()


TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d:\d\d)?$")


def same_value(v):
    """A timestamp as its time: the PostgreSQL source writes fractional seconds without trailing
    zeros (.00001), Python's isoformat with six digits (.000010); both are the same instant (and a
    timestamptz the same instant in any offset)."""
    return dt.datetime.fromisoformat(v) if isinstance(v, str) and TIMESTAMP.match(v) else v


def table_value(v, source):
    """What the merged table holds for an envelope value that is a JSON array or object (a SET, an
    array, a jsonb): a string column with that JSON's text (docs/operations.md, "Delta Lake sink")."""
    return json.loads(v) if isinstance(source, (list, dict)) and isinstance(v, str) else v


def check(lake: Lake, source_rows: dict, ops: collections.Counter) -> None:
    got = lake.rows()
    assert sorted(got) == sorted(source_rows)
    for k, row in source_rows.items():
        have = {c: same_value(table_value(v, row.get(c))) for c, v in got[k].items()}
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
                 "flag TINYINT, d DATE, ts DATETIME(6), t TIME(3), b VARBINARY(16), e ENUM('x','y'), "
                 "note TEXT NULL, j JSON, s SET('a','b','c'), bt BIT(5), y YEAR, bl BLOB, "
                 "big DECIMAL(30,10)")
MARIADB_BITS = {"bt": 5}  # BIT columns and their width: the envelope writes n 0/1 digits


def mariadb_value(column: str, v):
    """A value as the envelope holds it, from what pymysql returns: BIT(n) as n 0/1 digits, a SET
    (pymysql's text "a,c") as the sorted list of its members, anything else by encode_value."""
    if v is None:
        return None
    if column in MARIADB_BITS:
        return format(int.from_bytes(v, "big"), f"0{MARIADB_BITS[column]}b")
    if column == "s":
        return sorted(x for x in (v.split(",") if isinstance(v, str) else v) if x)
    return encode_value(v)


def mariadb_row(i: int) -> str:
    return (f"{i}, 'n{i}', {i}.25, {i * 1000}, {i / 8}, {i % 2}, '2026-01-{1 + i % 28:02d}', "
            f"'2026-02-03 04:05:{i % 60:02d}.{i:06d}', "
            f"'{'-' if i % 5 == 0 else ''}{i % 24 + 30:02d}:30:00.{i:03d}', UNHEX('{i:04x}ff'), "
            f"'{'xy'[i % 2]}', {'NULL' if i % 3 == 0 else repr(f'note {i}')}, "
            f"{'NULL' if i % 4 == 0 else repr(json.dumps({'k': i, 'l': [1, 2.5, 'x'], 'n': None}))}, "
            f"'{['', 'a', 'a,c', 'b,c'][i % 4]}', b'{i % 32:05b}', {1901 + i % 254}, "
            f"UNHEX('{i:06x}00ff'), '-{i % 9}2345678901234567890.0123456789'")


def test_mariadb_snapshot_changes_kills_replay_and_rewind(airflow_env, spark, mysql):
    env, base = airflow_env
    tag = uuid.uuid4().hex[:6]
    db = pipeline = f"dlm_{tag}"
    dag = f"cdc_{pipeline}"
    spec_file = base / "pipelines" / f"{pipeline}.yaml"
    source = (f"{{kind: mysql, conn_id: cdc_mysql, tables: [{db}.items], "
              f"server_id: {48700 + random.randint(0, 99)}, start: snapshot}}")
    spec_file.write_text(spec_text(pipeline, source, base / "lake"))
    maria = MariaDb(mysql, db)
    sql = maria.sql

    def source_rows() -> dict:
        return maria.rows(value=mariadb_value)

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

        # killed before any Delta commit of the sub-batch: at its first new data file. Through
        # spark-submit: the kill takes the driver that writes (a Connect server may finish a
        # write whose client died, and commit it).
        w.wave()
        commits = [Lake.commits(t) for t in (lake.merged, lake.log)]
        files = [Lake.data_files(t) for t in (lake.merged, lake.log)]
        spec_file.write_text(spec_text(pipeline, source, base / "lake", spark_conn="spark_default"))
        killed = dags_test_killed_when(env, dag, lambda: any(
            Lake.data_files(t) > n for t, n in zip((lake.merged, lake.log), files, strict=True)), timeout=900)
        assert "Spark Connect client" not in killed  # the spark-submit path
        spec_file.write_text(spec_text(pipeline, source, base / "lake"))
        assert [Lake.commits(t) for t in (lake.merged, lake.log)] == commits  # nothing committed
        log = run_ok(env, dag)
        assert "as a Spark Connect client" in log
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
            # each checkpoint table: the run's claim (when it opens the sink), then its record
            return lock.in_transaction and all(
                Lake.commits(t) > n + 1 for t, n in zip(lake.checkpoints, marks, strict=True))

        try:
            dags_test_killed_when(env, dag, committed_not_stored, timeout=900)
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
        maria.close()
        store.close()


# --------------------------------------------------------------------------- PostgreSQL

PG_TABLE = ("id int PRIMARY KEY, name text, price numeric(10,2), qty bigint, ratio double precision, "
            "flag boolean, d date, ts timestamp, b bytea, u uuid, note text, tz timestamptz, jb jsonb, "
            "ia int[], ta text[], big numeric, iv interval")


def pg_row(i: int) -> str:
    return (f"{i}, 'n{i}', {i}.25, {i * 1000}, {i / 8}, {'true' if i % 2 else 'false'}, "
            f"'2026-01-{1 + i % 28:02d}', '2026-02-03 04:05:{i % 60:02d}.{i:06d}', '\\x{i:04x}ff', "
            f"'{uuid.UUID(int=i)}', {'NULL' if i % 3 == 0 else repr(f'note {i}')}, "
            f"'2026-02-03 04:05:{i % 60:02d}.{i:03d}+0{i % 6}:30', "
            f"{'NULL' if i % 4 == 0 else repr(json.dumps({'k': i, 'l': [1, 2.5, 'x'], 'n': None}))}, "
            f"ARRAY[{i}, NULL, {-i}], ARRAY['a b', 'c,d', NULL, 'q\"{i}', '{{y}}'], "
            f"{i}12345678901234567890.{i:04d}5, '{i} days {i % 24:02d}:03:04.5'")


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
            # the tables' interval is PostgreSQL's text of it (the envelope's): read it as text
            c.execute(f"SELECT *, iv::text AS iv FROM {schema}.items")
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


# --------------------------------------------------------------------------- a resnapshot


def tidegate_run(env, pipeline: str, *args: str) -> dict:
    r = subprocess.run([str(VENV_BIN / "tidegate"), "run", pipeline, *args], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    text = r.stdout  # the report, a JSON object starting on a line "{" (after any log lines)
    return json.loads(text if text.startswith("{") else text[text.rindex("\n{\n") + 1:])


def test_a_resnapshot_of_a_healthy_pipeline_reaches_both_tables_once(airflow_env, spark, mysql):
    """A resnapshot of a healthy pipeline hands off at the sinks' checkpoint, so its chunks lie
    just before what the tables cover; the sink skipped them as held (the changelog got no `r` row
    and the merged table was not reloaded). Found by the campaign (seed 5781, SNAPSHOTS=resnapshot).
    Now: the changelog gets every row as `r` once, a merged table damaged by a consumer is reloaded
    to the source's rows, and a replay of the resnapshot's run writes nothing. A table added to the
    pipeline (a snapshot of its own, handing off at the checkpoint) was skipped the same way: it
    reaches both tables too. (The marks' rule, case by case: tests/unit/test_delta_ledger.py.)"""
    env, base = airflow_env
    db = pipeline = f"dlr_{uuid.uuid4().hex[:6]}"
    server_id = 48800 + random.randint(0, 99)

    def source(tables: str) -> str:
        return (f"{{kind: mysql, conn_id: cdc_mysql, tables: [{tables}], server_id: {server_id}, "
                f"start: snapshot}}")

    spec_file = base / "pipelines" / f"{pipeline}.yaml"
    spec_file.write_text(spec_text(pipeline, source(f"{db}.items"), base / "lake"))
    maria = MariaDb(mysql, db)
    sql, source_rows = maria.sql, maria.rows

    lake = Lake(spark, base / "lake", pipeline, db)

    def ops(lake: Lake = lake) -> collections.Counter:
        log = lake.changelog()
        keys = collections.Counter(r["idempotency_key"] for r in log)
        assert [k for k, n in keys.items() if n > 1] == []
        return collections.Counter(r["op"] for r in log)

    try:
        sql(f"CREATE DATABASE {db}")
        sql(f"CREATE TABLE {db}.items (id INT PRIMARY KEY, v INT NOT NULL)")
        tidegate_run(env, pipeline)  # placed at the head (the snapshot of an empty table)
        sql(f"INSERT INTO {db}.items VALUES " + ", ".join(f"({i}, {i})" for i in range(1, 9)))
        tidegate_run(env, pipeline)
        assert ops() == {"c": 8} and lake.rows() == source_rows()
        spark.sql(f"DELETE FROM delta.`{lake.merged}` WHERE id <= 2")  # a consumer's damage
        sql(f"CREATE TABLE {db}.extra (id INT PRIMARY KEY, v INT NOT NULL)")  # not captured yet
        sql(f"INSERT INTO {db}.extra VALUES (1, 10), (2, 20), (3, 30)")

        first = tidegate_run(env, pipeline, "--resolve", "resnapshot", "--reason", "rebuild")
        assert ops() == {"c": 8, "r": 8} and lake.rows() == source_rows()
        sql(f"UPDATE {db}.items SET v = v + 100 WHERE id = 3")
        sql(f"INSERT INTO {db}.items VALUES (9, 9)")
        tidegate_run(env, pipeline, "--mode", "replay", "--replay-of", first["run_id"])
        assert ops() == {"c": 8, "r": 8}  # the replay of the resnapshot: the tables hold it

        # added: its snapshot hands off at the checkpoint, which the resnapshot's run moved past the
        # table's rows
        spec_file.write_text(spec_text(pipeline, source(f"{db}.items, {db}.extra"), base / "lake"))
        tidegate_run(env, pipeline)
        extra = Lake(spark, base / "lake", pipeline, db, "extra")
        assert ops(extra) == {"r": 3} and extra.rows() == source_rows("extra")
        assert ops() == {"c": 9, "r": 8, "u": 1} and lake.rows() == source_rows()
    finally:
        maria.close()


# --------------------------------------------------------------------------- a table restored

# what a sink's error names: the rewind that delivers again, then the one that goes on without
REWINDS = re.compile(r"`(tidegate checkpoints rewind \S+ (\S+) --to-version (\d+)) --reason \.\.\.` "
                     r"\(delivers them again\) or "
                     r"`(tidegate checkpoints rewind \S+ \S+ --to-version (\d+)) --reason \.\.\.` "
                     r"\(goes on without them\)")


def test_tables_restored_behind_the_sinks_are_told_and_the_rewinds_named_do_what_they_say(
        airflow_env, spark, mysql):
    """`RESTORE TABLE` takes both tables back one run, and the source is written before the next
    run. That run fails fatally (exit 3: no Airflow retry makes it hold), writes nothing, and names
    per sink the rewind that delivers the missing changes again and the one that goes on without
    them. Running the first for ``merged`` and the second for ``log``: the merged table equals the
    source table, the changelog holds every change but the restored run's exactly once, and the
    runs after say nothing more. Before the lineage was read (2026-12-07) the run went on and both
    tables lacked the restored run's changes for good. Then the checkpoint tables are restored
    (to a version drawn among theirs): the next run loses and doubles nothing."""
    env, base = airflow_env
    db = pipeline = f"dlx_{uuid.uuid4().hex[:6]}"
    source = (f"{{kind: mysql, conn_id: cdc_mysql, tables: [{db}.items], "
              f"server_id: {48900 + random.randint(0, 99)}}}")
    (base / "pipelines" / f"{pipeline}.yaml").write_text(spec_text(pipeline, source, base / "lake"))
    maria = MariaDb(mysql, db)
    sql, source_rows = maria.sql, maria.rows

    def keys() -> collections.Counter:
        return collections.Counter(r["idempotency_key"] for r in lake.changelog())

    lake = Lake(spark, base / "lake", pipeline, db)
    try:
        sql(f"CREATE DATABASE {db}")
        sql(f"CREATE TABLE {db}.items (id INT PRIMARY KEY, name VARCHAR(40), qty BIGINT)")
        tidegate_run(env, pipeline)  # placed at the head
        w = Writes(sql, f"{db}.items", lambda i: f"{i}, 'n{i}', {i}")
        w.wave()
        tidegate_run(env, pipeline)
        held = {t: spark.sql(f"DESCRIBE HISTORY delta.`{t}`").agg({"version": "max"}).collect()[0][0]
                for t in (lake.merged, lake.log)}
        first = keys()
        w.wave()
        tidegate_run(env, pipeline)
        lost = set(keys()) - set(first)
        for table, version in held.items():
            spark.sql(f"RESTORE TABLE delta.`{table}` TO VERSION AS OF {version}")
        w.wave()  # written between the restore and the next run

        r = subprocess.run([str(VENV_BIN / "tidegate"), "run", pipeline], env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 3, (r.returncode, r.stderr[-4000:])  # plan.EXIT_FATAL
        named = {m.group(2): m for m in REWINDS.finditer(r.stderr)}
        assert sorted(named) == ["log", "merged"], r.stderr[-4000:]
        assert keys() == first  # nothing written
        for sink, pick in (("merged", 1), ("log", 4)):  # deliver again; go on without them
            cmd = named[sink].group(pick).split()[1:] + ["--reason", "table restored"]
            done = subprocess.run([str(VENV_BIN / "tidegate"), *cmd], env=env, capture_output=True, text=True)
            assert done.returncode == 0, done.stderr

        tidegate_run(env, pipeline)
        assert lake.rows() == source_rows()
        got = keys()
        assert set(got.values()) == {1} and not lost & set(got) and set(first) < set(got)
        assert sum(got.values()) == sum(w.ops.values()) - len(lost)
        w.wave()
        tidegate_run(env, pipeline)  # nothing told again
        assert lake.rows() == source_rows()
        assert sum(keys().values()) == sum(w.ops.values()) - len(lost)

        # The checkpoint tables restored instead, each to a version drawn among its own: the record
        # read back says the sink holds less (or nothing), the tables' own commits say what they
        # hold, so nothing is lost or doubled; a record gone is warned of as for any sink (the
        # rewind it names would write nothing the tables hold).
        draw = random.Random(int(os.environ.get("TIDEGATE_TEST_SEED", "4417")))
        for table in lake.checkpoints:
            newest = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").agg({"version": "max"}).collect()[0][0]
            spark.sql(f"RESTORE TABLE delta.`{table}` TO VERSION AS OF {draw.randrange(newest)}")
        w.wave()
        report = tidegate_run(env, pipeline)
        assert lake.rows() == source_rows()
        got = keys()
        assert set(got.values()) == {1} and sum(got.values()) == sum(w.ops.values()) - len(lost)
        for sink in report["sinks"]:
            assert sink["lost"] is None or f"checkpoints rewind {pipeline} {sink['id']} " in sink["lost"]
    finally:
        maria.close()
