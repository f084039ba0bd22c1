"""Two builds of the same input give byte-identical events, keys and ids (replays dedup)."""

import dataclasses
import datetime as dt
import decimal
import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from tidegate.events import ChangeEvent, encode_value, event_uuid, split_key_change
from tidegate.shipped import item_to_row, row_to_item
from tidegate.sources.mysql.position import BinlogPosition

ROOT = Path(__file__).resolve().parents[2]


def build_events() -> list[ChangeEvent]:
    rows = []
    for i in range(50):
        after = {"id": i, "price": decimal.Decimal("12.3400"), "blob": bytes([i, 0, 255]),
                 "at": dt.datetime(2026, 1, 2, 3, 4, 5, 6789, tzinfo=dt.UTC),
                 "day": dt.date(2026, 1, 2), "dur": dt.timedelta(hours=-30, microseconds=5),
                 "tags": {"b", "a"}, "doc": {"z": 1, "a": [1, "ü"]}, "none": None,
                 "f": float("nan") if i == 3 else 1.5, "u": uuid.UUID(int=i)}
        rows.append(ChangeEvent.build(
            tenant="acme", pipeline="orders", connector="mysql", db="shop", schema="shop",
            table="orders", op="u" if i % 2 else "c", before={"id": i} if i % 2 else None, after=after,
            key={"id": i}, tx_id=f"0-1-{i // 5}", event_id=f"mysql-bin.000001:{100 + i}:0",
            position={"file": "mysql-bin.000001", "pos": 100 + i}, ts_ms=1_764_000_000_000,
            total_order=i % 5 + 1, data_collection_order=i % 5 + 1, tx_end=i % 5 == 4,
            end_position=BinlogPosition("mysql-bin.000001", 200 + i) if i % 5 == 4 else None))
    return rows


def digest() -> str:
    h = hashlib.sha256()
    for e in build_events():
        for part in (e.value, e.key_bytes, e.id.encode(), e.idempotency_key.encode()):
            h.update(len(part).to_bytes(4, "big") + part)
    return h.hexdigest()


def test_byte_identical_across_builds_in_one_process():
    a, b = build_events(), build_events()
    assert [e.value for e in a] == [e.value for e in b]
    assert [e.key_bytes for e in a] == [e.key_bytes for e in b]
    assert [e.id for e in a] == [e.id for e in b]


def test_byte_identical_across_processes_and_hash_seeds():
    paths = [str(ROOT / "include"), str(Path(__file__).parent)]
    code = f"import sys; sys.path[:0] = {paths!r}; import test_events; print(test_events.digest())"
    outs = set()
    for seed in ("1", "2", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        outs.add(r.stdout.strip())
    assert outs == {digest()}


def test_envelope_fields_and_encoding():
    e = build_events()[3]
    env = json.loads(e.value)
    assert env["idempotency_key"] == "acme|orders|shop.orders|0-1-0|mysql-bin.000001:103:0"
    assert env["id"] == str(uuid.uuid5(uuid.UUID("6f1c2a9e-5b0d-4c1e-9d3a-7a2e8b4c0d11"),
                                       env["idempotency_key"])) == event_uuid(env["idempotency_key"])
    a = env["after"]
    assert a["price"] == "12.3400" and a["blob"] == "AwD/" and a["f"] == "NaN"
    assert a["at"] == "2026-01-02T03:04:05.006789+00:00" and a["dur"] == "-29:59:59.999995"
    assert a["tags"] == ["a", "b"] and a["doc"] == {"z": 1, "a": [1, "ü"]}
    assert set(env) == {"id", "idempotency_key", "op", "before", "after", "key", "source",
                        "transaction", "ts_ms"}
    assert env["transaction"] == {"id": "0-1-0", "total_order": 4, "data_collection_order": 4}
    assert e.key_bytes == b'{"id":3}'
    assert encode_value(dt.timedelta(hours=25, seconds=1)) == "25:00:01"


def test_a_primary_key_change_splits_into_a_delete_and_a_create_that_travel_with_their_headers():
    update = ChangeEvent.build(
        tenant="acme", pipeline="orders", connector="mysql", db="shop", schema="shop", table="orders",
        op="u", before={"id": 1, "v": "a"}, after={"id": 9, "v": "b"}, key={"id": 9}, tx_id="0-1-7",
        event_id="mysql-bin.000001:300:0", position={"file": "mysql-bin.000001", "pos": 300},
        ts_ms=1_764_000_000_000, total_order=3, data_collection_order=2)
    gone, made = split_key_change(update, {"id": 1})
    assert [(e.op, e.key, e.before, e.after) for e in (gone, made)] == [
        ("d", {"id": 1}, {"id": 1, "v": "a"}, None), ("c", {"id": 9}, None, {"id": 9, "v": "b"})]
    assert (gone.key_bytes, made.key_bytes) == (b'{"id":1}', b'{"id":9}')
    assert gone.headers == {"__debezium.newkey": b'{"id":9}'}
    assert made.headers == {"__debezium.oldkey": b'{"id":1}'}
    assert [(e.total_order, e.data_collection_order) for e in (gone, made)] == [(3, 2), (4, 3)]
    assert [e.idempotency_key for e in (gone, made)] == [
        "acme|orders|shop.orders|0-1-7|mysql-bin.000001:300:0:d",
        "acme|orders|shop.orders|0-1-7|mysql-bin.000001:300:0:c"]
    assert update.headers is None
    # through a Spark task or a reader process, as a flat row
    shipped = [row_to_item(item_to_row(e)) for e in (gone, made, update)]
    assert [e.headers for e in shipped] == [gone.headers, made.headers, None]
    assert [e.value for e in shipped] == [gone.value, made.value, update.value]


def test_the_last_row_of_a_transaction_is_a_marked_copy_and_the_held_event_is_never_written():
    """A source holds one event back until it knows the transaction's end: ending() gives a copy
    marked as the last row, with the bytes already written; the event it was made from, which a
    reader may hold too, stays as it was. Shipped events end the same way."""
    first = build_events()[0]
    value, key, ident = first.value, first.key_bytes, first.id  # derived before the end is known
    before = dict(first.__dict__)
    end = BinlogPosition("mysql-bin.000001", 999)
    last = first.ending(end)
    assert first.__dict__ == before and (first.tx_end, first.end_position) == (False, None)
    assert (last.tx_end, last.end_position) == (True, end)
    assert (last.value, last.key_bytes, last.id) == (value, key, ident)
    assert last == dataclasses.replace(first, tx_end=True, end_position=end)
    shipped = row_to_item(item_to_row(first))
    shipped_last = shipped.ending(end)
    assert (shipped.tx_end, shipped_last.tx_end, shipped_last.end_position) == (False, True, end)
    assert type(shipped_last) is type(shipped) and shipped_last.value == value
    assert shipped_last.after == first.after  # a field that did not travel: still read from the bytes
