"""Table and column filters against the real servers, through `tidegate run` (MariaDB and
PostgreSQL) and Spark slice tasks (MariaDB).

Each pipeline captures ``<schema>.*`` but ``!<schema>.audit_*``; of ``customers`` it excludes
``ssn``, masks ``email``, hashes ``phone`` (salt from an Airflow variable on MariaDB, from a
connection's password on PostgreSQL) and truncates ``name`` to 3 characters. A snapshot run, then
a run of log events (an insert, an update whose before-image holds the old clear values, a
delete, a change of the ``ssn`` column's type, one more insert), then a replay of that run. Every
byte the Kafka, NATS and Redis sinks hold (values, keys, headers, control and checkpoint records,
all topics, subjects and keys of the pipeline) is searched for the clear values, the excluded
column's name and the excluded table; the events are checked by content and order; hashes are
the salted SHA-256 of the value and the replay's envelopes equal the first delivery's, byte for
byte; a sink with ``on_poison: dlq`` whose customers stream is poisoned dead-letters filtered
events. The binlog range read again by the Spark driver's reader (a task per binlog file) ships
the same filtered envelopes, and a snapshot's chunks read by Spark tasks give filtered rows."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psycopg2
import pymysql
import pytest
import redis
from confluent_kafka import Consumer, TopicPartition
from tidegate import cli
from tidegate.catalog import find
from tidegate.events import ChangeEvent
from tidegate.parts import Parts

from tests.integration.local_spark import local_session

pytestmark = pytest.mark.integration

SALTS = {"mysql": "maria-salt-7", "postgres": "pg-salt-9"}
CUSTOMERS = [  # id, name, email, phone, ssn
    (1, "Alexandra", "alexandra@example.com", "555-0101", "111-22-3333"),
    (2, "Benedikt", "benedikt@example.com", "555-0102", "222-33-4444"),
    (3, "Cordelia", "cordelia@example.com", "555-0103", "333-44-5555"),
    (4, "Dorothea", "dorothea@example.com", "555-0104", "444-55-6666"),
]
NEW_EMAIL, NEW_PHONE, NEW_SSN = "alexandra.new@example.com", "555-0199", "999-88-7777"
AUDIT_SECRET = "TOPSECRET-AUDIT-ROW"
CLEAR = [v for c in CUSTOMERS for v in c[1:]] + [NEW_EMAIL, NEW_PHONE, NEW_SSN, AUDIT_SECRET]


def tidegate(capsys, *args: str) -> dict:
    rc = cli.main(list(args))
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


def spec_text(name: str, kind: str, schema: str, salt: str, extra: dict[str, str]) -> str:
    return textwrap.dedent(f"""
        pipeline: {name}
        source:
          kind: {kind}
          conn_id: cdc_{kind}
          start: snapshot
          tables: ["{schema}.*", "!{schema}.audit_*"]
          columns:
            {schema}.customers:
              exclude: [ssn]
              mask: {{email: "***"}}
              hash: [phone]
              truncate: {{name: 3}}
          hash_salt: {salt}
          EXTRA
        sinks:
          - {{id: events, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}",
              exactly_once: true, checkpoint_topic: "_ck_{name}"}}
          - {{id: bus, kind: nats, conn_id: cdc_nats, stream: {name.upper()},
              subject: "{{pipeline}}.{{table}}"}}
          - {{id: cache, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:{{table}}"}}
          - {{id: dead, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:x:{{table}}", on_poison: dlq}}
    """).replace("  EXTRA\n", "".join(f"  {k}: {v}\n" for k, v in extra.items()))  # the kind's fields


@pytest.fixture(scope="module")
def env(tmp_path_factory, service_env, mysql, postgres, kafka, redis_service, nats_service):
    base = tmp_path_factory.mktemp("filters")
    (base / "pipelines").mkdir()
    saved = {k: os.environ.get(k) for k in ("TIDEGATE_PIPELINES_DIR", "TIDEGATE_CHECKPOINT_STORE",
                                            "AIRFLOW_VAR_FLT_SALT", "AIRFLOW_CONN_FLT_SALT")}
    os.environ.update(TIDEGATE_PIPELINES_DIR=str(base / "pipelines"),
                      TIDEGATE_CHECKPOINT_STORE=f"sqlite:///{base / 'ckpt.sqlite'}",
                      AIRFLOW_VAR_FLT_SALT=SALTS["mysql"],
                      AIRFLOW_CONN_FLT_SALT=json.dumps({"conn_type": "generic",
                                                        "password": SALTS["postgres"]}))
    yield base / "pipelines"
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


# --------------------------------------------------------------------------- the workloads


def mysql_workload(mysql, folder):
    """A database with customers, orders and an audit table; returns (pipeline, admin connection,
    a function running the log changes)."""
    db = f"flt_{uuid.uuid4().hex[:8]}"
    name = f"fm_{db[4:]}"
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    run(admin, f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.customers (id INT PRIMARY KEY, name VARCHAR(40), email VARCHAR(80), "
        f"phone VARCHAR(20), ssn VARCHAR(20), score INT)",
        f"CREATE TABLE {db}.orders (id INT PRIMARY KEY, customer_id INT, total DECIMAL(8,2))",
        f"CREATE TABLE {db}.audit_log (id INT PRIMARY KEY, secret TEXT)",
        *insert_customers(f"{db}.customers", CUSTOMERS[:2]),
        f"INSERT INTO {db}.orders VALUES (10, 1, 12.50)",
        f"INSERT INTO {db}.audit_log VALUES (1, '{AUDIT_SECRET}')")
    (folder / f"{name}.yaml").write_text(spec_text(name, "mysql", db, "{variable: flt_salt}", {}))

    def changes():
        run(admin, "BEGIN", *insert_customers(f"{db}.customers", CUSTOMERS[2:3]),
            f"UPDATE {db}.customers SET email = '{NEW_EMAIL}', phone = '{NEW_PHONE}', ssn = '{NEW_SSN}', "
            f"score = 2 WHERE id = 1",
            f"INSERT INTO {db}.audit_log VALUES (2, '{AUDIT_SECRET}')", "COMMIT",
            f"DELETE FROM {db}.customers WHERE id = 2",
            "FLUSH BINARY LOGS",  # the range spans binlog files: one Spark task each
            f"ALTER TABLE {db}.customers MODIFY ssn VARCHAR(40)",
            *insert_customers(f"{db}.customers", CUSTOMERS[3:]),
            f"UPDATE {db}.orders SET total = 13.00 WHERE id = 10")

    return name, db, admin, changes, lambda: run(admin, f"DROP DATABASE IF EXISTS {db}")


def postgres_workload(postgres, folder, plugin: str = "wal2json"):
    schema = f"flt_{uuid.uuid4().hex[:8]}"
    name = f"fp_{schema[4:]}"
    admin = psycopg2.connect(postgres.admin_dsn)
    admin.autocommit = True
    run(admin, f"CREATE SCHEMA {schema}", f"GRANT USAGE ON SCHEMA {schema} TO {postgres.cdc.login}",
        f"CREATE TABLE {schema}.customers (id int PRIMARY KEY, name varchar(40), email varchar(80), "
        f"phone varchar(20), ssn varchar(20), score int)",
        f"ALTER TABLE {schema}.customers REPLICA IDENTITY FULL",
        f"CREATE TABLE {schema}.orders (id int PRIMARY KEY, customer_id int, total numeric(8,2))",
        f"ALTER TABLE {schema}.orders REPLICA IDENTITY FULL",
        f"CREATE TABLE {schema}.audit_log (id int PRIMARY KEY, secret text)",
        f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {postgres.cdc.login}",
        *insert_customers(f"{schema}.customers", CUSTOMERS[:2]),
        f"INSERT INTO {schema}.orders VALUES (10, 1, 12.50)",
        f"INSERT INTO {schema}.audit_log VALUES (1, '{AUDIT_SECRET}')")
    extra = {"slot": name, "replay_retention": "1h", "plugin": plugin}
    if plugin == "pgoutput":
        # a publication of every table, so the server sends the excluded table's changes too and
        # the filters, not the publication, keep them out
        run(admin, f"CREATE PUBLICATION {name} FOR ALL TABLES")
        extra["publication"] = name
    (folder / f"{name}.yaml").write_text(spec_text(name, "postgres", schema, "{conn_id: flt_salt}", extra))

    def changes():
        run(admin, "BEGIN", *insert_customers(f"{schema}.customers", CUSTOMERS[2:3]),
            f"UPDATE {schema}.customers SET email = '{NEW_EMAIL}', phone = '{NEW_PHONE}', ssn = '{NEW_SSN}', "
            f"score = 2 WHERE id = 1",
            f"INSERT INTO {schema}.audit_log VALUES (2, '{AUDIT_SECRET}')", "COMMIT",
            f"DELETE FROM {schema}.customers WHERE id = 2",
            f"ALTER TABLE {schema}.customers ALTER COLUMN ssn TYPE varchar(40)",
            *insert_customers(f"{schema}.customers", CUSTOMERS[3:]),
            f"UPDATE {schema}.orders SET total = 13.00 WHERE id = 10")

    def drop():
        run(admin, f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = "
                   f"'{name}'", f"DROP PUBLICATION IF EXISTS {name}",
            f"DROP SCHEMA IF EXISTS {schema} CASCADE")

    return name, schema, admin, changes, drop


def insert_customers(table: str, rows) -> list[str]:
    return [f"INSERT INTO {table} VALUES ({i}, '{n}', '{e}', '{p}', '{s}', 1)" for i, n, e, p, s in rows]


def run(admin, *stmts: str) -> None:
    with admin.cursor() as c:
        for st in stmts:
            c.execute(st)


# --------------------------------------------------------------------------- every byte a sink holds


def kafka_bytes(bootstrap: str, name: str) -> tuple[list[str], bytes, list[dict]]:
    """The pipeline's topics, every byte of every record in them (aborted ones too), and the
    committed envelopes of the customers topic in order."""
    everything = []
    # (short polls and fetch waits: the read ends on polls past a trailing commit marker, which
    # return nothing; see sink_readers.kafka_changes)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "flt-" + uuid.uuid4().hex,
                  "enable.auto.commit": False, "fetch.wait.max.ms": 10})
    try:
        topics = sorted(t for t in c.list_topics(timeout=10).topics if name in t)
        for topic in topics:
            for p in c.list_topics(topic, timeout=10).topics[topic].partitions:
                low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                if high <= low:
                    continue
                tp = TopicPartition(topic, p)
                c.assign([TopicPartition(topic, p, low)])
                deadline = time.monotonic() + 30
                # the last offsets may be transaction markers, which no poll returns: read until
                # the position passes the high watermark
                while c.position([tp])[0].offset < high:
                    assert time.monotonic() < deadline, f"{topic}[{p}] did not give its records"
                    msg = c.poll(0.05)
                    if msg is not None and not msg.error():
                        everything.append(msg.key() or b"")
                        everything.append(msg.value() or b"")
                        everything += [k.encode() + (v or b"") for k, v in (msg.headers() or [])]
    finally:
        c.close()
    from tests.integration.sink_readers import kafka_changes

    return topics, b"\n".join(everything), kafka_changes(bootstrap, f"{name}.customers")


def nats_bytes(conn, stream: str) -> tuple[list[str], bytes]:
    import nats

    async def go():
        nc = await nats.connect(f"nats://127.0.0.1:{conn.port}", user=conn.login, password=conn.password)
        try:
            js = nc.jetstream()
            info = await js.stream_info(stream)
            return [await js.get_msg(stream, s) for s in range(info.state.first_seq, info.state.last_seq + 1)]
        finally:
            await nc.close()

    msgs = asyncio.run(go())
    raw = [m.subject.encode() + (m.data or b"") + json.dumps(m.headers or {}).encode() for m in msgs]
    return sorted({m.subject for m in msgs}), b"\n".join(raw)


def redis_bytes(conn, name: str) -> tuple[list[str], bytes, list[bytes]]:
    r = redis.Redis(host="127.0.0.1", port=conn.port, username=conn.login, password=conn.password)
    try:
        keys = sorted(k.decode() for k in r.scan_iter(match=f"*{name}*"))
        raw = []
        for k in keys:
            t = r.type(k).decode()
            if t == "stream":
                raw += [f for _, fields in r.xrange(k) for kv in fields.items() for f in kv]
            elif t == "string":
                raw.append(r.get(k))
            elif t == "hash":
                raw += [f for kv in r.hgetall(k).items() for f in kv]
        customers = [f[b"event"] for _, f in r.xrange(f"{name}:customers")]
        return keys, b"\n".join(k.encode() for k in keys) + b"\n" + b"\n".join(raw), customers
    finally:
        r.close()


def assert_nothing_clear(where: str, names: list[str], raw: bytes) -> None:
    assert raw, f"{where} holds nothing"
    for v in CLEAR:
        assert v.encode() not in raw, f"{where} holds the clear value {v!r}"
    assert b"ssn" not in raw.lower(), f"{where} names the excluded column"
    assert b"audit" not in raw.lower(), f"{where} holds the excluded table"
    assert not [n for n in names if "audit" in n], names


def hashed(kind: str, value: str) -> str:
    return hashlib.sha256(SALTS[kind].encode() + value.encode()).hexdigest()


def expected_customer(kind: str, i: int, email: str | None = None, phone: str | None = None, score=1):
    _, name, mail, tel, _ = CUSTOMERS[i - 1]
    return {"id": i, "name": name[:3], "email": "***", "phone": hashed(kind, phone or tel), "score": score}


# --------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("kind, plugin", [("mysql", None), ("postgres", "wal2json"),
                                          ("postgres", "pgoutput")])
def test_filtered_pipeline(kind, plugin, env, capsys, mysql, postgres, kafka_bootstrap, nats_service,
                           redis_service, request):
    if kind == "mysql":
        name, schema, admin, changes, drop = mysql_workload(mysql, env)
    else:
        name, schema, admin, changes, drop = postgres_workload(postgres, env, plugin)
    request.addfinalizer(lambda: (drop(), admin.close()))
    spec = find(name)
    source = Parts().source(spec)
    try:  # the preflight finds nothing wrong with the filters
        assert [p for p in source.preflight() if p.code == "filters"] == []
    finally:
        source.close()

    # the `dead` sink's customers stream key holds a string: each customers event is poison there
    # and goes to its dead-letter stream, the event in the record
    r = redis.Redis(host="127.0.0.1", port=redis_service.cdc.port, username=redis_service.cdc.login,
                    password=redis_service.cdc.password)
    r.set(f"{name}:x:customers", "not a stream")
    r.close()

    r1 = tidegate(capsys, "run", name, "--run-id", "r1")  # the snapshot (and creates the slot)
    if kind == "postgres":  # the slot decodes with the plugin the spec names
        with admin.cursor() as c:
            c.execute("SELECT plugin FROM pg_replication_slots WHERE slot_name = %s", (name,))
            assert c.fetchall() == [(plugin,)]
    changes()
    r2 = tidegate(capsys, "run", name, "--run-id", "r2")
    r3 = tidegate(capsys, "run", name, "--mode", "replay", "--replay-of", "r2", "--run-id", "r3")
    assert r1["events"] >= 3 and r2["events"] == r3["events"] >= 5, (r1, r2, r3)

    topics, kraw, committed = kafka_bytes(kafka_bootstrap, name)
    subjects, nraw = nats_bytes(nats_service.cdc, name.upper())
    keys, rraw, cached = redis_bytes(redis_service.cdc, name)
    assert f"{name}.customers" in topics and f"{name}.orders" in topics
    assert f"{name}.customers" in subjects and f"{name}:customers" in keys
    for where, names, raw in (("kafka", topics, kraw), ("nats", subjects, nraw), ("redis", keys, rraw)):
        assert_nothing_clear(where, names, raw)

    # what arrived, in order: the snapshot rows, then the log run, then its replay
    for where, envelopes in (("kafka", committed), ("redis", [json.loads(e) for e in cached])):
        ops = [(e["op"], (e["after"] or e["before"])["id"]) for e in envelopes]
        log_part = [("c", 3), ("u", 1), ("d", 2), ("c", 4)]
        assert ops == [("r", 1), ("r", 2)] + log_part + log_part, (where, ops)
        by = {(e["op"], (e["after"] or e["before"])["id"]): e for e in envelopes}
        assert by[("r", 1)]["after"] == expected_customer(kind, 1)
        assert by[("c", 3)]["after"] == expected_customer(kind, 3)
        update = by[("u", 1)]
        assert update["before"] == expected_customer(kind, 1)  # the before-image, filtered too
        assert update["after"] == expected_customer(kind, 1, phone=NEW_PHONE, score=2)
        assert by[("d", 2)]["before"] == expected_customer(kind, 2) and by[("d", 2)]["after"] is None
        # the replay's envelopes are the first delivery's, byte for byte (same salt, same hash)
        assert envelopes[2:6] == envelopes[6:10]
    assert cached[2:6] == cached[6:10]

    # the dead letters hold the filtered events: the snapshot rows, the log run, its replay
    r = redis.Redis(host="127.0.0.1", port=redis_service.cdc.port, username=redis_service.cdc.login,
                    password=redis_service.cdc.password)
    dead = [json.loads(f[b"record"])["event"] for _, f in r.xrange(f"{name}:__dlq")]
    r.close()
    assert [(e["op"], (e["after"] or e["before"])["id"]) for e in dead] == \
        [("r", 1), ("r", 2)] + [("c", 3), ("u", 1), ("d", 2), ("c", 4)] * 2
    assert dead[3]["before"] == expected_customer(kind, 1)

    # the schema change of the excluded column: sent, without its name (or the statement naming it)
    control = [json.loads(line) for line in rraw.split(b"\n") if line.startswith(b'{"type":"schema_change"')]
    changes_of_customers = [m for m in control if m.get("table") == "customers"]
    assert changes_of_customers, control
    for m in changes_of_customers:
        assert all(c["name"] != "ssn" for c in m.get("columns") or [])
        if kind == "mysql":
            assert m["ddl"] is None and m["ddl_redacted"] is True
            assert [c["name"] for c in m["columns"]] == ["id", "name", "email", "phone", "score"]
        else:
            assert [c["name"] for c in m["previous_columns"]] == ["id", "name", "email", "phone", "score"]


@pytest.fixture(scope="module")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # the workers import this checkout's tidegate (the venv's may be another checkout's)
    include = str(Path(__file__).resolve().parents[2] / "include")
    os.environ["PYTHONPATH"] = os.pathsep.join([include, *filter(None, [os.environ.get("PYTHONPATH")])])
    session = local_session("tidegate-filters")
    yield session
    session.stop()


def test_spark_slice_tasks_ship_filtered_rows(env, mysql, spark, request):
    """A binlog range over several files read by Spark tasks (each rebuilds the source from the
    connection and the salt the driver shipped) gives the sequential read's filtered envelopes."""
    from tidegate.segments import Slice
    from tidegate.shipped import ShippedEvent
    from tidegate.spark.job import SparkReader

    name, db, admin, changes, drop = mysql_workload(mysql, env)
    request.addfinalizer(lambda: (drop(), admin.close()))
    spec = find(name)
    source = Parts().source(spec)
    request.addfinalizer(source.close)
    start = source.head()
    changes()
    upto = source.head()
    slices = source.slices(start, upto)
    assert len(slices) >= 2
    sequential = [it for it in source.read(start, upto) if isinstance(it, ChangeEvent)]
    # the driver's reader, as the deliver job uses it: the slices in Spark tasks, with the salt
    (read,) = SparkReader(spark, source.conn).read_log(spec, source, [Slice(a, b) for a, b in slices])
    in_spark = [it for it in read.items if isinstance(it, ChangeEvent)]
    assert all(type(e) is ShippedEvent for e in in_spark)  # they came from the tasks
    assert [e.value for e in in_spark] == [e.value for e in sequential]
    customers = [json.loads(e.value) for e in in_spark if e.table == "customers"]
    assert [(e["op"], (e["after"] or e["before"])["id"]) for e in customers] == \
        [("c", 3), ("u", 1), ("d", 2), ("c", 4)]
    assert customers[1]["after"] == expected_customer("mysql", 1, phone=NEW_PHONE, score=2)
    raw = b"".join(e.value + e.key_bytes for e in in_spark)
    assert_nothing_clear("spark", [e.table for e in in_spark], raw)

    # a snapshot's chunks read by Spark tasks (the data source's payload carries the salt)
    from tidegate.positions import SnapshotPosition
    from tidegate.segments import Chunk
    from tidegate.snapshot import plan_snapshot
    from tidegate.spark.chunks import read_chunks

    rec = plan_snapshot(spec, source, handoff=upto, kind="start")
    assert [t["table"] for t in rec.tables] == ["customers", "orders"]  # the audit table left out
    chunks = [Chunk(SnapshotPosition(rec.snapshot_id, n, rec.handoff)) for n in range(1, len(rec.chunks) + 1)]
    reads = read_chunks(spark, spec, source.conn, rec, chunks, source.hash_salt)
    rows = [json.loads(ev.value) for read in reads for ev in read.items if isinstance(ev, ChangeEvent)]
    assert [r["after"] for r in rows if r["source"]["table"] == "customers"] == [
        expected_customer("mysql", 1, phone=NEW_PHONE, score=2), expected_customer("mysql", 3),
        expected_customer("mysql", 4)]
    assert_nothing_clear("spark chunks", [], b"".join(json.dumps(r).encode() for r in rows))
