"""An UPDATE that changes the primary key, through real pipelines (MariaDB binlog, PostgreSQL
wal2json) to Kafka exactly-once with ``tombstones_on_delete``, NATS and Redis.

Each sink gets what Debezium emits: a delete of the old key, then a create of the new key,
each keyed (on Kafka: partitioned) by its own key, with ``__debezium.newkey`` on the delete and
``__debezium.oldkey`` on the create, in the source transaction's sub-batch. On Kafka a
tombstone (null value, the old key) follows the delete, so a compacted topic keeps no row
under the old key: folding the topic by key as a compacting consumer does gives the table.
"""

from __future__ import annotations

import json
import textwrap
import uuid

import psycopg2
import pymysql
import pytest
import redis
from tidegate import bounds_step
from tidegate.parts import Parts
from tidegate.run import RunContext
from tidegate.sinks.kafka.partition import murmur2_partition
from tidegate.spec import load_spec
from tidegate.store import open_store

from tests.integration.sink_readers import kafka_records, nats_messages
from tests.runs import whole_run

pytestmark = pytest.mark.integration

PARTITIONS = 4


def spec_for(tmp_path, pipeline: str, source: str):
    path = tmp_path / f"{pipeline}.yaml"
    path.write_text(textwrap.dedent(f"""
        pipeline: {pipeline}
        source: {source}
        batch: {{max_events: 1}}
        sinks:
          - {{id: events, kind: kafka, conn_id: kafka, topic: "{{pipeline}}.{{table}}", exactly_once: true,
              partitions: {PARTITIONS}, tombstones_on_delete: true}}
          - {{id: bus, kind: nats, conn_id: nats, stream: {pipeline.upper()},
              subject: "{{pipeline}}.{{table}}"}}
          - {{id: cache, kind: redis, conn_id: redis, stream: "{{pipeline}}:{{table}}"}}
    """))
    return load_spec(str(path))



def check_sinks(pipeline: str, table: str, kafka_bootstrap: str, nats_conn, redis_conn, final: dict) -> None:
    """The key change on every sink, and the compacted Kafka topic folds to ``final``."""
    records = [(p, k, v, dict(h)) for p, k, v, h in
               kafka_records(kafka_bootstrap, f"{pipeline}.{table}", PARTITIONS)]
    by_key: dict[bytes, bytes | None] = {}
    for _, key, value, _ in records:
        by_key[key] = value
    folded = {json.loads(k)["id"]: json.loads(v)["after"] for k, v in by_key.items() if v is not None}
    assert folded == final
    gone = [r for r in records if r[3].get("op") == b"d"]
    made = [r for r in records if "__debezium.oldkey" in r[3]]
    tomb = [r for r in records if r[2] is None]
    assert len(gone) == len(made) == len(tomb) == 1, records
    (pg, kg, vg, hg), (pm, km, vm, hm), (pt, kt, _, ht) = gone[0], made[0], tomb[0]
    assert (kg, kt, km) == (b'{"id":1}', b'{"id":1}', b'{"id":100}')
    assert (pg, pt, pm) == (murmur2_partition(kg, PARTITIONS), murmur2_partition(kg, PARTITIONS),
                            murmur2_partition(km, PARTITIONS))
    assert hg["__debezium.newkey"] == b'{"id":100}' and hm["__debezium.oldkey"] == b'{"id":1}'
    assert ht["idempotency_key"] == hg["idempotency_key"] + b"|tombstone"
    envelope_d, envelope_c = json.loads(vg), json.loads(vm)
    assert (envelope_d["op"], envelope_d["before"]["id"], envelope_d["after"]) == ("d", 1, None)
    assert (envelope_c["op"], envelope_c["before"], envelope_c["after"]["id"]) == ("c", None, 100)
    assert envelope_d["source"]["tx_id"] == envelope_c["source"]["tx_id"]
    # NATS: the same two events with the same headers, in order
    msgs = nats_messages(nats_conn, pipeline.upper(), f"{pipeline}.{table}")
    assert [(m["op"], m["key"]) for m, _ in msgs] == [("c", {"id": 1}), ("c", {"id": 2}), ("u", {"id": 2}),
                                                      ("d", {"id": 1}), ("c", {"id": 100})]
    assert msgs[3][1]["__debezium.newkey"] == '{"id":100}' and msgs[4][1]["__debezium.oldkey"] == '{"id":1}'
    # Redis: fields beside the event
    r = redis.Redis(host="127.0.0.1", port=redis_conn.port, username=redis_conn.login,
                    password=redis_conn.password)
    try:
        entries = [f for _, f in r.xrange(f"{pipeline}:{table}")]
    finally:
        r.close()
    assert [json.loads(f[b"event"])["op"] for f in entries] == ["c", "c", "u", "d", "c"]
    assert entries[3][b"__debezium.newkey"] == b'{"id":100}'
    assert entries[4][b"__debezium.oldkey"] == b'{"id":1}'


WRITES = ["INSERT INTO {t} VALUES (1, 'a')", "INSERT INTO {t} VALUES (2, 'b')",
          "UPDATE {t} SET v = 'b2' WHERE id = 2", "UPDATE {t} SET id = 100, v = 'moved' WHERE id = 1"]
FINAL = {2: {"id": 2, "v": "b2"}, 100: {"id": 100, "v": "moved"}}


def test_mariadb_primary_key_update_is_a_delete_and_a_create_on_every_sink(
        mysql, kafka, kafka_bootstrap, nats_service, redis_service, tmp_path):
    tag = uuid.uuid4().hex[:6]
    db, pipeline = f"kc_{tag}", f"kc_{tag}"
    spec = spec_for(tmp_path, pipeline, f"{{kind: mysql, conn_id: src, tables: [{db}.t], server_id: 48501, "
                                        f"start: head}}")
    conns = {"src": mysql.cdc, "kafka": kafka.cdc, "nats": nats_service.cdc, "redis": redis_service.cdc}
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    try:
        with admin.cursor() as c:
            c.execute(f"CREATE DATABASE {db}")
            c.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(10))")
            bounds_step.prepare_bounds(RunContext(spec, parts=Parts(conns.__getitem__), store=store))
            for w in WRITES:
                c.execute(w.format(t=f"{db}.t"))
        report = whole_run(RunContext(spec, run_id="r1", parts=Parts(conns.__getitem__),
                                      store=store))
        # max_events 1: the delete and create stay together (deliveries: a last sub-batch may
        # move the checkpoint past other databases' transactions without an event)
        assert [s["deliveries"] for s in report["sinks"]] == [len(WRITES)] * 3
        assert report["events"] == len(WRITES) + 1
        check_sinks(pipeline, "t", kafka_bootstrap, nats_service.cdc, redis_service.cdc, FINAL)
    finally:
        with admin.cursor() as c:
            c.execute(f"DROP DATABASE IF EXISTS {db}")
        admin.close()
        store.close()


def test_postgres_primary_key_update_is_a_delete_and_a_create_on_every_sink(
        postgres, kafka, kafka_bootstrap, nats_service, redis_service, tmp_path):
    tag = uuid.uuid4().hex[:6]
    pipeline = f"kcpg_{tag}"
    spec = spec_for(tmp_path, pipeline, f"{{kind: postgres, conn_id: src, slot: {pipeline}, "
                                        f"tables: [public.{pipeline}], start: head}}")
    conns = {"src": postgres.cdc, "kafka": kafka.cdc, "nats": nats_service.cdc, "redis": redis_service.cdc}
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    admin = psycopg2.connect(postgres.admin_dsn)
    admin.autocommit = True
    try:
        with admin.cursor() as c:
            c.execute(f"CREATE TABLE public.{pipeline} (id INT PRIMARY KEY, v VARCHAR(10))")
            c.execute(f"GRANT SELECT ON public.{pipeline} TO {postgres.cdc.login}")
            c.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (pipeline,))
            bounds_step.prepare_bounds(RunContext(spec, parts=Parts(conns.__getitem__), store=store))
            for w in WRITES:
                c.execute(w.format(t=f"public.{pipeline}"))
        report = whole_run(RunContext(spec, run_id="r1", parts=Parts(conns.__getitem__),
                                      store=store))
        # max_events 1: the delete and create stay together. (A last sub-batch with no event
        # may move the checkpoint past WAL the server wrote after the writes: deliveries count.)
        assert [s["deliveries"] for s in report["sinks"]] == [len(WRITES)] * 3
        assert report["events"] == len(WRITES) + 1
        check_sinks(pipeline, pipeline, kafka_bootstrap, nats_service.cdc, redis_service.cdc, FINAL)
    finally:
        with admin.cursor() as c:
            c.execute(f"DROP TABLE IF EXISTS public.{pipeline}")
            c.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                      "WHERE slot_name = %s", (pipeline,))
        admin.close()
        store.close()
