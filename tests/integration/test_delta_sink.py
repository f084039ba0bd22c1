"""The Delta sink against real Delta tables (delta-spark on a local[2] session): merge mode ends
equal to the rows a model of the source holds, changelog mode holds every change once, and a
sub-batch delivered again (a retry after a crash, a replay) changes nothing. Then the merge's
reduction case by case: many changes of one key in one sub-batch, a delete then a re-insert, a
key change and a key change into a freed key, a snapshot that resets the table, a column the
source added (the table gains it; rows without it hold null)."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
from test_sink_support import FILE, end_pos, pipeline_spec, unique
from tidegate.batching import SubBatch, Transaction
from tidegate.errors import OperatorSinkError
from tidegate.events import ChangeEvent, ControlMessage, split_key_change
from tidegate.sink_checkpoints import RunStart
from tidegate.sinks.delta import ledger
from tidegate.sinks.delta.sink import DeltaSink
from tidegate.sinks.delta.spec import DeltaSinkSpec
from tidegate.store.records import CheckpointRecord

from tests.integration.local_spark import local_session

pytestmark = pytest.mark.integration


def change(name: str, tx_no: int, i: int, op: str, before, after, key, **kw) -> ChangeEvent:
    return ChangeEvent.build(
        tenant="acme", pipeline=name, connector="mysql", db="shop", schema="shop", table="items", op=op,
        before=before, after=after, key=key, tx_id=f"0-1-{tx_no}", event_id=f"{FILE}:{tx_no * 1000 + i}:0",
        position={"file": FILE, "pos": tx_no * 1000 + i}, ts_ms=1_764_000_000_000 + tx_no * 1000,
        total_order=i + 1, data_collection_order=i + 1, **kw)


def workload(name: str, seed: int = 7, per_batch: int = 10) -> tuple[list[SubBatch], dict]:
    """30 transactions of inserts, updates (some changing the key), deletes, ``per_batch`` to a
    sub-batch (three by default); and the rows a source table holds after them (the model)."""
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
    batches = [SubBatch(n + 1, tuple(txs[n * per_batch:(n + 1) * per_batch])) for n in range(30 // per_batch)]
    return batches, rows


@pytest.fixture(scope="module")
def spark():
    s = local_session("tidegate-delta-test", conf={"spark.sql.shuffle.partitions": "2"})
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


def tx_of(name: str, tx_no: int, *changes: tuple) -> Transaction:
    """Transaction ``tx_no`` of ``changes``: ("c", row), ("u", old, new), ("d", old), ("r", row)
    (a snapshot row), ("k", old, new) (an UPDATE of the key: a delete and a create), or
    ("snapshot_started",) (a snapshot of shop.items begins)."""
    evs: list = []
    for ch in changes:
        op, i = ch[0], len(evs)
        if op == "snapshot_started":
            evs.append(ControlMessage("acme", name, "snapshot_started", f"snap-{tx_no}",
                                      {"file": FILE, "pos": tx_no * 1000 + i}, 1_764_000_000_000,
                                      {"snapshot": f"snap-{tx_no}", "tables": ["shop.items"]}))
        elif op == "k":
            upd = change(name, tx_no, i, "u", ch[1], ch[2], {"id": ch[2]["id"]})
            evs.extend(split_key_change(upd, {"id": ch[1]["id"]}))
        else:
            before = ch[1] if op in ("u", "d") else None
            after = None if op == "d" else ch[-1]
            evs.append(change(name, tx_no, i, op, before, after, {"id": ch[1]["id"]},
                              snapshot="true" if op == "r" else "false"))
    evs[-1].__dict__.update(tx_end=True, end_position=end_pos(tx_no))
    return Transaction(f"0-1-{tx_no}", end_pos(tx_no), tuple(evs))


def row(i: int, name: str, qty: int = 0) -> dict:
    return {"id": i, "name": name, "qty": qty}


def test_merge_reduction_case_by_case(spark, tmp_path):
    """Each sub-batch's table, exactly: the last change per key in log order wins, whatever came
    before it in the sub-batch."""
    name = unique("dr")
    sink = sink_of(name, tmp_path, "merge")
    r = {i: row(i, f"n{i}") for i in range(1, 6)}
    sub_batches = [
        [tx_of(name, 1, *[("c", r[i]) for i in range(1, 6)])],
        [tx_of(name, 2, ("u", r[1], row(1, "n1", 10)), ("u", row(1, "n1", 10), row(1, "n1", 11)),
               ("d", r[2]), ("c", row(2, "2 again", 2))),  # one key three times; delete, re-insert
         tx_of(name, 3, ("u", row(1, "n1", 11), row(1, "n1", 12)),
               ("c", row(6, "n6")), ("d", row(6, "n6")),  # a new key created and deleted
               ("k", r[3], row(30, "n3")), ("u", row(30, "n3"), row(30, "30+"))),  # a key change, an update
         tx_of(name, 4, ("k", r[5], row(50, "n5")), ("k", r[4], row(5, "n4")))],  # into the key just freed
        [tx_of(name, 5, ("c", row(99, "before the snapshot"))),
         tx_of(name, 6, ("snapshot_started",), ("r", row(1, "snap")), ("r", row(7, "snap"))),
         tx_of(name, 7, ("u", row(7, "snap"), row(7, "snap", 70)))],
        [tx_of(name, 8, ("snapshot_started",))],  # a snapshot of a table now empty
        [tx_of(name, 9, ("c", {**row(8, "n8"), "color": "red"}), ("c", row(9, "n9")))],  # a column added
        [tx_of(name, 10, ("u", {**row(8, "n8"), "color": "red"}, {**row(8, "n8"), "color": "blue"}),
               ("c", {**row(10, "n10"), "color": "green"}))],  # the table has it now: no second ALTER
    ]
    want = [
        [r[1], r[2], r[3], r[4], r[5]],
        [row(1, "n1", 12), row(2, "2 again", 2), row(5, "n4"), row(30, "30+"), row(50, "n5")],
        [row(1, "snap"), row(7, "snap", 70)],
        [],
        [{**row(8, "n8"), "color": "red"}, {**row(9, "n9"), "color": None}],
        [{**row(8, "n8"), "color": "blue"}, {**row(9, "n9"), "color": None},
         {**row(10, "n10"), "color": "green"}],
    ]
    got = []
    for version, txs in enumerate(sub_batches, start=1):
        sink.deliver(SubBatch(version, tuple(txs)), version)
        table = spark.read.format("delta").load(f"{tmp_path}/{name}/shop/items")
        got.append(sorted((x.asDict() for x in table.collect()), key=lambda d: d["id"]))
    assert got == want


def test_a_bigint_column_widens_and_a_value_that_does_not_fit_fails_naming_it(spark, tmp_path):
    """A column typed bigint by its first values: an integer past bigint's range (a MariaDB BIGINT
    UNSIGNED over 2^63-1) widens it to decimal(38,0), the values already there kept (Spark's JSON
    parser wrote it as null before: campaign seed 7020 TYPES=edges); a text in it (the source
    retyped the column) fails the sub-batch naming the column, and nothing of it is written."""
    from tidegate.errors import NonRetryableSinkError

    name = unique("dw")
    for mode, where in (("merge", tmp_path / "m"), ("changelog", tmp_path / "c")):
        sink = sink_of(name, where, mode)
        sink.deliver(SubBatch(1, (tx_of(name, 1, ("c", row(1, "small", 5))),)), 1)
        sink.deliver(SubBatch(2, (tx_of(name, 2, ("u", row(1, "small", 5), row(1, "big", 2**64 - 1)),
                                      ("c", row(2, "max", 2**63 - 1))),)), 2)
        with pytest.raises(NonRetryableSinkError, match=r"column 'qty' is decimal\(38,0\) and a change holds "
                                                        r"str 'many'.*nothing was written"):
            retyped = ("u", row(2, "max", 2**63 - 1), row(2, "t", "many"))
            sink.deliver(SubBatch(3, (tx_of(name, 3, retyped),)), 3)
        assert sink.committed_checkpoint().position == end_pos(2)
        table = spark.read.format("delta").load(f"{where}/{name}/shop/items")
        rows = [x.asDict(recursive=True) for x in table.collect()]
        if mode == "merge":
            assert table.schema["qty"].dataType.simpleString() == "decimal(38,0)"
            assert sorted((r["id"], r["name"], r["qty"]) for r in rows) == [(1, "big", 2**64 - 1),
                                                                            (2, "max", 2**63 - 1)]
        else:
            assert table.schema["after"].dataType["qty"].dataType.simpleString() == "decimal(38,0)"
            assert sorted((r["op"], r["after"]["qty"]) for r in rows) == [("c", 5), ("c", 2**63 - 1),
                                                                         ("u", 2**64 - 1)]


def store_version(name: str, version: int, batch: SubBatch, kind: str = "write",
                  source_version: int | None = None) -> CheckpointRecord:
    """A version of the sink's checkpoint in the store, as a run (``write``) or a rewind wrote it."""
    return CheckpointRecord(name, "lake", version, batch.end_position, None, None, "2026-12-07T00:00:00Z",
                            kind=kind, source_version=source_version)


def reopened(name: str, tmp_path, mode: str, history: list[CheckpointRecord]) -> DeltaSink:
    """The sink as the next run opens it: from the store's current version (the coordinator's
    RunStart: the range starts at that version's position)."""
    sink = sink_of(name, tmp_path, mode)
    sink.run_start = RunStart(history[-1].position, history[-1], tuple(history))
    return sink


def versions(spark, path: str) -> int:
    return spark.sql(f"DESCRIBE HISTORY delta.`{path}`").agg({"version": "max"}).collect()[0][0]


def test_a_table_restored_behind_the_sinks_commits_is_told_then_mended_by_the_rewind_it_names(
        spark, tmp_path):
    """`RESTORE TABLE` (Delta's undo) takes each table back to its first sub-batch's commit after
    the second, between two sub-batches of one run, which goes on unaware. The next run that
    touches it is refused (OperatorSinkError, nothing written) with the two rewinds named, and
    after the one that delivers them again the merged table equals the source's rows (the third
    sub-batch, which the run MERGEd over the restored rows, is written again after the second:
    campaign seed 9805 kept a row the source had deleted when it was not) and the changelog holds
    every change exactly once (the third is not written twice). Before the lineage was read
    (2026-12-07) every run went on as if the table held the second: 30 source rows became 25, 7
    missing, 1 stale, 2 deleted at the source still there, and a rewind mended nothing. (A RESTORE
    between two runs, and going on without the changes: test_delta_e2e.py.)"""
    name = unique("dr")
    batches, model = workload(name)
    rewind = f"tidegate checkpoints rewind {name} lake --to-version"
    for mode in ("merge", "changelog"):
        sink = sink_of(name, tmp_path / mode, mode)
        path = f"{tmp_path}/{mode}/{name}/shop/items"
        sink.deliver(batches[0], 1)
        first = versions(spark, path)
        sink.deliver(batches[1], 2)
        spark.sql(f"RESTORE TABLE delta.`{path}` TO VERSION AS OF {first}")
        sink.deliver(batches[2], 3)
        sink.close()
        history = [store_version(name, v + 1, b) for v, b in enumerate(batches)]
        restored = versions(spark, path)
        sink = reopened(name, tmp_path / mode, mode, history)
        with pytest.raises(OperatorSinkError) as err:
            sink.deliver(batches[2], 3)  # a replay, or any sub-batch with a change of the table
        said = str(err.value)
        assert (f"`{rewind} 1 --reason ...` (delivers them again) or `{rewind} 3 --reason ...` "
                f"(goes on without them)") in said, said
        assert f"up to {batches[0].end_position} only, not up to {batches[1].end_position}" in said, said
        assert versions(spark, path) == restored  # nothing written
        sink.close()
        history.append(store_version(name, 4, batches[0], "rewind", source_version=1))
        sink = reopened(name, tmp_path / mode, mode, history)
        sink.deliver(batches[1], 4)
        sink.deliver(batches[2], 5)
        sink.close()
        table = spark.read.format("delta").load(path).collect()
        if mode == "merge":
            assert {r["id"]: r.asDict() for r in table} == model
        else:
            keys = Counter(r["idempotency_key"] for r in table)
            assert sorted(keys) == sorted(ev.idempotency_key for b in batches for ev in b.events)
            assert set(keys.values()) == {1}


def test_a_table_restored_while_a_long_run_writes_it_is_told_by_that_run_before_it_leaves_the_window(
        spark, tmp_path):
    """A changelog table restored to its first sub-batch's commit after the second, while a run of
    30 sub-batches writes it. The run reads the table's lineage again after RECHECK_COMMITS commits
    and stops there, before writing more (the next run reads the newest 50 commits first: 50
    commits of a run unaware of the RESTORE would have buried it, and the loss was never told).
    The next run names the rewinds; the one that delivers again leaves every change once."""
    name = unique("dw")
    batches, _ = workload(name, per_batch=1)
    sink = sink_of(name, tmp_path, "changelog")
    path = f"{tmp_path}/{name}/shop/items"
    sink.deliver(batches[0], 1)
    first = versions(spark, path)
    sink.deliver(batches[1], 2)
    spark.sql(f"RESTORE TABLE delta.`{path}` TO VERSION AS OF {first}")
    delivered = 2
    with pytest.raises(OperatorSinkError) as err:
        for n in range(2, len(batches)):
            sink.deliver(batches[n], n + 1)
            delivered = n + 1
    assert delivered == ledger.RECHECK_COMMITS  # refused at the next sub-batch, before its commit
    assert "a RESTORE took table" in str(err.value) and "while this run wrote it" in str(err.value)
    sink.close()
    written = versions(spark, path)
    history = [store_version(name, v + 1, b) for v, b in enumerate(batches[:delivered])]
    sink = reopened(name, tmp_path, "changelog", history)
    with pytest.raises(OperatorSinkError) as err:
        sink.deliver(batches[delivered], delivered + 1)
    rewind = f"tidegate checkpoints rewind {name} lake --to-version"
    assert f"`{rewind} 1 --reason ...` (delivers them again)" in str(err.value), str(err.value)
    assert versions(spark, path) == written
    sink.close()
    rewound = delivered + 1
    history.append(store_version(name, rewound, batches[0], "rewind", source_version=1))
    sink = reopened(name, tmp_path, "changelog", history)
    for n, part in enumerate((batches[1:10], batches[10:20], batches[20:])):  # larger sub-batches
        sink.deliver(SubBatch(n + 1, tuple(tx for b in part for tx in b.transactions)), rewound + n)
    sink.close()
    keys = Counter(r["idempotency_key"] for r in spark.read.format("delta").load(path).collect())
    assert sorted(keys) == sorted(ev.idempotency_key for b in batches for ev in b.events)
    assert set(keys.values()) == {1}
