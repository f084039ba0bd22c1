"""The deliver task's asset events and OpenLineage datasets, from a run report (the real
Airflow outlet accessors; no server: the end-to-end proof is tests/integration/
test_airflow_scheduler.py, "assets and lineage")."""

from __future__ import annotations

from types import SimpleNamespace

from airflow.sdk import Asset
from airflow.sdk.execution_time.context import OutletEventAccessors
from tidegate.connections import Connection
from tidegate.datasets import table_dataset, target_dataset
from tidegate.lineage import SourceTable
from tidegate.spec import load_spec_text
from tidegate_airflow.assets import delivered_alias, emit_asset_events

SPEC = """
pipeline: shop
source: {kind: mysql, conn_id: db, tables: [shop.orders, shop.customers]}
sinks:
  - {id: events, kind: kafka, conn_id: kafka, topic: "{pipeline}.{table}"}
  - {id: cache, kind: redis, conn_id: redis, stream: "{pipeline}:{table}"}
"""
CONNECTIONS = {
    "kafka": Connection("kafka", "kafka", extra={"bootstrap.servers": "k1:9092,k2:9092",
                                                 "sasl.password": "s3cret"}),
    "redis": Connection("redis", "redis", host="r", port=6380, login="u", password="s3cret", schema="2"),
}


def report(kafka_targets, redis_targets):
    def sink(sid, kind, targets, start, end):
        return {"id": sid, "kind": kind, "start": start, "end": end, "events": 5, "bytes": 500,
                "targets": targets}
    return {"pipeline": "shop", "run_id": "manual__1", "sinks": [
        sink("events", "kafka", kafka_targets, {"file": "b.1", "pos": 4}, {"file": "b.1", "pos": 900}),
        sink("cache", "redis", redis_targets, {"file": "b.1", "pos": 4}, {"file": "b.1", "pos": 900})]}


def test_targets_follow_airflow_and_openlineage_naming_and_hold_no_secret():
    kafka = target_dataset("kafka", CONNECTIONS["kafka"], "shop.orders")
    assert (kafka.namespace, kafka.name, kafka.uri) == ("kafka://k1:9092", "shop.orders", "kafka://k1:9092/shop.orders")
    assert target_dataset("redis", CONNECTIONS["redis"], "shop:orders").uri == "redis://r:6380/2/shop:orders"
    nats_conn = Connection("n", "nats", host="nats://n1", port=4223, password="t0ken")
    nats = target_dataset("nats", nats_conn, "a.b")
    assert nats.uri == "nats://n1:4223/a.b"
    assert target_dataset("delta", None, "/lake/shop/orders").uri == "file:///lake/shop/orders"
    assert target_dataset("delta", None, "s3a://lake/shop/orders").uri == "s3://lake/shop/orders"
    assert target_dataset("delta", None, "abfss://c@acct.dfs.core.windows.net/t").uri == \
        "abfss://c@acct.dfs.core.windows.net/t"
    for t in (kafka, nats):
        assert "s3cret" not in t.uri and "t0ken" not in t.uri
    assert Asset(uri=kafka.uri).uri == kafka.uri  # Airflow keeps it as written (no normalization)
    table = SourceTable("shop.orders", "shopdb", (("id", "int"),))
    mysql = table_dataset("mysql", Connection("m", "mysql", host="db", password="s3cret"), table)
    assert (mysql.namespace, mysql.name) == ("mysql://db:3306", "shop.orders")
    pg = table_dataset("postgres", Connection("p", "postgres", host="pg", port=6432), table)
    assert (pg.namespace, pg.name) == ("postgres://pg:6432", "shopdb.shop.orders")


def test_one_asset_event_per_delivered_target_and_none_for_an_idle_run():
    spec = load_spec_text(SPEC)
    outlets = OutletEventAccessors()
    context = {"outlet_events": outlets}
    got = report({"shop.orders": {"events": 3, "tables": ["shop.orders"]},
                  "shop.customers": {"events": 2, "tables": ["shop.customers"]}},
                 {"shop:orders": {"events": 3, "tables": ["shop.orders"]}})
    uris = emit_asset_events(context, "shop", got, spec, CONNECTIONS.__getitem__)
    assert uris == ["kafka://k1:9092/shop.orders", "kafka://k1:9092/shop.customers",
                    "redis://r:6380/2/shop:orders"]
    events = outlets[delivered_alias("shop")].asset_alias_events
    assert [e.dest_asset_key.uri for e in events] == uris
    assert events[0].extra == {"pipeline": "shop", "run_id": "manual__1", "sink": "events", "kind": "kafka",
                               "from": {"file": "b.1", "pos": 4}, "to": {"file": "b.1", "pos": 900},
                               "events": 3, "tables": ["shop.orders"], "sink_events": 5, "sink_bytes": 500}

    idle = OutletEventAccessors()
    conn = CONNECTIONS.__getitem__
    assert emit_asset_events({"outlet_events": idle}, "shop", report({}, {}), spec, conn) == []
    assert emit_asset_events({}, "shop", None, spec, conn) == []  # no report (a remote driver): none
    assert idle[delivered_alias("shop")].asset_alias_events == []


def test_lineage_outputs_are_the_delivered_targets_with_their_counts():
    from tidegate_airflow.lineage import delivered_tables, output_datasets

    parts = SimpleNamespace(connection=CONNECTIONS.__getitem__)
    run = SimpleNamespace(spec=load_spec_text(SPEC), parts=parts)
    got = report({"shop.orders": {"events": 3, "tables": ["shop.orders"]}}, {})
    assert delivered_tables(got) == ["shop.orders"]
    [out] = output_datasets(run, got)
    assert (out.namespace, out.name, out.outputFacets["outputStatistics"].rowCount) == \
        ("kafka://k1:9092", "shop.orders", 3)
