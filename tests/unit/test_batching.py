from collections import Counter

import pytest
from _tidegate_fakes import event, pos, stream, tx_events
from hypothesis import given, settings
from hypothesis import strategies as st
from tidegate.batching import cut_sub_batches
from tidegate.errors import RunError
from tidegate.events import PositionMark
from tidegate.spill import SpilledEvents

sizes_st = st.lists(st.integers(min_value=0, max_value=12), min_size=0, max_size=30)


def _events(items):
    return [e for e in items if not isinstance(e, PositionMark)]


@settings(max_examples=300, deadline=None)
@given(sizes=sizes_st, max_events=st.integers(1, 15), max_bytes=st.integers(1, 6000))
def test_no_tx_split_order_kept_limits_respected(sizes, max_events, max_bytes):
    items = stream(sizes)
    batches = list(cut_sub_batches(iter(items), max_events=max_events, max_bytes=max_bytes))
    # order kept within and across sub-batches, nothing lost or duplicated
    assert [e.idempotency_key for b in batches for e in b.events] == \
           [e.idempotency_key for e in _events(items)]
    assert [b.seq for b in batches] == list(range(1, len(batches) + 1))
    seen_tx = set()
    for b in batches:
        txs = [t for t in b.transactions if t.events]
        for t in txs:
            assert t.tx_id not in seen_tx, "a transaction appears in two sub-batches"
            seen_tx.add(t.tx_id)
            assert list(t.events)[-1].tx_end and len({e.tx_id for e in t.events}) == 1
            assert not t.partial
        if len(txs) > 1:  # several transactions only while within the limits
            assert b.event_count <= max_events and b.byte_size <= max_bytes
        # end positions grow strictly (checkpoints only move forward)
    ends = [b.end_position for b in batches]
    assert ends == sorted(ends) and len(set(ends)) == len(ends)
    if sizes:
        assert ends[-1] == pos(len(sizes))  # the last position (even a mark) is reached


@settings(max_examples=200, deadline=None)
@given(sizes=sizes_st, max_events=st.integers(1, 15))
def test_oversized_transaction_is_alone(sizes, max_events):
    batches = list(cut_sub_batches(iter(stream(sizes)), max_events=max_events, max_bytes=10**9))
    for b in batches:
        if b.event_count > max_events:
            assert len([t for t in b.transactions if t.events]) == 1


def test_marks_merge_and_count_nothing():
    items = stream([0, 0, 2, 0, 0, 0])
    batches = list(cut_sub_batches(iter(items), max_events=10, max_bytes=10**9))
    assert len(batches) == 1
    ends = [t.end_position for t in batches[0].transactions]
    assert ends == [pos(2), pos(3), pos(6)]


def test_streaming_is_lazy():
    """The cutter pulls the source only as far as the sub-batch it yields."""
    pulled = []

    def source():
        for n in range(1, 10**6):
            for e in tx_events(n, 2):
                pulled.append(e)
                yield e

    gen = cut_sub_batches(source(), max_events=4, max_bytes=10**9)
    first = next(gen)
    assert first.event_count == 4
    assert len(pulled) <= 6  # at most one transaction beyond the sub-batch


def test_stream_ending_inside_a_transaction_is_an_error():
    items = tx_events(1, 3)[:-1]
    with pytest.raises(ValueError, match="inside transaction"):
        list(cut_sub_batches(iter(items), max_events=10, max_bytes=10**9))


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 12), min_size=1, max_size=15), max_events=st.integers(1, 5))
def test_respect_source_tx_false_splits_but_checkpoints_stay_at_boundaries(sizes, max_events):
    items = stream(sizes)
    batches = list(cut_sub_batches(iter(items), max_events=max_events, max_bytes=10**9,
                                   respect_source_tx=False))
    assert [e.idempotency_key for b in batches for e in b.events] == \
           [e.idempotency_key for e in _events(items)]
    boundaries = {pos(n) for n in range(1, len(sizes) + 1)}
    for b in batches:
        assert b.end_position in boundaries  # never inside a transaction
        if b.event_count > max_events:  # only the first transaction may be oversized
            assert b.transactions[0].tx_id == "0-1-1"
    # a sink standing at a boundary gets exactly the rows after it, even from split parts
    for n in range(1, len(sizes) + 1):
        got = [e.tx_id for b in batches for e in b.after(pos(n)).events]
        assert got == [e.tx_id for e in _events(items) if int(e.tx_id.split("-")[-1]) > n]


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 9000), min_size=1, max_size=4), max_events=st.integers(1, 5000),
       tables=st.integers(1, 3))
def test_a_transaction_past_the_limits_is_kept_on_disk_and_read_back_whole(sizes, max_events, tables):
    """Generated transactions up to 9,000 rows (frames of 2,000) and limits: a transaction that
    passes a limit is spilled; every reader gets it back whole, in order, as often as it asks;
    sizes and per-table counts match what an in-memory transaction would give."""
    items = []
    for n, size in enumerate(sizes, start=1):
        items += [event(n, i, last=i == size - 1, table=f"t{i % tables}") for i in range(size)] \
            if size else [PositionMark(pos(n))]
    batches = list(cut_sub_batches(iter(items), max_events=max_events, max_bytes=10**9))
    keys = [e.idempotency_key for e in _events(items)]
    assert [e.idempotency_key for b in batches for e in b.events] == keys
    assert [e.idempotency_key for b in batches for c in b.chunks() for e in c] == keys
    for b in batches:
        spilled = [t for t in b.transactions if isinstance(t.events, SpilledEvents)]
        assert b.spilled == bool(spilled)
        for t in spilled:
            assert len(t.events) >= max_events and len([t for t in b.transactions if t.events]) == 1
            first, again = iter(t.events), list(t.events)  # two readers at once
            assert [e.idempotency_key for e in first] == [e.idempotency_key for e in again]
            assert all(len(c) <= 2000 for c in b.chunks())
        in_memory = [e for t in b.transactions for e in t.events]
        assert b.byte_size == sum(len(e.value) for e in in_memory)
        assert b.table_counts == dict(Counter((e.db, e.schema, e.table) for e in in_memory))


def test_a_spill_directory_that_cannot_be_written_is_a_clear_error(tmp_path, monkeypatch):
    """Bad input names the setting and the fix: no file can be made in TIDEGATE_SPILL_DIR."""
    monkeypatch.setenv("TIDEGATE_SPILL_DIR", str(tmp_path / "missing"))
    with pytest.raises(RunError, match=r"TIDEGATE_SPILL_DIR to a writable directory") as err:
        list(cut_sub_batches(iter(stream([30])), max_events=10, max_bytes=10**9))
    assert str(tmp_path / "missing") in str(err.value) and err.value.fatal
