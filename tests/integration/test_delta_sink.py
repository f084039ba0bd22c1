"""The Delta sink against real Delta tables (delta-spark on a local[2] session): merge mode ends
equal to the rows a model of the source holds, changelog mode holds every change once, and a
sub-batch delivered again (a retry after a crash, a replay) changes nothing."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
from test_sink_support import FILE, end_pos, pipeline_spec, unique
from tidegate.batching import SubBatch, Transaction
from tidegate.events import ChangeEvent, split_key_change
from tidegate.sinks.delta.sink import DeltaSink
from tidegate.sinks.delta.spec import DeltaSinkSpec

pytestmark = pytest.mark.integration


def change(name: str, tx_no: int, i: int, op: str, before, after, key, **kw) -> ChangeEvent:
    return ChangeEvent.build(
        tenant="acme", pipeline=name, connector="mysql", db="shop", schema="shop", table="items", op=op,
        before=before, after=after, key=key, tx_id=f"0-1-{tx_no}", event_id=f"{FILE}:{tx_no * 1000 + i}:0",
        position={"file": FILE, "pos": tx_no * 1000 + i}, ts_ms=1_764_000_000_000 + tx_no * 1000,
        total_order=i + 1, data_collection_order=i + 1, **kw)


def workload(name: str, seed: int = 7) -> tuple[list[SubBatch], dict]:
    """Three sub-batches of inserts, updates (some changing the key), deletes; and the rows a
    source table holds after them (the model)."""
    rnd = random.Random(seed)
    rows: dict[int, dict] = {}
    txs, next_id = [], 1
    for tx_no in range(1, 31):
        evs = []
        for _ in range(rnd.randint(1, 6)):
            pick = rnd.random()
            if not rows or pick < 0.4:
                row = {"id": next_id, "name": f"n{next_id}", "qty": rnd.randint(0, 9), "price": "1.50",
                       "ok": rnd.random() < 0.5, "ratio": rnd.random()}
                next_id += 1
                rows[row["id"]] = row
                evs.append(change(name, tx_no, len(evs), "c", None, row, {"id": row["id"]}))
            elif pick < 0.75:
                old = rows[rnd.choice(sorted(rows))]
                new = {**old, "qty": old["qty"] + 1, "name": old["name"] + "+"}
                rows[old["id"]] = new
                evs.append(change(name, tx_no, len(evs), "u", old, new, {"id": old["id"]}))
            elif pick < 0.88:
                old = rows.pop(rnd.choice(sorted(rows)))
                new = {**old, "id": next_id}
                next_id += 1
                rows[new["id"]] = new
                upd = change(name, tx_no, len(evs), "u", old, new, {"id": new["id"]})
                evs.extend(split_key_change(upd, {"id": old["id"]}))
            else:
                old = rows.pop(rnd.choice(sorted(rows)))
                evs.append(change(name, tx_no, len(evs), "d", old, None, {"id": old["id"]}))
        last = evs[-1]
        last.__dict__.update(tx_end=True, end_position=end_pos(tx_no))
        txs.append(Transaction(f"0-1-{tx_no}", end_pos(tx_no), tuple(evs)))
    batches = [SubBatch(n + 1, tuple(txs[n * 10:(n + 1) * 10])) for n in range(3)]
    return batches, rows


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession
    from tidegate.sinks.delta.jars import spark_conf

    b = (SparkSession.builder.master("local[2]").appName("tidegate-delta-test")
         .config("spark.ui.enabled", "false"))
    for k, v in spark_conf().items():
        b = b.config(k, v)
    s = b.config("spark.sql.shuffle.partitions", "2").getOrCreate()
    yield s
    s.stop()


def sink_of(name: str, tmp_path, mode: str) -> DeltaSink:
    spec = DeltaSinkSpec(id="lake", kind="delta", conn_id="", mode=mode,
                         path=str(tmp_path) + "/{pipeline}/{schema}/{table}")
    sink = DeltaSink(pipeline_spec(name, spec), spec, None)
    sink.open()
    return sink


def test_merge_and_changelog_exact_across_retries_and_replays(spark, tmp_path):
    name = unique("dl")
    batches, model = workload(name)
    merge, log = sink_of(name, tmp_path, "merge"), sink_of(name, tmp_path / "cl", "changelog")
    for sink in (merge, log):
        assert sink.committed_checkpoint() is None
        for version, b in enumerate(batches, start=1):
            sink.deliver(b, version)
        sink.deliver(batches[1], 2)  # a retry of an old sub-batch: Delta skips it
        sink.deliver(batches[0], 3)  # a replay under the current version: the table holds it
        rec = sink.committed_checkpoint()
        assert rec.position == batches[-1].end_position and rec.extends == 3
    merged = spark.read.format("delta").load(f"{tmp_path}/{name}/shop/items").collect()
    got = {r["id"]: r.asDict() for r in merged}
    assert got == model
    cl = spark.read.format("delta").load(f"{tmp_path}/cl/{name}/shop/items").collect()
    keys = Counter(r["idempotency_key"] for r in cl)
    sent = [ev.idempotency_key for b in batches for ev in b.events]
    assert sorted(keys) == sorted(sent) and set(keys.values()) == {1}
    one = next(r for r in cl if r["op"] == "u")
    assert isinstance(one["after"]["qty"], int) and isinstance(one["before"]["ratio"], float)
    assert json.loads(one["position"])["file"] == FILE
