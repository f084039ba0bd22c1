"""Comparing two reads of the same range item by item (two decoders of one source)."""

from __future__ import annotations

from tidegate.events import ChangeEvent, PositionMark, is_control
from tidegate.shipped import ShippedEvent


def _kind(item: object) -> type:
    # A change event may be a ChangeEvent or a ShippedEvent (its subclass: the compiled row
    # path's events, tidegate.native); both are compared by their bytes and fields below.
    return ChangeEvent if isinstance(item, ChangeEvent) else type(item)


def assert_same(expected: list, got: list) -> None:
    """The same items in the same order: envelope and key bytes, transaction fields, end
    positions, position marks, and the parsed row images of change events."""
    assert len(got) == len(expected)
    for k, (a, b) in enumerate(zip(expected, got, strict=True)):
        assert _kind(a) is _kind(b), k
        if isinstance(a, PositionMark):
            assert b.position.to_json() == a.position.to_json(), k
            continue
        assert b.value == a.value, (k, a.value, b.value)
        assert b.key_bytes == a.key_bytes, k
        assert (b.tx_id, b.event_id, b.tx_end) == (a.tx_id, a.event_id, a.tx_end), k
        assert b.commit_us == a.commit_us, k  # PostgreSQL's commit time in µs (not in the envelope)
        assert (b.end_position.to_json() if b.end_position else None) == \
            (a.end_position.to_json() if a.end_position else None), k
        if not is_control(a):
            assert (b.before, b.after, b.key) == (a.before, a.after, a.key), k
            assert b.headers == a.headers, k


def compiled_share(python: list, compiled: list) -> float:
    """Two reads of one range, by the Python path and with the compiled path: the same items
    (:func:`assert_same`), every kind of row change among them, every event of the Python read
    made in Python. Returns the share of the compiled read's events the compiled path wrote."""
    assert_same(python, compiled)
    events = [e for e in compiled if isinstance(e, ChangeEvent)]
    assert {e.op for e in events} == {"c", "u", "d"}
    assert all(type(e) is ChangeEvent for e in python if isinstance(e, ChangeEvent))
    return sum(type(e) is ShippedEvent for e in events) / len(events)
