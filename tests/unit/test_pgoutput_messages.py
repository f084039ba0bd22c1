"""pgoutput messages as pure logic: parsing (built here byte by byte from PostgreSQL's "Logical
Replication Message Formats"), values made as the wal2json path makes them, and transactions
held until their Commit says where they end. The real-WAL comparison with wal2json is
tests/integration/test_pgoutput.py."""

from __future__ import annotations

import struct
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tidegate import cli
from tidegate.events import ChangeEvent, PositionMark, decimal_text
from tidegate.sources.postgres.columns import ColumnTracker, LocalMemory
from tidegate.sources.postgres.pgoutput import (
    UNCHANGED,
    Column,
    PgOutputDecoder,
    Plan,
    ProtocolError,
    commit_us_of,
    float_number,
    json_number,
    lsn_text,
    numeric_text,
    parse_begin,
    parse_commit,
    parse_relation,
    parse_truncate,
    parse_tuple,
    parse_type,
    row_decoder,
)
from tidegate.sources.postgres.position import Lsn, PgPosition
from tidegate.sources.postgres.values import RowPlan, commit_time
from tidegate.sources.postgres.wal2json import Column as Wal2JsonColumn
from tidegate.spec import PipelineSpec, SourceSpec, load_spec

# --------------------------------------------------------------------------- messages, by hand


def begin(final: int, ts: int, xid: int) -> bytes:
    return b"B" + struct.pack(">QqI", final, ts, xid)


def commit(final: int, end: int, ts: int) -> bytes:
    return b"C" + struct.pack(">BQQq", 0, final, end, ts)


def relation(relid: int, schema: str, table: str, ident: str, cols) -> bytes:
    out = b"R" + struct.pack(">I", relid) + schema.encode() + b"\0" + table.encode() + b"\0" + ident.encode()
    out += struct.pack(">H", len(cols))
    for key, name, oid, mod in cols:
        out += bytes([1 if key else 0]) + name.encode() + b"\0" + struct.pack(">Ii", oid, mod)
    return out


def tuple_data(values) -> bytes:
    out = struct.pack(">H", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v is UNCHANGED:
            out += b"u"
        else:
            b = v.encode() if isinstance(v, str) else v
            out += b"t" + struct.pack(">I", len(b)) + b
    return out


def insert(relid: int, values) -> bytes:
    return b"I" + struct.pack(">I", relid) + b"N" + tuple_data(values)


def update(relid: int, values, old=None, kind=b"K") -> bytes:
    head = b"U" + struct.pack(">I", relid)
    return head + (kind + tuple_data(old) if old is not None else b"") + b"N" + tuple_data(values)


def delete(relid: int, old, kind=b"K") -> bytes:
    return b"D" + struct.pack(">I", relid) + kind + tuple_data(old)


def truncate(*relids: int) -> bytes:
    return b"T" + struct.pack(">I", len(relids)) + b"\0" + b"".join(struct.pack(">I", r) for r in relids)


# --------------------------------------------------------------------------- parsing


def test_begin_commit_truncate_type():
    assert parse_begin(begin(0x1_6B374D48, 7, 4242)) == (0x1_6B374D48, 7, 4242)
    assert parse_commit(commit(0x1_6B374D48, 0x1_6B374D80, 7)) == (0x1_6B374D48, 0x1_6B374D80, 7)
    assert parse_truncate(truncate(16384, 16390)) == [16384, 16390]
    assert parse_type(b"Y" + struct.pack(">I", 70001) + b"shop\0posint\0") == (70001, "shop", "posint")
    assert lsn_text(0x1_6B374D48) == "1/6B374D48" == str(Lsn(0x1_6B374D48))


def test_relation_columns_flags_and_the_catalog_schema():
    rel = parse_relation(relation(16384, "", "pg_t", "d", [(True, "id", 23, -1), (False, "ñame", 1043, 24)]))
    assert (rel.relid, rel.schema, rel.table, rel.replica_identity) == (16384, "pg_catalog", "pg_t", "d")
    assert rel.columns == (Column("id", 23, -1, True), Column("ñame", 1043, 24, False))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.just(UNCHANGED), st.text(max_size=40)), max_size=30))
def test_tuple_data_round_trips(values):
    data = b"I" + struct.pack(">I", 1) + b"N" + tuple_data(values) + b"trailing"
    got, end, unchanged = parse_tuple(data, 6)
    assert got == [v.encode() if isinstance(v, str) else v for v in values]
    assert data[end:] == b"trailing" and unchanged == (UNCHANGED in values)


def test_binary_values_are_refused():
    with pytest.raises(ProtocolError, match="binary"):
        parse_tuple(struct.pack(">H", 1) + b"b" + struct.pack(">I", 1) + b"x", 0)


# --------------------------------------------------------------------------- values


def test_numbers_as_the_wal2json_path_reads_them():
    assert [json_number(t) for t in (b"NaN", b"Infinity", b"-Infinity", b"nan", b"infinity")] == [None] * 5
    assert json_number(b"-0") == 0 and type(json_number(b"-0")) is int  # as JSON -0 parses: 0.0 after
    assert json_number(b"123456789012345678901234567890") == 123456789012345678901234567890
    assert json_number(b"1e+16") == Decimal("1E+16") and json_number(b"0.10") == Decimal("0.10")
    assert str(json_number(b"0.0000001")) == "1E-7"
    for text in (b"-0", b"0", b"-0.0", b"1e-05", b"2.718281828459045", b"-1.5e+300", b"123456789012345678901",
                 b"NaN", b"-Infinity"):
        number = json_number(text)
        expected = None if number is None else float(number)
        assert repr(float_number(text)) == repr(expected), text  # -0.0 and 0.0 told apart


@settings(max_examples=500, deadline=None)
@given(st.decimals(allow_nan=False, allow_infinity=False, places=None).filter(lambda d: d.is_finite())
       | st.sampled_from([Decimal(x) for x in ("0.0000000", "-0.0000001", "0.000001", "0.0000010", "1000",
                                               "0.10", "123456789012345678901234567890.5000")]))
def test_numeric_text_is_the_string_of_the_exact_number(number):
    """What the server writes for a numeric (plain notation, scale kept) becomes what
    ``decimal_text`` of the parsed JSON number gives on the wal2json path: the server's text."""
    text = f"{number:f}".encode()
    if text.startswith(b"-") and number == 0:
        text = text[1:]  # the server writes no negative zero
    parsed = json_number(text)
    wal2json_path = decimal_text(parsed) if isinstance(parsed, Decimal) else str(parsed)
    assert numeric_text(text) == wal2json_path == text.decode(), text
    assert [numeric_text(t) for t in (b"NaN", b"Infinity", b"-Infinity")] == [None] * 3


@settings(max_examples=500, deadline=None)
@given(st.integers(min_value=-(10**15), max_value=10**16)
       | st.sampled_from([0, 1, 999, 1000, 123456, 847_000_000_123_000, 847_000_000_000_999, -1]))
def test_commit_times_give_the_same_milli_and_microseconds_as_wal2json_text(us):
    """wal2json writes the commit time as text, pgoutput as µs since 2000: the same ms either way
    (floating point included: the wal2json path goes through ``datetime.timestamp()``), and the
    same exact µs since 1970."""
    import datetime as dt

    moment = dt.datetime(2000, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=us)
    wal2json_text = moment.strftime("%Y-%m-%d %H:%M:%S.%f").rstrip("0").rstrip(".") + "+00"
    ms, exact = commit_time(commit_us_of(us))
    assert (ms, exact) == commit_time(wal2json_text)
    assert exact == us + 946_684_800_000_000
    assert ms == int(moment.timestamp() * 1000)  # what ts_ms always was (tidegate's envelope)


def test_commit_time_of_a_zoned_text_and_of_nothing():
    assert commit_time("2026-11-27 12:13:31.905033+02") == (1795774411905, 1795774411905033)
    assert commit_time(None) == (0, None) and commit_time("") == (0, None)


# (name, type oid, typmod, wal2json type name, pgoutput text, what wal2json's JSON holds)
TYPES = [
    ("bi", 20, -1, "bigint", b"-9223372036854775808", -9223372036854775808),
    ("n", 1700, (12 << 16 | 2) + 4, "numeric(12,2)", b"1.50", Decimal("1.50")),
    ("nn", 1700, -1, "numeric", b"NaN", None),
    ("ns", 1700, -1, "numeric", b"0.0000001", Decimal("0.0000001")),
    ("d", 701, -1, "double precision", b"-0", 0),
    ("dx", 701, -1, "double precision", b"1e+16", Decimal("1e+16")),
    ("di", 701, -1, "double precision", b"-Infinity", None),
    ("r", 700, -1, "real", b"3.14", Decimal("3.14")),
    ("t", 25, -1, "text", "tëxt ✓ 😀 \"q\" \\".encode(), "tëxt ✓ 😀 \"q\" \\"),
    ("by", 17, -1, "bytea", b"\\x00ff10", "00ff10"),
    ("ts", 1114, 6, "timestamp(6) without time zone", b"2024-01-02 03:04:05.5", "2024-01-02 03:04:05.5"),
    ("tz", 1184, -1, "timestamp with time zone", b"2024-01-02 03:04:05+00", "2024-01-02 03:04:05+00"),
    ("fa", 1022, -1, "double precision[]", b"{1e-05,2.5,NULL}", "{1e-05,2.5,NULL}"),
    ("ia", 1007, -1, "integer[]", b"{1,NULL}", "{1,NULL}"),
    ("bo", 16, -1, "boolean", b"t", True),
    ("bf", 16, -1, "boolean", b"f", False),
    ("dm", 70001, -1, "shop.posint", b"7", "7"),  # a domain over int: text, as wal2json writes it
    ("j", 3802, -1, "jsonb", b'{"a": 1}', '{"a": 1}'),
    ("nul", 23, -1, "integer", None, None),
]


def test_plans_and_decoders_give_what_the_wal2json_plan_gives_for_the_same_values():
    columns = tuple(Column(n, oid, mod, False) for n, oid, mod, *_ in TYPES)
    types = tuple(t[3] for t in TYPES)
    flag_a, flag_b, flag_c = [False], [False], [False]
    plan = Plan(columns, types, tuple(range(len(TYPES))), flag_a)
    wal2json = RowPlan(tuple((t[0], t[3]) for t in TYPES), flag_b)
    got = plan.convert([t[4] for t in TYPES])
    expected = wal2json.convert([Wal2JsonColumn(t[0], t[3], t[5]) for t in TYPES])
    assert got == expected and list(got) == list(expected) and plan.signature == wal2json.signature
    assert [type(v) for v in got.values()] == [type(v) for v in expected.values()]
    # the generated decoder reads the same row from the message bytes in one pass
    decoded = row_decoder(columns, types, flag_c)(tuple_data([t[4] for t in TYPES]), 0)
    assert decoded == expected and [type(v) for v in decoded.values()] == [type(v) for v in expected.values()]
    assert flag_c == [True]
    with_unchanged = tuple_data([UNCHANGED] + [t[4] for t in TYPES[1:]])
    assert row_decoder(columns, types, [False])(with_unchanged, 0) is None  # left to a Plan
    assert got["d"] == 0.0 and str(got["d"]) == "0.0" and got["by"] == "AP8Q" and got["nn"] is None
    assert flag_a == flag_b == [True]  # the arrays and 1e16 make the event check its floats
    some = Plan(columns, types, (0, 2), [False])  # a choice of columns: the replica identity's
    assert some.convert([t[4] for t in TYPES]) == {"bi": expected["bi"], "nn": None}
    assert some.signature == (("bi", "bigint"), ("nn", "numeric"))


# --------------------------------------------------------------------------- transactions


class FakeServer:
    """The queries the reader asks (type names, a primary key) and the lineage it stamps."""

    NAMES = {(23, -1): "integer", (25, -1): "text"}

    def __init__(self):
        self.asked: list[str] = []

    def query(self, sql, args=None):
        self.asked.append(sql)
        if "format_type" in sql:
            return [(o, m, self.NAMES[(o, m)]) for o, m in zip(*args, strict=True)]
        return [("id",)]  # the primary key of a table whose replica identity is not the default

    def system_and_timeline(self):
        return "7", 1


class Host:
    def __init__(self, tables=()):
        self.spec = PipelineSpec(pipeline="p", tenant="t", sinks=(),
                                 source=SourceSpec(kind="postgres", conn_id="c"))
        self.tables = frozenset(tables)
        self.server = FakeServer()

    def table_columns(self, schema, table):
        return ["id", "v"]

    def column_tracker(self, start):
        return ColumnTracker(LocalMemory(), start, "t", "p")


REL = relation(5, "s", "t", "d", [(True, "id", 23, -1), (False, "v", 25, -1)])
FULL = relation(6, "s", "f", "f", [(True, "id", 23, -1), (True, "v", 25, -1)])


def reader(start: int, upto: int, host=None, spool: int | None = None) -> PgOutputDecoder:
    r = PgOutputDecoder(host or Host(), Lsn(start), PgPosition(Lsn(upto), "7", 1))
    if spool is not None:
        r.spool_bytes = spool
    return r


def tx(final, end, *changes, xid=1, ts=0):
    return [(final - 1, begin(final, ts, xid)), *changes, (end, commit(final, end, ts))]


def row(r: PgOutputDecoder, tup) -> tuple[dict, tuple]:
    """A tuple's row and signature, as the read path converts it."""
    return r._convert("s", "t", tup), r.plan.signature


def test_a_transaction_is_passed_on_once_its_commit_says_where_it_ends():
    msgs = tx(0x100, 0x130, (0, REL), (0xF0, insert(5, ["1", "a"])), (0xF8, update(5, ["1", "b"])),
              (0xFA, delete(5, ["1", None])), (0xFC, truncate(5)))
    r = reader(0, 0x200)
    got = list(r.changes(iter(msgs)))
    assert [c.action for c in got] == ["B", "I", "U", "D", "T", "C"]
    b, i, u, d, t, _ = got
    # the commit time in µs since 1970
    assert (b.xid, b.lsn, b.nextlsn, b.timestamp) == (1, "0/100", Lsn(0x130), 946_684_800_000_000)
    assert (i.lsn, i.schema, i.table, [k.name for k in i.pk]) == ("0/F0", "s", "t", ["id"])
    assert row(r, i.columns) == ({"id": 1, "v": "a"}, (("id", "integer"), ("v", "text")))
    assert i.identity is None
    # no old tuple: the key did not change, and wal2json takes the identity from the new row
    assert row(r, u.identity) == ({"id": 1}, (("id", "integer"),))
    assert row(r, u.columns) == ({"id": 1, "v": "b"}, (("id", "integer"), ("v", "text")))
    assert row(r, d.identity) == ({"id": 1}, (("id", "integer"),)) and d.columns is None
    assert (t.schema, t.table, t.lsn) == ("s", "t", "0/FC")


def test_the_items_of_a_read():
    msgs = tx(0x100, 0x130, (0, REL), (0xF0, insert(5, ["1", "a"])), (0xF2, insert(5, ["2", "b"])))
    items = list(reader(0, 0x130).run(iter(msgs)))
    assert [isinstance(i, ChangeEvent) for i in items] == [True, True]  # the read ends at its bound
    a, b = items
    assert (a.tx_id, a.event_id, a.after, a.key, a.tx_end) == ("1:0/100", "0/F0:0", {"id": 1, "v": "a"},
                                                               {"id": 1}, False)
    assert (b.tx_end, b.end_position) == (True, PgPosition(Lsn(0x130), "7", 1))
    assert list(reader(0, 0x200).run(iter(msgs)))[-1] == PositionMark(PgPosition(Lsn(0x200), "7", 1))


def test_unchanged_toast_values_are_left_out_and_full_identity_gives_every_column():
    msgs = tx(0x100, 0x130, (0, FULL), (0xF0, update(6, ["1", UNCHANGED], old=["1", "big"], kind=b"O")))
    r = reader(0, 0x200)
    (_, u, _) = r.changes(iter(msgs))
    assert row(r, u.identity) == ({"id": 1, "v": "big"}, (("id", "integer"), ("v", "text")))
    # as wal2json writes it: no "v"; but its signature is the relation's, which names "v"
    assert row(r, u.columns) == ({"id": 1}, (("id", "integer"), ("v", "text")))
    (ev,) = [i for i in reader(0, 0x200).run(iter(msgs)) if isinstance(i, ChangeEvent)]
    assert ev.after == {"id": 1, "v": "big"}  # filled from the old row, as on the wal2json path
    host = Host()
    r = reader(0, 0x200, host)
    list(r.run(iter(msgs)))
    assert any("indisprimary" in s for s in host.server.asked)  # FULL: the key comes from the catalog


def test_a_renamed_column_is_not_kept_beside_its_new_name():
    """Found by the generated comparison (seeds 1-10, a RENAME COLUMN mid-stream): an UPDATE
    after the rename had the old name too, as an unchanged TOAST placeholder, because the column
    set was merged as wal2json's must be. pgoutput's relation names every column."""
    renamed = relation(5, "s", "t", "d", [(True, "id", 23, -1), (False, "w", 25, -1)])
    msgs = (tx(0x100, 0x130, (0, REL), (0xF0, insert(5, ["1", "a"])), xid=1)
            + tx(0x200, 0x230, (0x1F0, renamed), (0x1F4, update(5, ["1", "b"])), xid=2)
            + tx(0x300, 0x330, (0x2F0, update(5, ["1", UNCHANGED])), xid=3))
    events = [i for i in reader(0, 0x400).run(iter(msgs)) if isinstance(i, ChangeEvent)]
    assert [e.after for e in events] == [{"id": 1, "v": "a"}, {"id": 1, "w": "b"},
                                         {"id": 1, "w": "__debezium_unavailable_value"}]


def test_the_bound_and_the_start():
    first = tx(0x100, 0x130, (0, REL), (0xF0, insert(5, ["1", "a"])), xid=1)
    second = tx(0x200, 0x230, (0x1F0, insert(5, ["2", "b"])), xid=2)  # no Relation: already sent
    straddling = tx(0x300, 0x330, (0x2F0, insert(5, ["3", "c"])), xid=3)
    after = tx(0x400, 0x430, (0x3F0, insert(5, ["4", "d"])), xid=4)
    msgs = first + second + straddling + after

    def xids(start, upto):
        return [c.xid for c in reader(start, upto).changes(iter(msgs)) if c.action == "B"]

    assert xids(0, 0x1000) == [1, 2, 3, 4]
    assert xids(0x130, 0x1000) == [2, 3, 4]  # the first ended at the start; its Relation still counts
    assert xids(0x130, 0x310) == [2]  # the third's commit record ends after the bound
    assert xids(0x130, 0x300) == [2]  # a commit record starting at the bound: the read ends there


def test_a_transaction_larger_than_memory_goes_through_a_file():
    rows = [(0x100 + k, insert(5, [str(k), "x" * 100])) for k in range(200)]
    msgs = [(0, begin(0x1000, 0, 9)), (0, REL), *rows, (0x1100, commit(0x1000, 0x1100, 0))]
    held = [(c.action, c.lsn, c.columns and c.columns.data[c.columns.pos:])
            for c in reader(0, 0x2000).changes(iter(msgs))]
    spooled = [(c.action, c.lsn, c.columns and c.columns.data[c.columns.pos:])
               for c in reader(0, 0x2000, spool=1024).changes(iter(msgs))]
    assert spooled == held and len(held) == 202


# --------------------------------------------------------------------------- the spec


def write_spec(tmp_path, source: str):
    path = tmp_path / "p.yaml"
    sink = "{id: a, kind: redis, conn_id: r, stream: s}"
    path.write_text(f"pipeline: p\nsource: {source}\nsinks:\n  - {sink}\n")
    return path


def test_plugin_and_publication_in_the_spec(tmp_path):
    path = write_spec(tmp_path, "{kind: postgres, conn_id: pg, plugin: pgoutput, publication: shop_pub}")
    spec = load_spec(path)
    assert (spec.source.plugin, spec.source.publication) == ("pgoutput", "shop_pub")
    spec = load_spec(write_spec(tmp_path, "{kind: postgres, conn_id: pg}"))
    assert (spec.source.plugin, spec.source.publication) == (None, None)  # the slot's / the server's choice


@pytest.mark.parametrize("source,field,words", [
    ("{kind: postgres, conn_id: pg, plugin: decoderbufs}", "source.plugin",
     "unknown value 'decoderbufs'; allowed: wal2json | pgoutput"),
    ("{kind: postgres, conn_id: pg, plugin: wal2json, publication: p1}", "source.publication",
     "only read with plugin: pgoutput"),
    ("{kind: postgres, conn_id: pg, publication: Shop-Pub}", "source.publication", "malformed value"),
    ("{kind: mysql, conn_id: db, plugin: pgoutput}", "source.plugin", "only for postgres sources"),
])
def test_tidegate_validate_names_the_field_and_what_is_allowed(tmp_path, capsys, source, field, words):
    path = write_spec(tmp_path, source)
    assert cli.main(["validate", str(path)]) == 1
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith(f"{path}: {field}: ") and words in line, line
