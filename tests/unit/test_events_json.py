"""orjson serialization gives the bytes the stdlib gave, for every value sources produce, and
the fast uuid5 is uuid5 (ids and keys of earlier versions must never change)."""

from __future__ import annotations

import json
import math
import struct
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tidegate.events import EVENT_ID_NAMESPACE, ChangeEvent, event_uuid, orjson_formats_like_stdlib

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
           | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
           | st.floats(width=32, allow_nan=False, allow_infinity=False) | st.text())
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
rows = st.dictionaries(st.text(max_size=10), values, max_size=8)


def stdlib(obj, **kw) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), **kw).encode("utf-8")


def make(before, after, key, **kw) -> ChangeEvent:
    return ChangeEvent.build(
        tenant="t", pipeline="p", connector="mysql", db="d", schema="d", table="tbl",
        op="u", before=before, after=after, key=key, tx_id="0-1-9", event_id="f.000001:4:0",
        position={"file": "f.000001", "pos": 4, "row": 0, "gtid": None}, ts_ms=1, total_order=1,
        data_collection_order=1, **kw)


@settings(max_examples=60, deadline=None)
@given(before=rows, after=rows, key=st.none() | rows)
def test_value_and_key_are_the_stdlib_bytes(before, after, key):
    ev = make(before, after, key)
    assert ev.value == stdlib(ev.envelope(), allow_nan=False)
    assert ev.key_bytes == stdlib(ev.key, sort_keys=True)
    native = ChangeEvent.native(**{f: getattr(ev, f) for f in (
        "tenant", "pipeline", "connector", "db", "schema", "table", "op", "before", "after", "key",
        "tx_id", "event_id", "position", "ts_ms", "total_order", "data_collection_order")})
    assert native == ev and native.value == ev.value and native.key_bytes == ev.key_bytes


@settings(max_examples=500, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False) | st.floats(width=32, allow_nan=False))
def test_floats_declared_safe_are_written_alike(x):
    import orjson

    if orjson_formats_like_stdlib(x):
        assert orjson.dumps(x) == stdlib(x)


def test_floats_orjson_writes_differently_still_give_stdlib_bytes():
    for x in (9.999999999999999e-05, 1e-7, 1.5e-300, 5e-324, 1e16, 1.2345e300, -3e-5):
        ev = make(None, {"x": x, "nested": [{"y": x}]}, {"x": x})
        assert ev.value == stdlib(ev.envelope(), allow_nan=False)
        assert ev.key_bytes == stdlib(ev.key, sort_keys=True)
    # native events a source checked: the flag is trusted, unchecked ones are searched
    unchecked = ChangeEvent.native("t", "p", "mysql", "d", "d", "t", "c", None, {"x": 1e-7}, None,
                                   "tx", "e", {}, 1, 1, 1)
    assert unchecked.value == stdlib(unchecked.envelope(), allow_nan=False)


def test_beyond_64_bits_and_non_finite_behave_as_before():
    big = make(None, {"n": 2**70, "m": -(2**64)}, {"n": 2**70})
    assert big.value == stdlib(big.envelope(), allow_nan=False)
    assert big.key_bytes == stdlib(big.key, sort_keys=True)
    nan = ChangeEvent.native("t", "p", "mysql", "d", "d", "t", "c", None, {"x": math.nan}, None,
                             "tx", "e", {}, 1, 1, 1)
    with pytest.raises(ValueError):  # JSON has no NaN; build() encodes it as "NaN" instead
        _ = nan.value
    assert make(None, {"x": math.nan}, None).value.count(b'"NaN"') == 1


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_event_uuid_is_uuid5(key):
    assert event_uuid(key) == str(uuid.uuid5(EVENT_ID_NAMESPACE, key))


def test_float32_values_round_trip_through_the_check():
    for bits in (0x3F800000, 0x00000001, 0x7F7FFFFF, 0x38D1B717, 0x4B189680):
        x = struct.unpack("<f", bits.to_bytes(4, "little"))[0]
        ev = make(None, {"f": x}, None)
        assert ev.value == stdlib(ev.envelope(), allow_nan=False)
