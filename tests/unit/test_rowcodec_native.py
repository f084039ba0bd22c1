"""The compiled row path (tidegate.native.rowcodec) against the pure-Python path: the same
binlog bytes read by BinlogDecoder with ``native=True`` and ``native=False`` give the same items,
byte for byte (value, message key, idempotency key) and field for field, for every column kind
the compiled path covers, NULLs, before and after images, and the events it leaves to the Python
path (a primary key change, a zero date, text that is not UTF-8).

The extension is built by ``make install``; this test fails (never skips) where it is not, unless
``TIDEGATE_NATIVE=0`` says the pure-Python path is wanted on purpose.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_mysql_rows import Stream, StubSource, pack_datetime2, pack_decimal, pack_frac, pack_time2
from tidegate.errors import SourceError
from tidegate.events import ChangeEvent, PositionMark
from tidegate.native import NATIVE_ENV, rowcodec
from tidegate.shipped import ShippedEvent
from tidegate.sources.mysql import binlog_client as B
from tidegate.sources.mysql import row_plans as R
from tidegate.sources.mysql.decoder import BinlogDecoder
from tidegate.sources.mysql.position import BinlogPosition
from tidegate.sources.mysql.transactions import GtidState

UTF8, BINARY = 45, 63  # collation ids: utf8mb4_general_ci, binary
LENENC_NEEDED = 251  # a length-encoded integer from here on takes more than one byte

# (name, binlog type, table map metadata, unsigned, collation, value maker)
# The value makers take a random source and give (stored bytes) for a non-NULL value.


def _text(rnd: random.Random, n: int) -> str:
    alphabet = "abcXYZ 019\"\\/\n\t\r\x00\x01\x1f\x7f é€𝄞ü\u2028'"
    return "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, n)))


def _len(width: int, data: bytes) -> bytes:
    return len(data).to_bytes(width, "little") + data


def _int(size: int, unsigned: bool):
    lo, hi = (0, 2 ** (8 * size) - 1) if unsigned else (-(2 ** (8 * size - 1)), 2 ** (8 * size - 1) - 1)

    def make(rnd: random.Random) -> bytes:
        v = rnd.choice([lo, hi, 0, 1, -1 if not unsigned else 2, rnd.randint(lo, hi)])
        return v.to_bytes(size, "little", signed=not unsigned)
    return make


def _decimal(precision: int, scale: int):
    def make(rnd: random.Random) -> bytes:
        ip = rnd.choice([0, 1, rnd.randint(0, 10 ** (precision - scale) - 1)])
        fp = rnd.randint(0, 10 ** scale - 1) if scale else 0
        neg = rnd.random() < 0.4 and (ip or fp)
        text = ("-" if neg else "") + str(ip) + (f".{fp:0{scale}d}" if scale else "")
        return pack_decimal(text, precision, scale)
    return make


def _double(rnd: random.Random) -> bytes:
    v = rnd.choice([0.0, -0.0, 0.1, 123.0, 1e16, 1e15 + 0.5, 1e-5, 1e-4, 2.5e-300, -1.7e308, 1e22,
                    rnd.uniform(-1e6, 1e6), rnd.random()])
    return struct.pack("<d", v)


def _datetime2(fsp: int):
    def make(rnd: random.Random) -> bytes:
        v = dt.datetime(rnd.choice([1, 999, 1970, 2024, 9999]), rnd.randint(1, 12), rnd.randint(1, 28),
                        rnd.randint(0, 23), rnd.randint(0, 59), rnd.randint(0, 59),
                        rnd.choice([0, rnd.randint(0, 999_999)]))
        us = v.microsecond - v.microsecond % (10 ** (6 - fsp)) if fsp else 0
        return pack_datetime2(v.replace(microsecond=us), fsp)
    return make


def _timestamp2(fsp: int):
    def make(rnd: random.Random) -> bytes:
        secs = rnd.choice([0, 1, 951_782_400, 2**31 - 1, rnd.randint(1, 2**32 - 1)])
        us = rnd.choice([0, rnd.randint(0, 999_999)])
        us = us - us % (10 ** (6 - fsp)) if fsp else 0
        return secs.to_bytes(4, "big") + pack_frac(us, fsp)
    return make


def _time2(fsp: int):
    def make(rnd: random.Random) -> bytes:
        us = rnd.choice([0, rnd.randint(0, 999_999)])
        return pack_time2(rnd.random() < 0.4, rnd.randint(0, 838), rnd.randint(0, 59), rnd.randint(0, 59),
                          us, fsp)
    return make


def _date(rnd: random.Random) -> bytes:
    y, m, d = rnd.choice([1, 2000, 2024, 9999]), rnd.randint(1, 12), rnd.randint(1, 28)
    return (y << 9 | m << 5 | d).to_bytes(3, "little")


COLUMNS = [
    ("id", R.LONGLONG, b"", False, None, _int(8, False)),
    ("a_key", R.VARCHAR, struct.pack("<H", 40), False, UTF8, lambda r: _len(1, _text(r, 9).encode())),
    ("ti", R.TINY, b"", False, None, _int(1, False)),
    ("tu", R.TINY, b"", True, None, _int(1, True)),
    ("sm", R.SHORT, b"", False, None, _int(2, False)),
    ("su", R.SHORT, b"", True, None, _int(2, True)),
    ("md", R.INT24, b"", False, None, _int(3, False)),
    ("mu", R.INT24, b"", True, None, _int(3, True)),
    ("lg", R.LONG, b"", False, None, _int(4, False)),
    ("lu", R.LONG, b"", True, None, _int(4, True)),
    ("bu", R.LONGLONG, b"", True, None, _int(8, True)),
    ("dbl", R.DOUBLE, b"\x08", False, None, _double),
    ("yr", R.YEAR, b"", False, None, lambda r: bytes([r.choice([0, 1, 124, 255])])),
    ("dec", R.NEWDECIMAL, bytes([12, 2]), False, None, _decimal(12, 2)),
    ("dec0", R.NEWDECIMAL, bytes([30, 0]), True, None, _decimal(30, 0)),
    ("dec6", R.NEWDECIMAL, bytes([8, 6]), False, None, _decimal(8, 6)),
    ("dec9", R.NEWDECIMAL, bytes([27, 5]), False, None, _decimal(27, 5)),
    ("vl", R.VARCHAR, struct.pack("<H", 4000), False, UTF8, lambda r: _len(2, _text(r, 40).encode())),
    ("ch", R.STRING, bytes([R.STRING, 32]), False, UTF8, lambda r: _len(1, _text(r, 8).encode())),
    ("bn", R.STRING, bytes([R.STRING, 4]), False, BINARY,
     lambda r: _len(1, bytes(r.randint(0, 255) for _ in range(r.randint(0, 4))).rstrip(b"\x00"))),
    ("vb", R.VARCHAR, struct.pack("<H", 10), False, BINARY,
     lambda r: _len(1, bytes(r.randint(0, 255) for _ in range(r.randint(0, 10))))),
    ("tx", R.BLOB, b"\x02", False, UTF8, lambda r: _len(2, _text(r, 60).encode())),
    ("bl", R.BLOB, b"\x02", False, BINARY,
     lambda r: _len(2, bytes(r.randint(0, 255) for _ in range(r.randint(0, 50))))),
    ("mt", R.BLOB, b"\x03", False, UTF8, lambda r: _len(3, _text(r, 20).encode())),
    ("js", R.BLOB, b"\x04", False, UTF8, lambda r: _len(4, b'{"k": [1, "\\u00e9"]}')),
    ("dt", R.DATE, b"", False, None, _date),
    ("d0", R.DATETIME2, b"\x00", False, None, _datetime2(0)),
    ("d3", R.DATETIME2, b"\x03", False, None, _datetime2(3)),
    ("d6", R.DATETIME2, b"\x06", False, None, _datetime2(6)),
    ("t0", R.TIMESTAMP2, b"\x00", False, None, _timestamp2(0)),
    ("t2", R.TIMESTAMP2, b"\x02", False, None, _timestamp2(2)),
    ("t5", R.TIMESTAMP2, b"\x05", False, None, _timestamp2(5)),
    ("tm0", R.TIME2, b"\x00", False, None, _time2(0)),
    ("tm1", R.TIME2, b"\x01", False, None, _time2(1)),
    ("tm4", R.TIME2, b"\x04", False, None, _time2(4)),
    ("tm6", R.TIME2, b"\x06", False, None, _time2(6)),
]
PK = (0, 1)  # (id, a_key): the message key sorts the names, the envelope's key keeps this order
TABLE_ID = 42


def _lenenc(n: int) -> bytes:
    assert n < LENENC_NEEDED
    return bytes([n])


def table_map(columns=COLUMNS, pk=PK, schema: str = "db", table: str = "t") -> bytes:
    n = len(columns)
    names = b"".join(bytes([len(x)]) + x + b"\x00" for x in (schema.encode(), table.encode()))
    body = TABLE_ID.to_bytes(6, "little") + b"\x01\x00" + names
    meta = b"".join(c[2] for c in columns)
    body += _lenenc(n) + bytes(c[1] for c in columns) + _lenenc(len(meta)) + meta
    nullable = sum(1 << i for i in range(n) if i not in pk)
    body += nullable.to_bytes((n + 7) // 8, "little")
    numeric = [c for c in columns if c[1] in R.NUMERIC_TYPES]
    sign = sum(0x80 >> (k % 8) << (8 * (k // 8)) for k, c in enumerate(numeric) if c[3])
    charset = b"".join(_lenenc(c[4]) for c in columns if c[4] is not None)
    names = b"".join(_lenenc(len(c[0])) + c[0].encode() for c in columns)
    for kind, data in [(R.SIGNEDNESS, sign.to_bytes((len(numeric) + 7) // 8, "little")),
                       (R.COLUMN_CHARSET, charset), (R.COLUMN_NAME, names),
                       (R.SIMPLE_PRIMARY_KEY, b"".join(_lenenc(i) for i in pk))]:
        body += bytes([kind]) + _lenenc(len(data)) + data
    return body


def image(rnd: random.Random, columns=COLUMNS, pk=PK, fixed: dict | None = None) -> bytes:
    """A full row image: the NULL bitmap, then every non-NULL column's stored bytes."""
    fixed = fixed or {}
    nulls, data = 0, b""
    for i, c in enumerate(columns):
        if i not in pk and c[0] not in fixed and rnd.random() < 0.15:
            nulls |= 1 << i
        else:
            data += fixed.get(c[0]) or c[5](rnd)
    return nulls.to_bytes((len(columns) + 7) // 8, "little") + data


def rows_event(etype: int, images: list[bytes], ncols: int = len(COLUMNS)) -> bytes:
    full = bytes([0xFF] * (ncols // 8)) + (bytes([(1 << (ncols % 8)) - 1]) if ncols % 8 else b"")
    bitmaps = full * (2 if etype == B.UPDATE_ROWS_EVENT_V2 else 1)
    head = TABLE_ID.to_bytes(6, "little") + b"\x00\x00" + b"\x02\x00"  # table id, flags, no extra data
    return head + _lenenc(ncols) + bitmaps + b"".join(images)


def stream(transactions: list[list[tuple[int, list[bytes]]]], tm: bytes | None = None) -> tuple[Stream, int]:
    """A MySQL 8 style stream (v2 row events) of the given transactions."""
    s = Stream()
    s.add(B.ROTATE_EVENT, struct.pack("<Q", 4) + b"binlog.000001", artificial=True)
    fde = struct.pack("<H", 4) + b"8.0.36".ljust(50, b"\x00") + struct.pack("<I", 0) + b"\x13"
    lengths = bytearray(40)
    lengths[B.TABLE_MAP_EVENT - 1], lengths[B.QUERY_EVENT - 1] = 8, 13
    for t in (B.WRITE_ROWS_EVENT_V2, B.UPDATE_ROWS_EVENT_V2, B.DELETE_ROWS_EVENT_V2):
        lengths[t - 1] = 10
    s.add(B.FORMAT_DESCRIPTION_EVENT, fde + bytes(lengths) + b"\x01")
    sid = bytes(range(16))
    for k, events in enumerate(transactions):
        s.add(B.GTID_LOG_EVENT, b"\x00" + sid + struct.pack("<Q", k + 1) + b"\x02" + bytes(16))
        s.add(B.QUERY_EVENT, bytes(8) + b"\x02" + bytes(2) + b"\x00\x00" + b"db\x00" + b"BEGIN")
        for etype, images, *its_map in events:  # (etype, images[, the table map before it])
            s.add(B.TABLE_MAP_EVENT, its_map[0] if its_map else tm or table_map())
            s.add(etype, rows_event(etype, images))
        s.add(B.XID_EVENT, struct.pack("<Q", 1000 + k))
    return s, s.pos


def read(s: Stream, end: int, native: bool, tables=("db.t",)) -> list:
    reader = BinlogDecoder(StubSource(tables), s, BinlogPosition("binlog.000001", 4),
                        BinlogPosition("binlog.000001", end), GtidState(None, "mysql"),
                        codec_for=lambda c: None if c == BINARY else "utf-8", native=native)
    return list(reader.run())


FIELDS = ("op", "db", "schema", "table", "tx_id", "tx_end", "end_position", "headers", "tenant", "pipeline",
          "connector", "before", "after", "key", "event_id", "position", "ts_ms", "total_order",
          "data_collection_order", "snapshot", "id")


def assert_same(compiled: list, python: list) -> None:
    assert len(compiled) == len(python)
    for c, p in zip(compiled, python, strict=True):
        assert type(c) is type(p) or (type(c) is ShippedEvent and type(p) is ChangeEvent)
        if isinstance(p, PositionMark):
            assert c == p
            continue
        assert c.value == p.value
        assert c.key_bytes == p.key_bytes
        assert c.idempotency_key == p.idempotency_key
        for name in FIELDS:
            assert getattr(c, name) == getattr(p, name), name


@pytest.fixture(scope="module", autouse=True)
def built():
    if os.environ.get(NATIVE_ENV, "1") == "0":
        pytest.fail(f"{NATIVE_ENV}=0 turns the compiled path off: this test compares it with the Python path")
    assert rowcodec is not None, ("tidegate.native.rowcodec is not built: run `make install` "
                                  "(or .venv/bin/python scripts/build_native.py)")


def test_every_covered_column_kind_gives_the_same_bytes_as_the_python_path():
    rnd = random.Random(22)
    txs = []
    for _ in range(40):
        events = []
        for etype in (B.WRITE_ROWS_EVENT_V2, B.UPDATE_ROWS_EVENT_V2, B.DELETE_ROWS_EVENT_V2):
            images = []
            for _ in range(rnd.randint(1, 6)):
                before = image(rnd)
                images.append(before)
                if etype == B.UPDATE_ROWS_EVENT_V2:  # the after image: the same key, other values
                    images.append(_same_key(rnd, before))
            events.append((etype, images))
        txs.append(events)
    s, end = stream(txs)
    compiled, python = read(s, end, True), read(s, end, False)
    events = sum(isinstance(i, ChangeEvent) for i in python)
    assert sum(type(i) is ShippedEvent for i in compiled) == events > 300
    assert all(type(i) is not ShippedEvent for i in python)
    assert_same(compiled, python)


# Schema and table names as MySQL allows them (no NUL; no dot here, where the stub source splits
# "schema.table" on it): quotes, backslashes, control characters and characters beyond ASCII,
# which the envelope's JSON escapes.
_NAMES = st.text(st.characters(blacklist_characters="\x00.", blacklist_categories=("Cs",)),
                 min_size=1, max_size=12)


@given(st.lists(st.tuples(_NAMES, _NAMES), min_size=1, max_size=3, unique=True),
       st.lists(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(1, 3)),
                         min_size=1, max_size=4), min_size=1, max_size=4),
       st.integers(0, 2**32))
@settings(max_examples=40, deadline=None)
def test_any_table_names_and_transactions_give_the_same_envelopes_on_both_paths(tables, transactions, seed):
    """The compiled rows' envelope text is built once per table and once per transaction and
    joined per rows event: over generated names (escaped in JSON or not) and transactions
    interleaving the tables' rows events, every byte is the Python path's."""
    rnd = random.Random(seed)
    etypes = (B.WRITE_ROWS_EVENT_V2, B.UPDATE_ROWS_EVENT_V2, B.DELETE_ROWS_EVENT_V2)
    txs = []
    for events in transactions:
        tx = []
        for which, kind, rows in events:
            images = []
            for _ in range(rows):
                images.append(image(rnd))
                if etypes[kind] == B.UPDATE_ROWS_EVENT_V2:
                    images.append(_same_key(rnd, images[-1]))
            schema, table = tables[which % len(tables)]
            tx.append((etypes[kind], images, table_map(schema=schema, table=table)))
        txs.append(tx)
    s, end = stream(txs)
    names = [f"{schema}.{table}" for schema, table in tables]
    compiled, python = read(s, end, True, names), read(s, end, False, names)
    assert sum(type(i) is ShippedEvent for i in compiled) == sum(isinstance(i, ChangeEvent) for i in python)
    assert {(i.db, i.table) for i in python if isinstance(i, ChangeEvent)} <= set(tables)
    assert_same(compiled, python)


def _same_key(rnd: random.Random, before: bytes) -> bytes:
    """An after image with the key (id, a_key) of ``before`` and new other values."""
    n = (len(COLUMNS) + 7) // 8
    id_bytes = before[n:n + 8]
    klen = before[n + 8]
    key_text = before[n + 8:n + 9 + klen]
    return image(rnd, fixed={"id": id_bytes, "a_key": key_text})


def test_events_the_compiled_path_leaves_to_python_come_out_the_same():
    rnd = random.Random(5)
    n = (len(COLUMNS) + 7) // 8
    zero_date = image(rnd, fixed={"dt": b"\x00\x00\x00", "d0": bytes(5)})
    nulls_only = image(random.Random(1), fixed={})
    changed = image(rnd)
    moved = image(rnd, fixed={"id": (123456).to_bytes(8, "little")})  # another key: a delete + a create
    assert moved[n:n + 8] != changed[n:n + 8]
    s, end = stream([[(B.WRITE_ROWS_EVENT_V2, [zero_date, nulls_only])],
                     [(B.UPDATE_ROWS_EVENT_V2, [changed, moved]), (B.WRITE_ROWS_EVENT_V2, [image(rnd)])]])
    compiled, python = read(s, end, True), read(s, end, False)
    assert [i.op for i in python if isinstance(i, ChangeEvent)] == ["c", "c", "d", "c", "c"]
    # the first two events hold a zero date, the update changes its key: the Python path's
    assert [type(i) for i in compiled][:5] == [ChangeEvent] * 4 + [ShippedEvent]
    assert_same(compiled, python)


def test_text_that_is_not_utf8_fails_as_in_the_python_path():
    rnd = random.Random(9)
    bad = image(rnd, fixed={"vl": _len(2, b"ok\xff\xfe")})
    s, end = stream([[(B.WRITE_ROWS_EVENT_V2, [bad])]])
    errors = []
    for native in (True, False):
        with pytest.raises(SourceError) as exc:
            read(s, end, native)
        errors.append(str(exc.value))
    assert errors[0] == errors[1] and "UnicodeDecodeError" in errors[0]


def test_a_table_with_a_column_the_compiled_path_does_not_cover_takes_the_python_path():
    cols = [R.Column(0, R.LONG, False, "id"), R.Column(1, R.FLOAT, True, "f", length=4)]
    plan = R.build_plan(R.TableMap(7, "db", "t", cols, [0]), lambda c: "utf-8")
    assert plan.decode is not None and plan.native is None
    latin = [R.Column(0, R.LONG, False, "id"), R.Column(1, R.VARCHAR, True, "s", length=20, collation=8)]
    assert R.build_plan(R.TableMap(7, "db", "t", latin, [0]), lambda c: "tidegate-latin1").native is None
    covered = [R.Column(0, R.LONG, False, "id"), R.Column(1, R.VARCHAR, True, "s", length=20, collation=45)]
    assert R.build_plan(R.TableMap(7, "db", "t", covered, [0]), lambda c: "utf-8").native is not None


def test_shipped_rows_are_rebuilt_as_the_python_loop_rebuilds_them():
    from tidegate.events import ControlMessage
    from tidegate.shipped import item_to_row, row_to_item

    rnd = random.Random(11)
    s, end = stream([[(B.WRITE_ROWS_EVENT_V2, [image(rnd), image(rnd)])],
                     [(B.DELETE_ROWS_EVENT_V2, [image(rnd)])]])
    items = read(s, end, True) + [ControlMessage("acme", "p", "gap", "g1", None, 5)]
    items[0].__dict__["headers"] = {"__debezium.newkey": b'{"id":1}'}
    rows = [item_to_row(i) for i in items]
    compiled = rowcodec.events_from_rows(rows, ShippedEvent, row_to_item)
    python = [row_to_item(r) for r in rows]
    assert [type(i) for i in compiled] == [type(i) for i in python]
    for c, p in zip(compiled, python, strict=True):
        assert c.__dict__ == p.__dict__ if not isinstance(p, ControlMessage) else c is p


def test_items_become_rows_as_the_python_loop_makes_them():
    from tidegate.events import ControlMessage
    from tidegate.shipped import item_to_row

    rnd = random.Random(12)
    s, end = stream([[(B.WRITE_ROWS_EVENT_V2, [image(rnd), image(rnd)])],
                     [(B.DELETE_ROWS_EVENT_V2, [image(rnd)])]])
    items = read(s, end, True) + read(s, end, False) + [ControlMessage("acme", "p", "gap", "g1", None, 5),
                                                        PositionMark(BinlogPosition("b.000001", 4))]
    items[0].__dict__["headers"] = {"__debezium.newkey": b'{"id":1}'}
    assert {type(i) for i in items} == {ShippedEvent, ChangeEvent, ControlMessage, PositionMark}
    python = [item_to_row(i) for i in items]
    compiled = rowcodec.rows_from_items(items, ShippedEvent, item_to_row)
    assert compiled == python
    assert compiled[0][11] == {"__debezium.newkey": b'{"id":1}'} and compiled[1][11] is None


def test_a_packed_batch_gives_back_the_items_the_rows_give():
    """What a reader process sends (shipped.pack, a packed batch) rebuilds the same items as the
    rows it sent before: events of both paths, headers, a key-less event, marks, a control."""
    import pickle

    from tidegate.events import ControlMessage
    from tidegate.shipped import item_to_row, pack, row_to_item, unpack

    rnd = random.Random(13)
    s, end = stream([[(B.WRITE_ROWS_EVENT_V2, [image(rnd), image(rnd), image(rnd)])],
                     [(B.UPDATE_ROWS_EVENT_V2, [image(rnd) + image(rnd)])],
                     [(B.DELETE_ROWS_EVENT_V2, [image(rnd)])]])
    items = read(s, end, True) + read(s, end, False) + [ControlMessage("acme", "p", "gap", "g1", None, 5),
                                                        PositionMark(BinlogPosition("b.000001", 4))]
    items[0].__dict__["headers"] = {"__debezium.newkey": b'{"id":1}'}
    items[1].__dict__["key_bytes"] = None
    items[2].__dict__["commit_us"] = 1_700_000_000_123_456
    assert {type(i) for i in items} == {ShippedEvent, ChangeEvent, ControlMessage, PositionMark}
    assert any(i.tx_end and i.end_position is not None for i in items if isinstance(i, ShippedEvent))
    message = pickle.loads(pickle.dumps(pack(items), pickle.HIGHEST_PROTOCOL))
    assert message[0] == "packed"
    expected = [row_to_item(item_to_row(i)) for i in items]
    got = unpack(message)
    assert [type(i) for i in got] == [type(i) for i in expected]
    for g, e in zip(got, expected, strict=True):
        assert g.__dict__ == e.__dict__ if not isinstance(e, ControlMessage) else g == e
    assert got[0].headers == {"__debezium.newkey": b'{"id":1}'} and got[1].key_bytes is None
    assert got[2].commit_us == 1_700_000_000_123_456


def test_a_cut_packed_batch_is_an_error_not_a_short_read():
    from tidegate.shipped import pack, unpack

    rnd = random.Random(14)
    s, end = stream([[(B.WRITE_ROWS_EVENT_V2, [image(rnd), image(rnd)])]])
    _, blob, metas, others = pack(read(s, end, True))
    for cut in (1, 5, 7, len(blob) - 1):
        with pytest.raises(ValueError, match="ends inside a record"):
            unpack(("packed", blob[:cut], metas, others))
    with pytest.raises(ValueError, match="unknown kind 7"):
        unpack(("packed", b"\x07" + blob[1:], metas, others))
