"""``envelope: debezium`` through real pipelines: MariaDB binlog and PostgreSQL (wal2json) to
Kafka exactly-once, read back with ``read_committed``.

One workload per source (a multi-row transaction, an update, a primary-key change, a delete, a
TRUNCATE) shows what a consumer written for Debezium reads: Debezium's topic names, keys and
values with its value mapping per column type (read from the source's catalog), a tombstone
after every delete, the delete/tombstone/create of a key change with ``__debezium.newkey`` /
``__debezium.oldkey``, ``op: "t"`` for the TRUNCATE, and the BEGIN/END records of the
transaction metadata topic, all in the same Kafka transactions as the data.
"""

from __future__ import annotations

import base64
import json
import textwrap
import time
import uuid

import psycopg2
import pymysql
import pytest
from tidegate import bounds_step
from tidegate.parts import Parts
from tidegate.positions import position_from_json
from tidegate.run import RunContext
from tidegate.spec import load_spec
from tidegate.store import open_store

from tests.integration.sink_readers import kafka_records
from tests.runs import whole_run

pytestmark = pytest.mark.integration
CONTEXT = "__debezium.context."


def spec_for(tmp_path, pipeline: str, source: str, extra: str = ""):
    path = tmp_path / f"{pipeline}.yaml"
    path.write_text(textwrap.dedent(f"""
        pipeline: {pipeline}
        source: {source}
        sinks:
          - id: events
            kind: kafka
            conn_id: kafka
            exactly_once: true
            envelope: debezium
            debezium: {{topic_prefix: {pipeline}, skipped_operations: [], transaction_metadata: true{extra}}}
    """))
    return load_spec(str(path))


def committed(bootstrap: str, topic: str, prefix: str | None = None
              ) -> list[tuple[dict | None, dict | None, dict]]:
    """(key, value, headers) of every committed record of a one-partition topic, in order
    (``prefix``: the logical name, when the topic does not start with it)."""
    out = []
    for _, key, value, raw in kafka_records(bootstrap, topic):
        headers = dict(raw)
        # Debezium's context headers (plain text) on change records, tombstones and schema change
        # records, none on the transaction topic or heartbeats: checked, then set aside; the
        # key-change headers are JSON
        context = {k.removeprefix(CONTEXT): headers.pop(k).decode()
                   for k in list(headers) if k.startswith(CONTEXT)}
        if topic.endswith(".transaction") or topic.startswith("__debezium-heartbeat."):
            assert context == {}
        else:
            logical = prefix or topic.split(".")[0]
            assert (context["connectorLogicalName"], context["taskId"]) == (logical, "0")
            assert context["connectorName"] in ("mariadb", "mysql", "postgresql")
        out.append((json.loads(key) if key else None, json.loads(value) if value else None,
                    {k: json.loads(v) for k, v in headers.items()}))
    return out


def b64_unscaled(n: int) -> str:
    size = max(1, (n + (n < 0)).bit_length() // 8 + 1)
    return base64.b64encode(n.to_bytes(size, "big", signed=True)).decode()


def check_changes(records, key_name: str = "id") -> list:
    """The table topic's story, the same on both sources; returns the change values."""
    shape = [(k[key_name] if k else None, v["op"] if v else None, sorted(h)) for k, v, h in records]
    assert shape == [
        (1, "c", []), (2, "c", []),  # one transaction, two rows
        (2, "u", []),
        # the key change: a delete, its tombstone, the create of the new key
        (1, "d", ["__debezium.newkey"]), (1, None, ["__debezium.newkey"]), (100, "c", ["__debezium.oldkey"]),
        (2, "d", []), (2, None, []),  # a delete and its tombstone
        (None, "t", []),  # TRUNCATE
    ], shape
    assert records[3][2] == {"__debezium.newkey": {key_name: 100}}
    assert records[5][2] == {"__debezium.oldkey": {key_name: 1}}
    return [v for _, v, _ in records]


def check_transactions(records, collection: str, truncate: list) -> None:
    """BEGIN/END around each transaction with its row count; the first holds both inserts. The
    TRUNCATE's transaction ends as ``truncate`` says: a binlog TRUNCATE has no XID event, so
    Debezium's MariaDB connector writes its BEGIN and no END; PostgreSQL's writes both."""
    statuses = [(v["status"], v["event_count"]) for _, v, _ in records]
    assert statuses == [("BEGIN", None), ("END", 2), ("BEGIN", None), ("END", 1), ("BEGIN", None), ("END", 2),
                        ("BEGIN", None), ("END", 1)] + truncate, statuses
    assert records[1][1]["data_collections"] == [{"data_collection": collection, "event_count": 2}]
    assert all(k == {"id": v["id"]} for k, v, _ in records)


def check_schema_change(records, values, db: str) -> None:
    """One record on the schema change topic (the TRUNCATE gives none), for the ADD COLUMN, at a
    binlog position between the inserts and the update that first carries the new column."""
    assert len(records) == 1, records
    key, value, _ = records[0]
    assert key == {"databaseName": db} and value["databaseName"] == db and value["schemaName"] is None
    assert value["ddl"] == f"ALTER TABLE {db}.t ADD COLUMN extra INT NULL"
    [change] = value["tableChanges"]
    assert (change["type"], change["id"]) == ("ALTER", f'"{db}"."t"')
    columns = change["table"]["columns"]
    assert [c["name"] for c in columns] == ["id", "amount", "at", "stamp", "tags", "doc", "flags", "raw",
                                            "big", "extra"]
    assert (columns[-1]["typeName"], columns[-1]["optional"], columns[-1]["position"]) == ("INT", True, 10)
    assert change["table"]["primaryKeyColumnNames"] == ["id"]
    src = value["source"]
    assert (src["connector"], src["db"], src["table"], src["snapshot"]) == ("mariadb", db, "t", "false")
    assert values[1]["source"]["pos"] < src["pos"] < values[2]["source"]["pos"]
    assert src["file"] == values[2]["source"]["file"]
    assert "extra" not in values[1]["after"] and values[2]["after"]["extra"] is None


def check_heartbeats(bootstrap: str, spec, conns: dict, store) -> None:
    """heartbeat_interval_ms 5000: the delivering run wrote one with its first sub-batch (none was
    written before), at that sub-batch's end; an idle run within the interval writes none, one
    after it writes one at its upper bound, where the checkpoint moves."""
    def idle_run():
        run = RunContext(spec, parts=Parts(conns.__getitem__), store=store)
        return bounds_step.prepare_bounds(run).bounds

    pipeline = spec.pipeline
    topic = f"__debezium-heartbeat.{pipeline}"
    first = committed(bootstrap, topic, pipeline)
    assert len(first) == 1
    after_r1 = store.checkpoints.current(pipeline)["events"].position
    assert first[0][0] == {"serverName": pipeline} and list(first[0][1]) == ["ts_ms"]
    at = position_from_json(first[0][2]["tidegate.position"])
    assert at.kind == "mysql" and at <= after_r1
    last = first[0][1]["ts_ms"]
    started = time.time() * 1000
    idle_run()
    if started < last + 5000:  # (a slow machine may already be past the interval)
        assert len(committed(bootstrap, topic, pipeline)) == 1
    time.sleep(max(0.0, (last + 5000 - time.time() * 1000) / 1000))
    bounds = idle_run()
    beats = committed(bootstrap, topic, pipeline)
    assert len(beats) == 2 and beats[1][1]["ts_ms"] >= last + 5000
    assert beats[1][2]["tidegate.position"] == bounds.upto.to_json()
    assert store.checkpoints.current(pipeline)["events"].position == bounds.upto


def test_mariadb_changes_as_the_mariadb_connector_writes_them(mysql, kafka, kafka_bootstrap, tmp_path):
    tag = uuid.uuid4().hex[:6]
    db = pipeline = f"dbz_{tag}"
    spec = spec_for(tmp_path, pipeline, f"{{kind: mysql, conn_id: src, tables: [{db}.t], server_id: 48611, "
                                        f"start: head}}",
                    ", schema_change_topic: true, heartbeat_interval_ms: 5000")
    conns = {"src": mysql.cdc, "kafka": kafka.cdc}
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    t = f"{db}.t"
    try:
        with admin.cursor() as c:
            c.execute(f"CREATE DATABASE {db}")
            c.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, amount DECIMAL(10,2), at DATETIME(6), "
                      f"stamp TIMESTAMP(3) NULL, tags SET('x','y','z'), doc JSON, flags BIT(10), "
                      f"raw VARBINARY(4), big BIGINT UNSIGNED)")
            bounds_step.prepare_bounds(RunContext(spec, parts=Parts(conns.__getitem__), store=store))
            c.execute("BEGIN")
            c.execute(f"INSERT INTO {t} VALUES (1, 12.34, '2024-01-02 03:04:05.000001', "
                      f"'2024-01-02 03:04:05.1', 'z,x', '{{\"a\": 1}}', b'1000000001', 0x00ff, "
                      f"18446744073709551615)")
            c.execute(f"INSERT INTO {t} (id, amount) VALUES (2, -0.01)")
            c.execute("COMMIT")
            c.execute(f"ALTER TABLE {t} ADD COLUMN extra INT NULL")  # between the inserts and the update
            c.execute(f"UPDATE {t} SET amount = 5 WHERE id = 2")
            c.execute(f"UPDATE {t} SET id = 100 WHERE id = 1")
            c.execute(f"DELETE FROM {t} WHERE id = 2")
            c.execute(f"TRUNCATE TABLE {t}")
        whole_run(RunContext(spec, run_id="r1", parts=Parts(conns.__getitem__), store=store))
        values = check_changes(committed(kafka_bootstrap, f"{pipeline}.{db}.t"))
        first = values[0]
        assert first["after"] == {
            "id": 1, "amount": b64_unscaled(1234), "at": 1704164645000001,
            "stamp": "2024-01-02T03:04:05.100Z", "tags": "x,z", "doc": '{"a": 1}',
            "flags": base64.b64encode(bytes([1, 2])).decode(),
            "raw": base64.b64encode(b"\x00\xff").decode(), "big": -1}
        src = first["source"]
        assert (src["connector"], src["version"], src["name"], src["db"], src["table"]) == (
            "mariadb", "3.5.0.Final", pipeline, db, "t")
        assert src["file"] and src["pos"] > 0 and src["row"] == 0 and src["server_id"] > 0
        assert src["gtid"].count("-") == 2
        # the second INSERT is a row event of its own, later in the same transaction
        assert values[1]["after"]["amount"] == b64_unscaled(-1)
        assert (values[1]["source"]["row"], values[1]["source"]["gtid"]) == (0, src["gtid"])
        assert values[1]["source"]["pos"] > src["pos"]
        assert values[0]["transaction"] == {"id": src["gtid"], "total_order": 1, "data_collection_order": 1}
        assert values[1]["transaction"]["total_order"] == 2
        assert (values[2]["before"]["amount"], values[2]["after"]["amount"]) == (b64_unscaled(-1),
                                                                                 b64_unscaled(500))
        check_transactions(committed(kafka_bootstrap, f"{pipeline}.transaction"), f"{db}.t",
                           [("BEGIN", None)])
        check_schema_change(committed(kafka_bootstrap, pipeline), values, db)
        check_heartbeats(kafka_bootstrap, spec, conns, store)
    finally:
        with admin.cursor() as c:
            c.execute(f"DROP DATABASE IF EXISTS {db}")
        admin.close()
        store.close()


def test_postgres_changes_as_the_postgres_connector_writes_them(postgres, kafka, kafka_bootstrap, tmp_path):
    tag = uuid.uuid4().hex[:6]
    pipeline = f"dbzpg_{tag}"
    spec = spec_for(tmp_path, pipeline, f"{{kind: postgres, conn_id: src, slot: {pipeline}, "
                                        f"tables: [public.{pipeline}], start: head}}")
    conns = {"src": postgres.cdc, "kafka": kafka.cdc}
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    admin = psycopg2.connect(postgres.admin_dsn)
    admin.autocommit = True
    t = f"public.{pipeline}"
    try:
        with admin.cursor() as c:
            c.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, amount NUMERIC(10,2), loose NUMERIC, "
                      f"at TIMESTAMP, stamp TIMESTAMPTZ, u UUID, doc JSONB, nums INT[], span INTERVAL)")
            c.execute(f"GRANT SELECT ON {t} TO {postgres.cdc.login}")
            c.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (pipeline,))
            bounds_step.prepare_bounds(RunContext(spec, parts=Parts(conns.__getitem__), store=store))
            c.execute("BEGIN")
            c.execute(f"INSERT INTO {t} VALUES (1, 12.34, 1.250, '2024-01-02 03:04:05.5', "
                      f"'2024-01-02 03:04:05.12+00', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{{\"a\": 1}}', "
                      f"'{{1,2}}', '1 day 00:00:01')")
            c.execute(f"INSERT INTO {t} (id, amount) VALUES (2, -0.01)")
            c.execute("COMMIT")
            c.execute(f"UPDATE {t} SET amount = 5 WHERE id = 2")
            c.execute(f"UPDATE {t} SET id = 100 WHERE id = 1")
            c.execute(f"DELETE FROM {t} WHERE id = 2")
            c.execute(f"TRUNCATE {t}")
        whole_run(RunContext(spec, run_id="r1", parts=Parts(conns.__getitem__), store=store))
        values = check_changes(committed(kafka_bootstrap, f"{pipeline}.public.{pipeline}"))
        first = values[0]
        assert first["after"] == {
            # NUMERIC without scale: its trailing fraction zero stripped, as Debezium does (make compat)
            "id": 1, "amount": b64_unscaled(1234), "loose": {"scale": 2, "value": b64_unscaled(125)},
            # timestamptz: padded to the column's precision (6), as Debezium writes it (make compat)
            "at": 1704164645500000, "stamp": "2024-01-02T03:04:05.120000Z",
            "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "doc": '{"a": 1}', "nums": [1, 2],
            "span": 86_401_000_000}
        src = first["source"]
        dbname = admin.get_dsn_parameters()["dbname"]
        assert (src["connector"], src["version"], src["name"], src["db"], src["schema"], src["table"]) == (
            "postgresql", "3.6.1.Final", pipeline, dbname, "public", pipeline)
        assert src["txId"] > 0 and src["lsn"] > 0 and src["xmin"] is None
        # the commit time to the µs, as PostgreSQL logs it (ts_ms: the same time truncated)
        assert (src["ts_ms"], src["ts_ns"]) == (src["ts_us"] // 1000, src["ts_us"] * 1000)
        assert abs(src["ts_ms"] - time.time() * 1000) < 600_000
        assert values[0]["transaction"]["id"].startswith(f"{src['txId']}:")
        check_transactions(committed(kafka_bootstrap, f"{pipeline}.transaction"), f"public.{pipeline}",
                           [("BEGIN", None), ("END", 1)])
    finally:
        with admin.cursor() as c:
            c.execute(f"DROP TABLE IF EXISTS {t}")
            c.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                      "WHERE slot_name = %s", (pipeline,))
        admin.close()
        store.close()
