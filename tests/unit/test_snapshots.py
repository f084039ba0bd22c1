"""Snapshots with a scripted source and recording sinks: the item stream, the handoff to the log,
resuming at the next chunk, resnapshot, and the positions, spec, plan and store parts."""

from __future__ import annotations

import dataclasses
import json

import pytest
from _tidegate_fakes import QuietSource, pos, stream, wire_fakes
from tidegate import bounds_step, guards, runner, snapshot
from tidegate.errors import CommitPolicyError, SnapshotError
from tidegate.events import ChangeEvent, ControlMessage, PositionMark, snapshot_mark
from tidegate.plan import RunParamsError, RunPlan
from tidegate.positions import SnapshotPosition, log_position, position_from_json
from tidegate.run import RunContext
from tidegate.shipped import item_to_row, row_to_item
from tidegate.snapshot import rows as snapshot_rows
from tidegate.sources.base import SnapshotReads, SnapshotTable
from tidegate.sources.mysql.position import BinlogPosition
from tidegate.sources.postgres.position import Lsn, PgPosition
from tidegate.spec import load_spec_text
from tidegate.store import open_store
from tidegate.store.records import SnapshotRecord

from tests.runs import whole_run

# --------------------------------------------------------------------------- positions


def test_a_snapshot_position_lies_just_before_its_handoff():
    h = pos(5)
    s0, s3 = SnapshotPosition("a", 0, h), SnapshotPosition("a", 3, h)
    assert s0 < s3 < h < pos(6) and pos(4) < s0 and s3 <= h and not s3 >= h
    assert h > s3 and pos(4) < s3 and min([pos(7), s3, pos(6)]) == s3
    assert s3 != h and h != s3 and s3 == SnapshotPosition("a", 3, pos(5))
    assert max(s0, s3) == s3
    # two snapshots: by handoff, then by (time-ordered) id
    assert SnapshotPosition("b", 0, pos(4)) < s0 < SnapshotPosition("b", 0, h)


def test_snapshot_position_json_lineage_and_log_position():
    h = BinlogPosition("mysql-bin.000003", 77, server_id=1)
    s = SnapshotPosition("20261125T101500123-ab12", 4, h)
    back = position_from_json(json.loads(json.dumps(s.to_json())))
    assert back == s and back.handoff == h and s.to_json()["snapshot"] == "20261125T101500123-ab12"
    assert s.lineage == h.lineage and log_position(s) == h and log_position(h) is h
    pg = SnapshotPosition("x", 1, PgPosition(Lsn.parse("0/10"), "7", 1))
    assert position_from_json(pg.to_json()) == pg
    assert s.bytes_to(BinlogPosition("mysql-bin.000003", 100, server_id=1)) == 23
    with pytest.raises(ValueError):
        SnapshotPosition("x", -1, h)


# --------------------------------------------------------------------------- events, spec, plan


def test_source_snapshot_is_a_string():
    assert [snapshot_mark(v) for v in (False, True, "last")] == ["false", "true", "last"]
    with pytest.raises(ValueError):
        snapshot_mark("yes")
    log_event = stream([1])[0]
    assert json.loads(log_event.value)["source"]["snapshot"] == "false"
    # a caller passing the former bool still gets the string
    ev = ChangeEvent.native("t", "p", "mysql", "d", "d", "x", "c", None, {"id": 1}, {"id": 1}, "tx", "e",
                            {}, 0, 1, 1, False)
    assert json.loads(ev.value)["source"]["snapshot"] == "false"


def test_spec_snapshot_settings():
    base = "pipeline: p\nsource: {kind: mysql, conn_id: c, start: snapshot}\nsinks: [{id: k, kind: kafka, " \
           "conn_id: k, topic: t}]\n"
    spec = load_spec_text(base)
    assert spec.source.start == "snapshot" and spec.snapshot.chunk_rows == 50_000
    assert spec.snapshot.parallelism == 4
    spec = load_spec_text(base + "snapshot: {chunk_rows: 10, parallelism: 2}\n")
    assert (spec.snapshot.chunk_rows, spec.snapshot.parallelism) == (10, 2)
    with pytest.raises(Exception) as e:
        load_spec_text(base + "snapshot: {chunk_rows: 0, rows: 3}\n")
    assert "snapshot.chunk_rows" in str(e.value) and "snapshot.rows: unknown field" in str(e.value)


def test_plan_resnapshot_and_tables():
    plan = RunPlan.from_values({"resolve": "resnapshot", "reason": "gap", "tables": "shop.a, shop.b"})
    assert plan.resolve == "resnapshot" and plan.tables == ["shop.a", "shop.b"]
    assert RunPlan.from_values({"resolve": "resnapshot", "reason": "r", "tables": []}).tables is None
    with pytest.raises(RunParamsError) as e:
        RunPlan.from_values({"resolve": "accept_gap", "reason": "r", "tables": ["shop.a"]})
    assert "only goes with resolve=resnapshot" in str(e.value)
    with pytest.raises(RunParamsError) as e:
        RunPlan.from_values({"resolve": "resnapshot", "reason": "r", "tables": ["a b"]})
    assert "malformed table name" in str(e.value)


# --------------------------------------------------------------------------- a scripted source


class SnapSource(QuietSource):
    """A log of transactions (positions 1000·n) over two tables whose current rows the test
    sets: ``orders`` (key id) and ``lines`` (composite key order_id, line)."""

    connector = "mysql"

    def __init__(self, sizes):
        self.sizes = list(sizes)
        self.tables = {"shop.orders": {(i,): {"id": i, "status": "new"} for i in range(1, 8)},
                       "shop.lines": {(o, n): {"order_id": o, "line": n, "sku": f"s{o}{n}"}
                                      for o in (1, 2) for n in (1, 2)}}
        self.chunk_reads: list[tuple] = []
        self.released = []
        self.captured = ["shop.orders", "shop.lines"]  # the spec's source.tables

    def head(self):
        return pos(len(self.sizes))

    def identity(self):
        return {"kind": "mysql", "server_id": 1}

    def read(self, start, upto):
        for item in stream(self.sizes):
            end = item.position if isinstance(item, PositionMark) else item.end_position
            if end is None:
                end = pos(int(item.tx_id.split("-")[-1]))
            if (start is None or end > start) and end <= upto:
                yield item

    def release(self, position):
        self.released.append(position)

    def snapshots(self):
        return SnapReads(self)


class SnapReads(SnapshotReads):
    """The scripted tables' snapshot reads: the rows as the test set them, every chunk read
    noted; the upper bound is the head after the rows (SnapshotReads' default)."""

    def tables(self, tables=None):
        names = tables or self.source.captured
        return [SnapshotTable("shop", "shop", n.split(".")[1], ("id",) if n == "shop.orders" else
                              ("order_id", "line")) for n in names]

    def chunk_plan(self, table, chunk_rows):
        keys = sorted(self.source.tables[table.name])
        bounds = [list(k) for k in keys[chunk_rows - 1::chunk_rows]]
        edges = [None, *bounds, None]
        return list(zip(edges[:-1], edges[1:], strict=True))

    def read_chunk(self, table, lo, hi):
        self.source.chunk_reads.append((table.name, lo, hi))
        rows = self.source.tables[table.name]
        for k in sorted(rows):
            if (lo is None or k > tuple(lo)) and (hi is None or k <= tuple(hi)):
                yield dict(rows[k])


@pytest.fixture()
def env(tmp_path):
    source = SnapSource([1, 2])
    spec, sinks, store, parts = wire_fakes(tmp_path, """
        pipeline: p
        tenant: t
        source: {kind: mysql, conn_id: src, server_id: 5001, start: snapshot}
        batch: {max_events: 3}
        snapshot: {chunk_rows: 3}
    """, source)
    yield spec, source, sinks, store, parts
    store.close()


def envelopes(sink):
    return [json.loads(e.value) for b in sink.batches for tx in b.transactions for e in tx.events]


def test_start_snapshot_delivers_every_row_then_hands_off_to_the_log(env):
    spec, source, sinks, store, parts = env
    run = bounds_step.prepare_bounds(RunContext(spec, run_id="r1", parts=parts, store=store))
    bounds = run.bounds
    [rec] = store.snapshots.all("p")
    start = SnapshotPosition(rec.snapshot_id, 0, pos(2))
    assert bounds.checkpoints == {"a": start, "b": start} and not bounds.nothing_to_do()
    assert len(rec.chunks) == 3 + 2  # orders: 7 rows by 3 (the last chunk open-ended); lines: 4 by 3
    source.sizes += [1]  # a change after the handoff
    runner.run_pipeline(run)  # its record: upto is the handoff, the change after it waits
    got = envelopes(sinks["a"])
    kinds = [m.get("type") or m["op"] for m in got]
    assert kinds == ["snapshot_started"] + ["r"] * 11 + ["snapshot_completed"]
    rows = got[1:-1]
    assert [r["key"] for r in rows[:7]] == [{"id": i} for i in range(1, 8)]
    assert [r["key"] for r in rows[7:]] == [{"order_id": o, "line": n} for o in (1, 2) for n in (1, 2)]
    assert [r["source"]["snapshot"] for r in rows] == ["true"] * 6 + ["last"] + ["true"] * 3 + ["last"]
    assert rows[0]["idempotency_key"] == f't|p|shop.orders|snapshot:{rec.snapshot_id}|{{"id":1}}'
    assert rows[7]["event_id"] if "event_id" in rows[7] else True
    assert all(r["before"] is None and r["transaction"]["id"] == f"snapshot:{rec.snapshot_id}" for r in rows)
    assert got[-1]["tables"] == ["shop.orders", "shop.lines"] and got[-1]["rows"] == 11
    assert got[0]["tables"] == ["shop.orders", "shop.lines"] and got[0]["chunks"] == 5
    # the log from the handoff was not in this run (upto = the handoff); the next run has it
    assert store.checkpoints.get("p", "a").position == pos(2)
    assert store.snapshots.get("p", rec.snapshot_id).status == "completed"
    assert store.snapshots.get("p", rec.snapshot_id).rows == 11
    whole_run(RunContext(spec, run_id="r2", parts=parts, store=store))
    assert [m["op"] for m in envelopes(sinks["a"])[13:]] == ["c"]
    assert envelopes(sinks["b"]) == envelopes(sinks["a"])
    assert store.checkpoints.get("p", "a").position == pos(3)


def test_a_killed_snapshot_resumes_at_the_next_chunk(env):
    spec, source, sinks, store, parts = env
    sinks["a"].fail_from_call = 3  # the 3rd sub-batch fails: chunks 1-2 are in
    with pytest.raises(CommitPolicyError):
        whole_run(RunContext(spec, run_id="r1", parts=parts, store=store))
    [rec] = store.snapshots.all("p")
    at = store.checkpoints.get("p", "a").position
    assert at == SnapshotPosition(rec.snapshot_id, 2, pos(2))
    delivered = list(sinks["a"].delivered)
    sinks["a"].fail_from_call = None
    source.chunk_reads.clear()
    whole_run(RunContext(spec, run_id="r2", parts=parts, store=store))
    assert source.chunk_reads[0] == ("shop.orders", [6], None)  # chunk 3 first: nothing re-read
    keys = sinks["a"].delivered
    assert len(keys) == len(set(keys)) == 1 + 11 + 1  # started, rows, completed (the log is before H)
    assert keys[:len(delivered)] == delivered
    assert store.checkpoints.get("p", "a").position == pos(2)
    # the optional sink has it all too (chunk 3 twice: no checkpoint moved when a failed it)
    assert set(sinks["b"].delivered) == set(keys)


def test_an_empty_chunk_moves_the_checkpoint(env):
    spec, source, sinks, store, parts = env
    bounds_step.prepare_bounds(RunContext(spec, parts=parts, store=store))
    source.tables["shop.orders"] = {k: v for k, v in source.tables["shop.orders"].items() if k[0] > 3}
    whole_run(RunContext(spec, run_id="r1", parts=parts, store=store))
    rows = [m for m in envelopes(sinks["a"]) if m.get("op") == "r"]
    assert len(rows) == 4 + 4 and store.checkpoints.get("p", "a").position == pos(2)


def test_a_sink_added_later_joins_the_running_snapshot_or_gets_its_own(env):
    spec, source, sinks, store, parts = env
    only_a = RunPlan(sinks=["a"])
    sinks["a"].fail_from_call = 2
    with pytest.raises(CommitPolicyError):
        whole_run(RunContext(spec, only_a, run_id="r1", parts=parts, store=store))
    [rec] = store.snapshots.all("p")
    # b has no checkpoint yet: it joins the snapshot a is in, from chunk 0
    bounds = bounds_step.prepare_bounds(RunContext(spec, parts=parts, store=store)).bounds
    assert bounds.checkpoints["b"] == SnapshotPosition(rec.snapshot_id, 0, pos(2))
    sinks["a"].fail_from_call = None
    whole_run(RunContext(spec, run_id="r2", parts=parts, store=store))
    assert sorted(sinks["b"].delivered) == sorted(set(sinks["a"].delivered))
    assert len(sinks["a"].delivered) == len(set(sinks["a"].delivered))


def test_resnapshot_of_a_healthy_pipeline_hands_off_at_the_lowest_checkpoint(env):
    spec, source, sinks, store, parts = env
    whole_run(RunContext(spec, run_id="r1", parts=parts, store=store))
    source.sizes += [2]
    # b stays at pos(2)
    whole_run(RunContext(spec, RunPlan(sinks=["a"]), run_id="r2", parts=parts, store=store))
    plan = RunPlan.from_values({"resolve": "resnapshot", "reason": "consumer rebuilt",
                                "tables": ["shop.lines"]}, who="ops")
    out = guards.run_guards(RunContext(spec, plan, run_id="r3", parts=parts, store=store), checks=("halted",))
    assert out["resolved"] == []  # nothing was open; the snapshot is planned anyway
    rec = store.snapshots.all("p")[-1]
    assert rec.kind == "resnapshot" and rec.handoff == pos(2)
    assert [t["table"] for t in rec.tables] == ["lines"]
    assert {sid: r.position for sid, r in store.checkpoints.current("p").items()} == {
        "a": SnapshotPosition(rec.snapshot_id, 0, pos(2)), "b": SnapshotPosition(rec.snapshot_id, 0, pos(2))}
    moved = store.checkpoints.get("p", "a")
    assert moved.kind == "resnapshot" and "consumer rebuilt" in moved.reason
    # a retried guard task of the same run plans nothing new
    guards.run_guards(RunContext(spec, plan, run_id="r3", parts=parts, store=store), checks=("halted",))
    assert len(store.snapshots.all("p")) == 2
    before = len(sinks["a"].delivered)
    whole_run(RunContext(spec, run_id="r4", parts=parts, store=store))
    new = envelopes(sinks["a"])[-(len(sinks["a"].delivered) - before):]
    assert [m.get("type") or m["op"] for m in new] == ["snapshot_started"] + ["r"] * 4 + \
        ["snapshot_completed"] + ["c", "c"]  # a gets transaction 3 again (b needed it)
    assert store.checkpoints.get("p", "b").position == pos(3)


def test_resnapshot_after_a_loss_resolves_it_and_refuses_a_subset(env):
    spec, source, sinks, store, parts = env
    whole_run(RunContext(spec, run_id="r1", parts=parts, store=store))
    inc = store.incidents.record("p", "binlog_purged", pos(2), pos(9), detail="purged")
    with pytest.raises(SnapshotError) as e:
        guards.resolve_incidents(RunContext(spec, run_id="r2", parts=parts, store=store),
                                            resolution="resnapshot", reason="r", who="ops",
                                            tables=["shop.orders"])
    assert "silent gap" in str(e.value) and not store.incidents.get(inc.id).resolved
    source.sizes += [1, 1]
    done = guards.resolve_incidents(RunContext(spec, run_id="r2", parts=parts, store=store),
                                               resolution="resnapshot", reason="binlog purged by hand",
                                               who="ops")
    assert done[0]["resolution"] == "resnapshot" and done[0]["reason"] == "binlog purged by hand"
    rec = store.snapshots.all("p")[-1]
    assert rec.handoff == pos(4)  # restart_stream(): the head
    whole_run(RunContext(spec, run_id="r3", parts=parts, store=store))
    assert store.checkpoints.get("p", "a").position == pos(4)
    store.incidents.record("p", "schema_change", pos(4), pos(4))
    with pytest.raises(Exception) as e:
        guards.resolve_incidents(RunContext(spec, run_id="r4", parts=parts, store=store),
                                            resolution="resnapshot", reason="r", who="ops")
    assert "resolve=continue" in str(e.value)


def test_release_during_a_snapshot_keeps_the_log_from_the_handoff(env):
    spec, source, sinks, store, parts = env
    bounds_step.prepare_bounds(RunContext(spec, parts=parts, store=store))
    runner.release(RunContext(spec, parts=parts, store=store))
    assert source.released == [pos(2)]


def test_the_store_keeps_snapshots_supersedes_and_completes(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 's.sqlite'}")
    epoch = store.leases.acquire("p", "r")
    tables = [SnapshotTable("d", "d", "t", ("id",)).to_json()]
    one = SnapshotRecord("p", "1", "start", pos(3), tables, [{"table": 0, "lo": None, "hi": None}], 5)
    written = store.snapshots.begin(one, {"a": SnapshotPosition("1", 0, pos(3))}, epoch=epoch,
                                    control={"type": "snapshot_started"})
    assert written["a"].kind == "start" and written["a"].control == {"type": "snapshot_started"}
    two = dataclasses.replace(one, snapshot_id="2", kind="resnapshot", reason="why")
    store.snapshots.begin(two, {"a": SnapshotPosition("2", 0, pos(3))}, epoch=epoch)
    assert [(s.snapshot_id, s.status) for s in store.snapshots.all("p")] == [("1", "superseded"),
                                                                        ("2", "running")]
    store.snapshots.record_chunk_rows("p", "2", 1, 10)
    store.snapshots.record_chunk_rows("p", "2", 1, 12)  # re-read after a resume: the last read counts
    store.snapshots.record_chunk_rows("p", "2", 2, 3)
    assert store.snapshots.chunk_rows("p", "2") == {1: 12, 2: 3}
    done = store.snapshots.finish("p", "2")
    assert done.status == "completed" and done.rows == 15 and done.finished_at
    assert store.snapshots.get("p", "2").handoff == pos(3) and store.snapshots.get("p", "2").reason == "why"
    store.close()


def test_messages_are_identical_on_every_read(env):
    spec, source, sinks, store, parts = env
    bounds_step.prepare_bounds(RunContext(spec, parts=parts, store=store))
    [rec] = store.snapshots.all("p")
    a = list(snapshot.read_chunk(spec, source, rec, 1).events)
    b = list(snapshot.read_chunk(spec, source, rec, 1).events)
    assert [e.value for e in a] == [e.value for e in b] and len(a) == 3
    m = snapshot.completed_message(spec, rec, 11)
    assert isinstance(m, ControlMessage) and m.end_position == pos(2) and m.tx_end
    assert m.idempotency_key == f"t|{m.pipeline}|__control|snapshot_completed|{rec.snapshot_id}"


# --------------------------------------------------------------------------- no time travel


class ChangingLog:
    """A log of single-row changes of ``shop.orders`` (key id) at positions 1000·n: what
    :class:`snapshot.ChangedKeys` scans."""

    def __init__(self, changes):  # [(op, before_id, after_id), ...]
        self.changes = changes
        self.scans = []

    def read(self, start, upto):
        self.scans.append((start, upto))
        for n, (op, old, new) in enumerate(self.changes, start=1):
            if start < pos(n) <= upto:
                before = None if old is None else {"id": old, "v": n - 1}
                after = None if new is None else {"id": new, "v": n}
                key = {"id": new if new is not None else old}
                yield ChangeEvent.native("t", "p", "mysql", "shop", "shop", "orders", op, before, after, key,
                                         f"0-1-{n}", f"e{n}", {}, 0, 1, 1, tx_end=True, end_position=pos(n))


def tiny_spec():
    return load_spec_text("pipeline: p\ntenant: t\nsource: {kind: mysql, conn_id: c}\n"
                          "sinks: [{id: k, kind: kafka, conn_id: k, topic: t}]\n")


def rows_of(rec, ids, final):
    table = SnapshotTable("shop", "shop", "orders", ("id",))
    build = snapshot.RowEvents(tiny_spec(), rec, table, 1, "mysql")
    return table, list(snapshot_rows._marked_rows(({"id": i, "v": 0} for i in ids), build, final))



# Rows whose floats orjson writes as the stdlib does, and rows where it does not (below 1e-4, at or
# above 1e16, in the key, inside a JSON column's nested values), with the other JSON types.
ROWS_OF_EVERY_FLOAT = [
    {"id": 1, "v": 0.5, "s": "é", "n": None, "b": True, "j": {"a": [1, 2.5, {"x": 0.0}]}, "l": ["a", "b"]},
    {"id": 2, "v": 1e-5, "s": "", "n": None, "b": False, "j": None, "l": []},
    {"id": 3, "v": 1e16, "s": "x", "n": 7, "b": None, "j": {"deep": [[1e-7]]}, "l": ["c"]},
    {"id": 4, "v": -0.0, "s": "y", "n": 2**70, "b": None, "j": [0.1, 1e300], "l": None},
    {"id": 5, "v": 123456.789, "s": "z", "n": -1, "b": None, "j": {"k": "v"}, "l": ["d"]},
    {"id": 6.25e-6, "v": 1.0, "s": "k", "n": 0, "b": None, "j": 3, "l": None},
    {"id": 7.5, "v": 1.0, "s": "k", "n": 0, "b": None, "j": "text", "l": None},
]


def snapshot_events(rows):
    tables = [{"db": "shop", "schema": "shop", "table": "orders", "key": ["id"]}]
    rec = SnapshotRecord("p", "s1", "start", pos(1), tables, [{"table": 0, "lo": None, "hi": None}], 0)
    table = SnapshotTable("shop", "shop", "orders", ("id",))
    build = snapshot.RowEvents(tiny_spec(), rec, table, 1, "mysql")
    return list(snapshot_rows._marked_rows(iter(rows), build, final=True))


def test_snapshot_row_events_are_the_stdlib_json_of_their_rows():
    """A snapshot row's bytes (value, key, event id) are the stdlib's JSON of its envelope, for
    every kind of float: orjson writes them only where it agrees with the stdlib."""
    events = snapshot_events(ROWS_OF_EVERY_FLOAT)
    assert [e.after for e in events] == ROWS_OF_EVERY_FLOAT
    for e in events:
        stdlib = json.dumps(e.envelope(), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        assert e.value == stdlib.encode("utf-8"), e.after
        assert e.event_id == json.dumps(e.key, ensure_ascii=False, separators=(",", ":"))
        assert e.key_bytes == json.dumps(e.key, ensure_ascii=False, separators=(",", ":"),
                                         sort_keys=True).encode("utf-8")
    assert json.loads(events[-1].value)["source"]["snapshot"] == "last"


def test_the_flat_float_check_agrees_with_the_deep_one():
    from tidegate.events import orjson_formats_like_stdlib

    for row in ROWS_OF_EVERY_FLOAT:
        assert snapshot_rows.row_floats_like_stdlib(row) == orjson_formats_like_stdlib(row), row
    assert [snapshot_rows.row_floats_like_stdlib(r) for r in ROWS_OF_EVERY_FLOAT] == [
        True, False, False, False, True, False, True]

def test_chunk_rows_of_keys_the_log_changes_after_the_handoff_are_left_to_the_log():
    tables = [{"db": "shop", "schema": "shop", "table": "orders", "key": ["id"]}]
    rec = SnapshotRecord("p", "s1", "start", pos(1), tables, [{"table": 0, "lo": None, "hi": None}], 0)
    # after the handoff (pos 1): 2 updates key 3; 3 changes key 5 into key 9; 4 deletes key 6 (after
    # the chunk's upper bound 3: the row is kept, the delete follows it)
    log = ChangingLog([("c", None, 1), ("u", 3, 3), ("u", 5, 9), ("d", 6, None)])
    changed = snapshot.ChangedKeys(rec, log)
    changed.scan_to(pos(3))
    changed.scan_to(pos(2))  # never backwards, never twice
    assert log.scans == [(pos(1), pos(3))]
    table, rows = rows_of(rec, [2, 3, 5, 6, 9], final=True)
    kept = list(changed.drop_changed(table, rows, pos(3)))
    assert [e.key for e in kept] == [{"id": 2}, {"id": 6}]
    assert [json.loads(e.value)["source"]["snapshot"] for e in kept] == ["true", "last"]
    assert json.loads(kept[-1].value)["after"] == {"id": 6, "v": 0} and changed.dropped == 3
    # a row that crossed a process (rebuilt from its shipped row, its envelope unparsed) is
    # re-marked from its bytes
    shipped = row_to_item(item_to_row(rows[0]))
    assert "after" not in shipped.__dict__
    again = snapshot_rows.marked(shipped, "last")
    assert json.loads(again.value) == {**json.loads(rows[0].value),
                                       "source": {**json.loads(rows[0].value)["source"], "snapshot": "last"}}
    # another table's rows pass untouched
    other = SnapshotTable("shop", "shop", "lines", ("id",))
    assert list(changed.drop_changed(other, rows, pos(3))) == rows


def test_a_chunk_leaves_to_the_log_the_keys_changed_up_to_its_own_upper_bound():
    """The scan went further for another chunk (read later, or in another order): a chunk whose
    upper bound is 3 keeps the row of key 6, deleted at 4, as a run that read it alone would."""
    tables = [{"db": "shop", "schema": "shop", "table": "orders", "key": ["id"]}]
    rec = SnapshotRecord("p", "s1", "start", pos(1), tables, [{"table": 0, "lo": None, "hi": None}], 0)
    log = ChangingLog([("c", None, 1), ("u", 3, 3), ("u", 5, 9), ("d", 6, None)])
    changed = snapshot.ChangedKeys(rec, log)
    changed.scan_to(pos(4))
    table, rows = rows_of(rec, [2, 3, 5, 6, 9], final=True)
    assert [e.key for e in changed.drop_changed(table, rows, pos(3))] == [{"id": 2}, {"id": 6}]
    assert [e.key for e in changed.drop_changed(table, rows, pos(4))] == [{"id": 2}]
    assert [e.key for e in changed.drop_changed(table, rows, pos(1))] == [{"id": k} for k in (2, 3, 5, 6, 9)]


def test_a_table_added_to_a_running_pipeline_gets_a_snapshot_of_its_own(tmp_path):
    source = SnapSource([1, 2])
    source.captured = ["shop.orders"]
    head = """
        pipeline: p
        tenant: t
        source: {kind: mysql, conn_id: src, server_id: 5001, start: snapshot, tables: [shop.orders]}
        batch: {max_events: 3}
        snapshot: {chunk_rows: 3}
    """
    spec, sinks, store, parts = wire_fakes(tmp_path, head, source)
    try:
        whole_run(RunContext(spec, run_id="r1", parts=parts, store=store))
        [first] = store.snapshots.all("p")
        assert snapshot.table_names(first) == ["shop.orders"]
        # nothing added: streams on
        assert bounds_step.prepare_bounds(RunContext(spec, parts=parts, store=store)).bounds.nothing_to_do()
        source.sizes += [1]  # a change after the handoff, in the run that snapshots the new table
        grown = head.replace("[shop.orders]", "[shop.orders, shop.lines]")
        spec, sinks, again, parts = wire_fakes(tmp_path, grown, source)  # fresh recording sinks
        source.captured = ["shop.orders", "shop.lines"]
        again.close()
        run = bounds_step.prepare_bounds(RunContext(spec, run_id="r2", parts=parts, store=store))
        bounds = run.bounds
        added = store.snapshots.all("p")[-1]
        assert added.kind == "added" and snapshot.table_names(added) == ["shop.lines"]
        assert added.handoff == pos(2)  # the checkpoint: the other tables lose nothing
        assert bounds.checkpoints == {s: SnapshotPosition(added.snapshot_id, 0, pos(2)) for s in ("a", "b")}
        runner.run_pipeline(run)
        got = envelopes(sinks["a"])
        assert [m.get("type") or m["op"] for m in got] == (["snapshot_started"] + ["r"] * 4 +
                                                          ["snapshot_completed", "c"])
        assert got[0]["tables"] == ["shop.lines"] and got[-2]["rows"] == 4
        assert store.checkpoints.get("p", "a").position == pos(3)
        assert bounds_step.prepare_bounds(RunContext(spec, parts=parts,
                                                store=store)).bounds.checkpoints == {"a": pos(3), "b": pos(3)}
    finally:
        store.close()
