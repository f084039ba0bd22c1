"""Control messages in the engine: what a checkpoint version owes its sink (an accepted gap, a
failover) is delivered first and exactly once; a schema change halts the stream at the last
whole transaction before it until an operator lets it pass; reading runs ahead of delivery."""

from __future__ import annotations

import textwrap

import pytest
from _tidegate_fakes import FakeParts, FakeSink, QuietSource, pos, stream, tx_events
from tidegate.coordinator import Coordinator, read_ahead
from tidegate.errors import ContinuityHalt
from tidegate.events import ControlMessage, PositionMark
from tidegate.plan import RunPlan
from tidegate.run import RunContext
from tidegate.sink_checkpoints import SinkCheckpoint
from tidegate.spec import BatchSpec, load_spec
from tidegate.store import open_store

from tests.runs import whole_run


@pytest.fixture()
def store(tmp_path):
    s = open_store(f"sqlite:///{tmp_path / 'ckpt.sqlite'}")
    yield s
    s.close()


def gap_message(incident: int = 7) -> ControlMessage:
    return ControlMessage("t", "p", "gap", f"incident-{incident}", pos(2).to_json(), 1_700_000_000_000,
                          {"from": pos(1).to_json(), "to": pos(2).to_json(), "reason": "restored",
                           "incident": incident})


def owe_gap(store, sinks=("a",), at=2):
    epoch = store.leases.acquire("p", "r0")
    store.checkpoints.write_many("p", {s: pos(at) for s in sinks}, run_id="r0", epoch=epoch,
                                 kind="accept_gap", control=gap_message().record())


def run(store, sinks, items, run_id="r1", max_events=2):
    epoch = store.leases.acquire("p", run_id)
    co = Coordinator(store, "p", run_id, epoch, sinks, BatchSpec(max_events=max_events), tenant="t",
                     sleep=lambda s: None)
    with co:
        return co.run(iter(items))


def test_an_owed_gap_message_goes_first_in_the_first_delivery_then_never_again(store):
    owe_gap(store)
    a = FakeSink("a")
    items = stream([1] * 4)
    run(store, [a], items)
    gap = gap_message().idempotency_key
    assert a.delivered[0] == gap  # before the first event after the gap
    assert a.delivered[1:] == [e.idempotency_key for e in items][2:]
    assert store.checkpoints.get("p", "a").control is None  # settled by the delivery's version
    run(store, [a], stream([1] * 5), run_id="r2")
    assert a.delivered.count(gap) == 1


def test_an_owed_message_is_delivered_even_when_the_run_has_nothing_for_the_sink(store):
    owe_gap(store, at=4)
    a = FakeSink("a")
    run(store, [a], stream([1] * 4))  # everything up to tx 4 is before the checkpoint
    assert a.delivered == [gap_message().idempotency_key]
    assert [(h.position, bool(h.control)) for h in store.checkpoints.history("p", "a")] == [
        (pos(4), True), (pos(4), False)]
    owe_gap(store, at=4)
    b = FakeSink("a")
    run(store, [b], [], run_id="r2")  # no sub-batch at all: delivered alone at the checkpoint
    assert b.delivered == [gap_message().idempotency_key]
    assert [(h.kind, bool(h.control)) for h in store.checkpoints.history("p", "a")][-2:] == [
        ("accept_gap", True), ("control", False)]


def test_a_sink_that_committed_the_owed_message_before_a_crash_does_not_get_it_twice(store):
    owe_gap(store, at=4)
    version = store.checkpoints.get("p", "a").version
    a = FakeSink("a", committed=SinkCheckpoint(pos(4), version))  # its record: the control-only delivery
    run(store, [a], stream([1] * 4))
    assert a.delivered == []
    assert store.checkpoints.get("p", "a").control is None


def test_sinks_each_get_what_their_own_version_owes(store):
    owe_gap(store, sinks=("a",))
    epoch = store.leases.acquire("p", "r0")
    store.checkpoints.write("p", "b", pos(2), run_id="r0", epoch=epoch)
    a, b = FakeSink("a"), FakeSink("b")
    run(store, [a, b], stream([1] * 3))
    assert a.delivered[0] == gap_message().idempotency_key
    assert gap_message().idempotency_key not in b.delivered


# --------------------------------------------------------------------------- schema changes


def ddl(tx: int) -> ControlMessage:
    """A schema change of shop.orders as a source yields it: its own transaction."""
    return ControlMessage("t", "p", "schema_change", f"ddl-{tx}", {"file": "mysql-bin.000001", "pos": tx},
                          1_700_000_000_000, {"db": "shop", "table": "orders",
                                              "ddl": "ALTER TABLE orders ADD COLUMN note TEXT"},
                          tx_id=f"0-1-{tx}", tx_end=True, end_position=pos(tx))


class DdlSource(QuietSource):
    """Transactions 1-2 (rows), 3 (ALTER TABLE), 4-5 (rows)."""

    def identity(self):
        return {"kind": "mysql", "server_id": 1}

    def head(self):
        return pos(5)

    def read(self, start, upto):
        log = tx_events(1, 1) + tx_events(2, 2) + [ddl(3)] + tx_events(4, 1) + tx_events(5, 1)
        for item in log:
            tx = int(item.tx_id.split("-")[-1])
            if (start is None or pos(tx) > start) and pos(tx) <= upto:
                yield item
        yield PositionMark(upto)


@pytest.fixture()
def gated(tmp_path, store):
    def setup(policy: str):
        path = tmp_path / "p.yaml"
        path.write_text(textwrap.dedent(f"""
            pipeline: p
            tenant: t
            source: {{kind: mysql, conn_id: src, start: earliest, on_schema_change: {policy}}}
            sinks: [{{id: a, kind: redis, conn_id: r, stream: s}}]
        """))
        sink = FakeSink("a")
        return load_spec(str(path)), sink, FakeParts(DdlSource(), [sink])
    return setup


def test_continue_delivers_the_schema_change_in_order_with_the_rows(gated, store):
    spec, sink, parts = gated("continue")
    whole_run(RunContext(spec, run_id="r1", parts=parts, store=store))
    keys = sink.delivered
    assert keys.index(ddl(3).idempotency_key) == 3  # after tx 1 and 2's three rows, before tx 4
    assert len(keys) == 6


def test_halt_delivers_the_rows_before_then_waits_for_resolve_continue(gated, store):
    from tidegate import guards

    spec, sink, parts = gated("halt")
    with pytest.raises(ContinuityHalt, match="resolve=continue") as halt:
        whole_run(RunContext(spec, run_id="r1", parts=parts, store=store))
    inc = halt.value.incident
    assert (inc.kind, inc.from_position, inc.to_position) == ("schema_change", pos(2), pos(3))
    assert "ALTER TABLE orders ADD COLUMN note TEXT" in inc.detail
    assert len(sink.delivered) == 3 and store.checkpoints.get("p", "a").position == pos(2)
    with pytest.raises(ContinuityHalt):
        guards.check_halted(RunContext(spec, store=store))
    with pytest.raises(Exception, match="resolve=continue"):
        guards.resolve_incidents(RunContext(spec, run_id="r2", parts=parts, store=store),
                                            resolution="accept_gap", reason="x", who="op")
    guards.resolve_incidents(RunContext(spec, run_id="r2", parts=parts, store=store), resolution="continue",
                                        reason="consumers updated", who="op")
    whole_run(RunContext(spec, RunPlan(), run_id="r2", parts=parts, store=store))
    assert sink.delivered[3] == ddl(3).idempotency_key and len(sink.delivered) == 6
    assert store.checkpoints.get("p", "a").position == pos(5)


# --------------------------------------------------------------------------- read ahead


def test_read_ahead_keeps_order_and_raises_the_readers_error_in_place():
    def batches():
        yield 1
        yield 2
        raise RuntimeError("source died")

    got = []
    with pytest.raises(RuntimeError, match="source died"):
        for b in read_ahead(iter(batches())):
            got.append(b)
    assert got == [1, 2]


def test_read_ahead_stops_the_reader_when_the_consumer_stops():
    closed = []

    def batches():
        try:
            yield from range(1000)
        finally:
            closed.append(True)

    for b in read_ahead(batches()):
        if b == 3:
            break
    assert closed == [True]
