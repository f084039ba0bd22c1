"""Postgres value conversion: the generated row plans give what the per-value converters and
events.encode_value give, on synthetic wal2json columns (the real WAL comparison is
tests/integration/test_postgres_reader.py), and the timestamp shortcut equals the general
rule on every shape of text."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st
from tidegate.events import ChangeEvent, encode_row
from tidegate.sources.postgres.values import RowPlan, converter, ts_iso, ts_iso_fast
from tidegate.sources.postgres.wal2json import MESSAGE, Column

_TS_PARTS = st.tuples(
    st.sampled_from(["2024-01-02", "0044-03-15", "12345-01-01", "infinity"]),
    st.sampled_from([" ", "T", ""]),
    st.sampled_from(["03:04:05", "23:59:59", ""]),
    st.sampled_from(["", ".5", ".123456", ".1"]),
    st.sampled_from(["", "+00", "-00", "+05:30", "-03", "+00:00", "+05:30:15", "+0530", "+1", " BC",
                     "+00 BC", "-08:00 BC", "+00+00", "x+00"]),
)


@settings(max_examples=300, deadline=None)
@given(_TS_PARTS, st.text(alphabet="0123456789+-:. TBC", max_size=30))
def test_the_timestamp_shortcut_equals_the_general_rule(parts, noise):
    for text in ("".join(parts), "2024-01-02 03:04:05" + noise, noise):
        assert ts_iso_fast(text) == ts_iso(text), text
    assert ts_iso_fast(None) is None


def reference(cols):
    """What the reference path makes of a row: converter per value, then encode_row."""
    return encode_row({c.name: converter(c.type)(c.value) for c in cols})


SIGNATURE = [("id", "bigint"), ("n", "numeric(12,2)"), ("d", "double precision"), ("r", "real"),
             ("t", "text"), ("b", "bytea"), ("ts", "timestamp(6) without time zone"),
             ("tz", "timestamp with time zone"), ("fa", "double precision[]"), ("ia", "integer[]"),
             ("bo", "boolean"), ("dm", "posint"), ("j", "jsonb"), ("tm", "time without time zone")]


def cols(*values):
    return [Column(name, typ, v) for (name, typ), v in zip(SIGNATURE, values, strict=True)]


ROWS = [
    cols(1, Decimal("1.50"), Decimal("2.5"), Decimal("3.14"), "x", "\\x00ff", "2024-01-02 03:04:05.5",
         "2024-01-02 03:04:05+00", "{1e-05,2.5,NULL}", "{1,NULL}", True, "7", '{"a": 1}', "12:00:00"),
    cols(None, None, None, None, None, None, None, None, None, None, None, None, None, None),
    cols(-9223372036854775808, 123456789012345678901234567890, Decimal("1E-5"), 1, "", "\\x", "infinity",
         "2024-01-02 03:04:05.123+05:30", "{}", "{}", False, Decimal("1.5"), "[]", "00:00:00"),
    cols(2, Decimal("0.0000001"), Decimal("1E+16"), Decimal("0"), "ü", "\\xdeadbeef", "-infinity",
         "2024-01-02 03:04:05.5+00", "{NaN,Infinity}", "{{1,2},{3,4}}", True, 3, "null", "23:59:59.999999"),
]


def test_row_plans_give_the_reference_values_and_flag_floats_orjson_writes_otherwise():
    flag = [False]
    plan = RowPlan(tuple((c.name, c.type) for c in ROWS[0]), flag)
    for row in ROWS:
        flag[0] = False
        got = plan.convert(row)
        assert got == reference(row)
        assert list(got) == [name for name, _ in SIGNATURE]
        # an event built from the plan's values serializes as the reference event does
        fast = ChangeEvent.native("t", "p", "postgresql", "s", "s", "x", "c", None, got, None, "1:0/1",
                                  "0/1:0", {}, 0, 1, 1, False, False, None, not flag[0])
        slow = ChangeEvent.build(tenant="t", pipeline="p", connector="postgresql", db="s", schema="s",
                                 table="x", op="c", before=None, after=reference(row), key=None,
                                 tx_id="1:0/1", event_id="0/1:0", position={}, ts_ms=0, total_order=1,
                                 data_collection_order=1)
        assert fast.value == slow.value
    flag[0] = False
    plan.convert(ROWS[1])
    assert flag[0]  # the float array column always leaves the check to the event
    nofloat = RowPlan((("id", "bigint"), ("d", "double precision")), flag)
    flag[0] = False
    assert nofloat.convert([Column("id", "bigint", 1), Column("d", "double precision", Decimal("2.5"))]) \
        == {"id": 1, "d": 2.5} and not flag[0]
    assert nofloat.convert([Column("id", "bigint", 1), Column("d", "double precision", Decimal("1E-5"))]) \
        == {"id": 1, "d": 1e-05} and flag[0]


def test_a_row_of_another_signature_is_refused():
    plan = RowPlan((("id", "bigint"), ("v", "integer")), [False])
    assert plan.convert([Column("id", "bigint", 1), Column("v", "integer", 2)]) == {"id": 1, "v": 2}
    assert plan.convert([Column("id", "bigint", 1), Column("v", "bigint", 2)]) is None  # type changed
    assert plan.convert([Column("id", "bigint", 1), Column("w", "integer", 2)]) is None  # renamed
    assert plan.convert([Column("id", "bigint", 1)]) is None  # fewer columns
    assert RowPlan((), [False]).convert([]) == {}


def test_messages_keep_exact_numbers():
    m = MESSAGE.decode(b'{"action":"I","xid":7,"lsn":"0/1","schema":"s","table":"t","columns":['
                       b'{"name":"n","type":"numeric","value":1.50},{"name":"i","type":"bigint",'
                       b'"value":123456789012345678901234567890},{"name":"d","type":"double precision",'
                       b'"value":1e-05}],"pk":[{"name":"n","type":"numeric"}],"extra":1}')
    assert [c.value for c in m.columns] == [Decimal("1.50"), 123456789012345678901234567890, Decimal("1e-05")]
    assert str(m.columns[0].value) == "1.50" and m.pk[0].name == "n" and m.identity is None
