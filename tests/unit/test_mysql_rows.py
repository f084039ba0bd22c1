"""Row plans of the fast binlog decoder on synthetic bytes: the packed formats (DECIMAL, TIME,
DATETIME, TIMESTAMP) round-trip against encoders written from the server's format, MySQL's
binary JSON matches python-mysql-replication's reading, and a MySQL 8 style stream (GTID
events, v2 row events, binary JSON) goes through the reader.

MariaDB (v1 row events, text JSON) is covered against a real server in
tests/integration/test_mysql_decoder.py; no MySQL 8 server runs here, hence these.
"""

from __future__ import annotations

import datetime as dt
import random
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tidegate.errors import SourceError, SourceSettingError
from tidegate.events import ChangeEvent, PositionMark
from tidegate.sources.mysql import binlog_client as B
from tidegate.sources.mysql import row_plans as R
from tidegate.sources.mysql.decoder import BinlogDecoder
from tidegate.sources.mysql.position import BinlogPosition, GtidSet
from tidegate.sources.mysql.transactions import GtidState as _GtidState
from tidegate.sources.mysql.values import library_json_text as _json_text
from tidegate.spec import PipelineSpec, SourceSpec

# --------------------------------------------------------------------------- encoders

_BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


def pack_decimal(text: str, precision: int, scale: int) -> bytes:
    """DECIMAL(precision, scale) in the binlog's packed form (as the server writes it)."""
    neg = text.startswith("-")
    ip, _, fp = text.lstrip("-").partition(".")
    ip = ip.lstrip("0").rjust(precision - scale, "0")
    fp = fp.ljust(scale, "0")
    out = b""
    left = len(ip) % 9
    if left:
        out += int(ip[:left]).to_bytes(_BYTES[left], "big")
    for k in range(left, len(ip), 9):
        out += int(ip[k:k + 9]).to_bytes(4, "big")
    for k in range(0, scale - scale % 9, 9):
        out += int(fp[k:k + 9]).to_bytes(4, "big")
    if scale % 9:
        out += int(fp[scale - scale % 9:]).to_bytes(_BYTES[scale % 9], "big")
    b = bytearray(out)
    b[0] ^= 0x80
    if neg:
        b = bytearray(x ^ 0xFF for x in b)
    return bytes(b)


def pack_time2(neg: bool, h: int, m: int, s: int, us: int, fsp: int) -> bytes:
    """MySQL's my_time_packed_to_binary (C semantics: arithmetic >>, truncating %)."""
    us = us - us % (10 ** (6 - fsp)) if fsp else 0
    nr = ((h << 12 | m << 6 | s) << 24) + us
    nr = -nr if neg else nr
    intpart = nr >> 24
    frac = int(abs(nr) % (1 << 24)) * (-1 if nr < 0 else 1)
    if fsp == 0:
        return (intpart + 0x800000).to_bytes(3, "big")
    if fsp <= 2:
        return (intpart + 0x800000).to_bytes(3, "big") + bytes([(frac // 10000 if frac >= 0 else
                                                                  -((-frac) // 10000)) & 0xFF])
    if fsp <= 4:
        return (intpart + 0x800000).to_bytes(3, "big") + \
            ((frac // 100 if frac >= 0 else -((-frac) // 100)) & 0xFFFF).to_bytes(2, "big")
    return (nr + 0x800000000000).to_bytes(6, "big")


def pack_frac(us: int, fsp: int) -> bytes:
    if not fsp:
        return b""
    if fsp <= 2:
        return bytes([us // 10000])
    if fsp <= 4:
        return (us // 100).to_bytes(2, "big")
    return us.to_bytes(3, "big")


def pack_datetime2(v: dt.datetime, fsp: int) -> bytes:
    ym = v.year * 13 + v.month
    x = (1 << 39) | ym << 22 | v.day << 17 | v.hour << 12 | v.minute << 6 | v.second
    return x.to_bytes(5, "big") + pack_frac(v.microsecond, fsp)


def plan_for(columns, pk=(0,), codec=lambda c: "utf-8"):
    return R.build_plan(R.TableMap(7, "db", "t", columns, list(pk)), codec)


def decode_one(columns, payload: bytes):
    plan = plan_for(columns)
    n = len(columns)
    row, o = plan.decode(bytes((n + 7) // 8) + payload, 0)
    assert o == (n + 7) // 8 + len(payload)
    return row


# --------------------------------------------------------------------------- packed formats


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_decimal_is_the_servers_text(data):
    """Every digit, every place of the scale, no exponent (``0.0000001000``, ``0.000``)."""
    precision = data.draw(st.integers(1, 65))
    scale = data.draw(st.integers(0, min(30, precision)))
    ip = data.draw(st.integers(0, 10 ** (precision - scale) - 1)) if precision > scale else 0
    fp = data.draw(st.integers(0, 10 ** scale - 1)) if scale else 0
    neg = data.draw(st.booleans()) and (ip or fp)
    text = ("-" if neg else "") + str(ip) + (f".{fp:0{scale}d}" if scale else "")
    col = R.Column(0, R.NEWDECIMAL, True, "v", precision=precision, decimals=scale)
    assert decode_one([col], pack_decimal(text, precision, scale)) == {"v": text}


@settings(max_examples=150, deadline=None)
@given(st.booleans(), st.integers(0, 838), st.integers(0, 59), st.integers(0, 59),
       st.integers(0, 999_999), st.integers(0, 6))
def test_time2_every_precision_and_sign(neg, h, m, s, us, fsp):
    us = us - us % (10 ** (6 - fsp)) if fsp else 0
    neg = neg and (h or m or s or us)
    col = R.Column(0, R.TIME2, True, "v", decimals=fsp)
    expected = f"{'-' if neg else ''}{h:02d}:{m:02d}:{s:02d}" + (f".{us:06d}" if us else "")
    assert decode_one([col], pack_time2(bool(neg), h, m, s, us, fsp)) == {"v": expected}


@settings(max_examples=100, deadline=None)
@given(st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31, 23, 59, 59)),
       st.integers(0, 6))
def test_datetime2_and_timestamp2(v, fsp):
    v = v.replace(microsecond=v.microsecond - v.microsecond % (10 ** (6 - fsp)) if fsp else 0)
    col = R.Column(0, R.DATETIME2, True, "v", decimals=fsp)
    assert decode_one([col], pack_datetime2(v, fsp)) == {"v": v.isoformat()}
    if dt.datetime(1970, 1, 1, 0, 0, 1) <= v <= dt.datetime(2038, 1, 19, 3, 14, 7):
        secs = int((v - dt.datetime(1970, 1, 1)).total_seconds())
        ts = R.Column(0, R.TIMESTAMP2, True, "v", decimals=fsp)
        got = decode_one([ts], secs.to_bytes(4, "big") + pack_frac(v.microsecond, fsp))
        assert got == {"v": v.replace(tzinfo=dt.UTC).isoformat()}


def test_zero_and_impossible_dates_are_null():
    d = R.Column(0, R.DATE, True, "d")
    assert decode_one([d], b"\x00\x00\x00") == {"d": None}
    assert decode_one([d], ((2024 << 9) | (2 << 5) | 30).to_bytes(3, "little")) == {"d": None}
    assert decode_one([d], ((2024 << 9) | (2 << 5) | 29).to_bytes(3, "little")) == {"d": "2024-02-29"}
    assert decode_one([R.Column(0, R.DATETIME2, True, "v")], (1 << 39).to_bytes(5, "big")) == {"v": None}
    assert decode_one([R.Column(0, R.TIMESTAMP2, True, "v", decimals=3)], bytes(6)) == {"v": None}
    assert decode_one([R.Column(0, R.YEAR, True, "y")], b"\x00") == {"y": None}


def test_nulls_integers_strings_sets_bits():
    cols = [R.Column(0, R.LONGLONG, False, "id", unsigned=True), R.Column(1, R.TINY, True, "t"),
            R.Column(2, R.INT24, True, "m"), R.Column(3, R.VARCHAR, True, "s", length=300, collation=45),
            R.Column(4, R.STRING, True, "bn", length=4, collation=63),
            R.Column(5, R.SET, True, "set", length=1, enum_set_raw=[b"b", b"a", b"c"]),
            R.Column(6, R.ENUM, True, "e", length=1, enum_set_raw=[b"x", b"y"]),
            R.Column(7, R.BIT, True, "bits", bits=10), R.Column(8, R.FLOAT, True, "f"),
            R.Column(9, R.BLOB, True, "blob", length=2, collation=63)]
    codec = {45: "utf-8", 63: None}.get
    plan = R.build_plan(R.TableMap(7, "db", "t", cols, [0]), codec)
    assert plan.pk == ("id",) and plan.full_bitmap == b"\xff\x03"
    payload = (b"\x00\x00" + (2**64 - 1).to_bytes(8, "little") + b"\xff"
               + (-5).to_bytes(3, "little", signed=True) + (3).to_bytes(2, "little") + "é!".encode()
               + b"\x01\x07" + b"\x05" + b"\x02"
               + (0b1010101010).to_bytes(2, "big") + struct.pack("<f", 3.14) + b"\x02\x00\xde\xad")
    row, o = plan.decode(payload, 0)
    assert o == len(payload)
    assert row == {"id": 2**64 - 1, "t": -1, "m": -5, "s": "é!", "bn": "BwAAAA==", "set": ["b", "c"],
                   "e": "y", "bits": "1010101010", "f": 3.14, "blob": "3q0="}
    nulls, o = plan.decode(b"\xfe\x03" + (1).to_bytes(8, "little"), 0)
    assert nulls == {"id": 1, **{c.name: None for c in cols[1:]}}
    assert plan.float_flag == [False]
    plan.decode(b"\xfe\x02" + (1).to_bytes(8, "little") + struct.pack("<f", 1e-7), 0)
    assert plan.float_flag == [True]  # a float orjson would write differently from the stdlib


def test_missing_names_and_unsupported_types_are_reported_on_the_plan():
    plan = plan_for([R.Column(0, R.LONG, False, "id"), R.Column(1, R.LONG, True, None)])
    assert plan.missing_name == 1 and plan.decode is None
    plan = plan_for([R.Column(0, R.LONG, False, "id"), R.Column(1, R.DECIMAL, True, "old")])
    assert plan.decode is None and "'old'" in plan.error and "type 0" in plan.error


# --------------------------------------------------------------------------- MySQL binary JSON


def jb(v) -> tuple[int, bytes]:
    """(type, bytes) of a value in MySQL's binary JSON (small containers)."""
    if v is None or v is True or v is False:
        return 0x4, bytes([{None: 0, True: 1, False: 2}[v]])
    if isinstance(v, int):
        return (0x5, struct.pack("<h", v)) if -32768 <= v < 32768 else (0x9, struct.pack("<q", v))
    if isinstance(v, float):
        return 0xB, struct.pack("<d", v)
    if isinstance(v, str):
        raw = v.encode()
        assert len(raw) < 128
        return 0xC, bytes([len(raw)]) + raw
    is_obj = isinstance(v, dict)
    items = list(v.items()) if is_obj else [(None, x) for x in v]
    n = len(items)
    header = 4 + n * (4 if is_obj else 0) + n * 3
    keys = b""
    key_entries = b""
    offset = header
    if is_obj:
        for k, _ in items:
            kb = k.encode()
            key_entries += struct.pack("<HH", offset + len(keys), len(kb))
            keys += kb
        offset += len(keys)
    value_entries, payload = b"", b""
    for _, x in items:
        t, data = jb(x)
        if t in (0x4, 0x5):
            value_entries += bytes([t]) + data.ljust(2, b"\x00")
        else:
            value_entries += bytes([t]) + struct.pack("<H", offset + len(payload))
            payload += data
    body = key_entries + value_entries + keys + payload
    total = 4 + len(body)
    return (0x0 if is_obj else 0x2), struct.pack("<HH", n, total) + body


@pytest.mark.parametrize("doc", [
    {"k": [1, 2.5, "x"], "n": None, "ü": True},
    [], {}, [None, False, -7, 100000, 1e-7, "quote\"and\\slash"], "just text", 42,
])
def test_binary_json_reads_as_the_library_reads_it(doc):
    from pymysqlreplication.json_binary import parse_json

    t, data = jb(doc)
    raw = bytes([t]) + data
    if isinstance(doc, str):  # the library drops the quotes of a top-level string: not JSON
        assert R.mysql_json_text(raw) == '"just text"' and _json_text(parse_json(raw[0], raw[1:])) == doc
    else:
        assert R.mysql_json_text(raw) == _json_text(parse_json(raw[0], raw[1:]))


# --------------------------------------------------------------------------- a MySQL 8 stream

UUID = "3e11fa47-71ca-11e1-9e33-c80aa9429562"


class StubSource:
    """What the reader asks of MySqlSource (positions, schema-change recording)."""

    def __init__(self, tables=()):
        self.spec = PipelineSpec(pipeline="p", tenant="acme", sinks=(),
                                 source=SourceSpec(kind="mysql", conn_id="x", tables=tuple(tables)))
        self.tables = frozenset(tuple(t.split(".", 1)) for t in tables)
        self.dbs = frozenset(d for d, _ in self.tables)
        self.is_mariadb = False
        self.conn = "stub"
        self.changes = []

    def position(self, file, pos, gtid_set):
        return BinlogPosition(file, int(pos), gtid_set=gtid_set, server_id=1, server_uuid=UUID)

    def record_schema_change(self, change):
        self.changes.append(change)
        return []


class Stream:
    """Events as BinlogStream yields them, with real headers, positions and checksums."""

    def __init__(self):
        self.events, self.pos = [], 4

    def add(self, etype, body: bytes, artificial=False):
        size = 19 + len(body) + 4
        log_pos = 0 if artificial else self.pos + size
        header = struct.pack("<IBIIIH", 1_700_000_000, etype, 1, size, log_pos, 0)
        event = header + body
        pkt = b"\x00" + event + struct.pack("<I", zlib.crc32(event))
        self.events.append((etype, 1_700_000_000, 1, log_pos, size, pkt, len(pkt) - 4))
        if not artificial:
            self.pos += size
        return self.pos

    def __iter__(self):
        return iter(self.events)


def table_map_body(tid, schema, table, cols_types, meta, nullable, optional):
    body = tid.to_bytes(6, "little") + b"\x01\x00"
    body += bytes([len(schema)]) + schema.encode() + b"\x00" + bytes([len(table)]) + table.encode() + b"\x00"
    body += bytes([len(cols_types)]) + bytes(cols_types) + bytes([len(meta)]) + meta
    body += bytes([nullable])
    for kind, data in optional:
        body += bytes([kind, len(data)]) + data
    return body


def names(*ns):
    return b"".join(bytes([len(n)]) + n.encode() for n in ns)


def test_a_mysql8_stream_with_v2_rows_gtids_and_binary_json():
    s = Stream()
    s.add(B.ROTATE_EVENT, struct.pack("<Q", 4) + b"binlog.000001", artificial=True)
    fde = struct.pack("<H", 4) + b"8.0.36".ljust(50, b"\x00") + struct.pack("<I", 0) + b"\x13"
    lengths = bytearray(40)
    lengths[B.TABLE_MAP_EVENT - 1], lengths[B.QUERY_EVENT - 1] = 8, 13
    for t in (B.WRITE_ROWS_EVENT_V2, B.UPDATE_ROWS_EVENT_V2, B.DELETE_ROWS_EVENT_V2):
        lengths[t - 1] = 10
    s.add(B.FORMAT_DESCRIPTION_EVENT, fde + bytes(lengths) + b"\x01")
    # table db.t (id BIGINT UNSIGNED PRIMARY KEY, doc JSON, name VARCHAR(20))
    tm = table_map_body(
        42, "db", "t", [R.LONGLONG, R.JSON, R.VARCHAR], bytes([4]) + struct.pack("<H", 80),
        0b110, [(R.SIGNEDNESS, b"\x80"), (R.DEFAULT_CHARSET, bytes([252, 255, 0])),
                (R.COLUMN_NAME, names("id", "doc", "name")), (R.SIMPLE_PRIMARY_KEY, b"\x00")])
    sid = bytes.fromhex(UUID.replace("-", ""))
    gtid_at = s.pos
    s.add(B.GTID_LOG_EVENT, b"\x00" + sid + struct.pack("<Q", 5) + b"\x02" + bytes(16))
    s.add(B.QUERY_EVENT, bytes(8) + b"\x02" + bytes(2) + b"\x00\x00" + b"db\x00" + b"BEGIN")
    s.add(B.TABLE_MAP_EVENT, tm)
    t, doc = jb({"a": [1, "x"]})
    jdoc = bytes([t]) + doc
    row1 = b"\x04" + (2**64 - 2).to_bytes(8, "little") + struct.pack("<I", len(jdoc)) + jdoc
    row2 = b"\x02" + (7).to_bytes(8, "little") + b"\x03bob"  # a NULL column has no bytes
    write_pos = s.pos
    s.add(B.WRITE_ROWS_EVENT_V2, (42).to_bytes(6, "little") + b"\x00\x00" + b"\x02\x00" + b"\x03\x07"
          + row1 + row2)
    s.add(B.TABLE_MAP_EVENT, tm)
    s.add(B.UPDATE_ROWS_EVENT_V2, (42).to_bytes(6, "little") + b"\x01\x00" + b"\x02\x00" + b"\x03\x07\x07"
          + row2 + b"\x02" + (7).to_bytes(8, "little") + b"\x03amy")
    end = s.add(B.XID_EVENT, struct.pack("<Q", 99))
    upto = BinlogPosition("binlog.000001", end)
    src = StubSource(["db.t"])
    seed = GtidSet.parse(f"{UUID}:1-4")  # the executed set at the start
    reader = BinlogDecoder(src, s, BinlogPosition("binlog.000001", 4), upto, _GtidState(seed, "mysql"),
                        codec_for=lambda c: "utf-8")
    items = list(reader.run())
    assert [type(i) for i in items] == [ChangeEvent] * 3
    c1, c2, u = items
    assert c1.tx_id == f"{UUID}:5" and c1.event_id == f"binlog.000001:{write_pos}:0"
    assert c1.after == {"id": 2**64 - 2, "doc": '{"a":[1,"x"]}', "name": None} and c1.key == {"id": 2**64 - 2}
    assert c2.after == {"id": 7, "doc": None, "name": "bob"}
    assert (u.op, u.before["name"], u.after["name"], u.tx_end) == ("u", "bob", "amy", True)
    assert u.end_position == upto and str(u.end_position.gtid_set) == f"{UUID}:1-5"
    assert c1.position == {"file": "binlog.000001", "pos": write_pos, "row": 0, "gtid": f"{UUID}:5"}
    assert gtid_at < write_pos

    # a read whose filter excludes the table yields only the final mark
    other = BinlogDecoder(StubSource(["db.other"]), s, BinlogPosition("binlog.000001", 4), upto,
                       _GtidState(None, "mysql"), codec_for=lambda c: "utf-8")
    assert [type(i) for i in other.run()] == [PositionMark]


@pytest.mark.parametrize("etype,setting", [(B.PARTIAL_UPDATE_ROWS_EVENT, "binlog_row_value_options"),
                                           (B.MARIADB_WRITE_ROWS_COMPRESSED_EVENT_V1, "log_bin_compress")])
def test_events_the_library_would_drop_are_refused(etype, setting):
    s = Stream()
    s.add(B.ROTATE_EVENT, struct.pack("<Q", 4) + b"binlog.000001", artificial=True)
    s.add(etype, bytes(12))
    reader = BinlogDecoder(StubSource(), s, BinlogPosition("binlog.000001", 4),
                        BinlogPosition("binlog.000001", s.pos), _GtidState(None, "mysql"),
                        codec_for=lambda c: "utf-8")
    with pytest.raises(SourceSettingError, match=setting):
        list(reader.run())


def test_random_rows_of_many_types_decode_without_leftover_bytes():
    rnd = random.Random(7)
    cols = [R.Column(0, R.LONG, False, "id"), R.Column(1, R.NEWDECIMAL, True, "d", precision=18, decimals=4),
            R.Column(2, R.TIME2, True, "t", decimals=3), R.Column(3, R.DOUBLE, True, "x")]
    plan = plan_for(cols)
    for k in range(200):
        text = f"{rnd.randint(-10**13, 10**13)}.{rnd.randint(0, 9999):04d}"
        payload = (b"\x00" + struct.pack("<i", k) + pack_decimal(text, 18, 4)
                   + pack_time2(k % 2 == 1, k % 839, k % 60, (k * 7) % 60, 123000, 3)
                   + struct.pack("<d", k / 3))
        row, o = plan.decode(payload, 0)
        assert o == len(payload) and row["d"] == text and row["x"] == k / 3


def test_refused_events_beyond_the_bound_or_of_other_tables_pass():
    s = Stream()
    s.add(B.ROTATE_EVENT, struct.pack("<Q", 4) + b"binlog.000001", artificial=True)
    tm = table_map_body(9, "db", "other", [R.LONG], b"", 0, [(R.COLUMN_NAME, names("id"))])
    s.add(B.TABLE_MAP_EVENT, tm)
    s.add(B.PARTIAL_UPDATE_ROWS_EVENT, (9).to_bytes(6, "little") + bytes(6))  # not captured
    upto = BinlogPosition("binlog.000001", s.pos)
    s.add(B.MARIADB_QUERY_COMPRESSED_EVENT, bytes(20))  # after the bound
    reader = BinlogDecoder(StubSource(["db.t"]), s, BinlogPosition("binlog.000001", 4), upto,
                        _GtidState(None, "mysql"), codec_for=lambda c: "utf-8")
    assert [type(i) for i in reader.run()] == [PositionMark]


class _Connection:
    """What BinlogStream reads from an opened connection: its buffered socket file (``rfile``,
    or the bytes ``data``)."""

    def __init__(self, data: bytes = b"", rfile=None):
        import io

        self._rfile = rfile if rfile is not None else io.BytesIO(data)


def _framed(payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "little") + b"\x00" + payload


def _query_event_packet(i: int, body: bytes) -> bytes:
    """The payload of a stream's ``i``-th packet: a query event of ``body`` with its CRC32."""
    event = struct.pack("<IBIIIH", 1_700_000_000, B.QUERY_EVENT, 1, 19 + len(body) + 4, 100 + i, 0) + body
    return b"\x00" + event + struct.pack("<I", zlib.crc32(event))


@given(st.lists(st.binary(max_size=300), min_size=1, max_size=6), st.data())
@settings(max_examples=60, deadline=None)
def test_the_stream_checks_every_event_against_its_crc32(bodies, data):
    """Events with their CRC32 pass unchanged; one byte changed anywhere in one of them (its
    header, body or checksum) fails the read naming the CRC32 check."""
    packets = [_query_event_packet(i, body) for i, body in enumerate(bodies)]
    eof = b"\xfe\x00\x00\x00\x00"
    stream = B.BinlogStream({}, 1, "mysql-bin.000001", 4)
    stream.checksum, stream._conn = True, _Connection(b"".join(map(_framed, packets)) + _framed(eof))
    assert [(pkt, end) for *_, pkt, end in stream] == [(p, len(p) - 4) for p in packets]

    bad = data.draw(st.integers(0, len(packets) - 1))
    at = data.draw(st.integers(1, len(packets[bad]) - 1))
    flip = data.draw(st.integers(1, 255))
    changed = bytearray(packets[bad])
    changed[at] ^= flip
    packets[bad] = bytes(changed)
    stream = B.BinlogStream({}, 1, "mysql-bin.000001", 4)
    stream.checksum, stream._conn = True, _Connection(b"".join(map(_framed, packets)) + _framed(eof))
    # the header's event size is checked first: a size that no longer matches fails as such
    why = "malformed binlog event" if at in range(10, 14) else "failed its CRC32 check"
    with pytest.raises(SourceError, match=why):
        list(stream)


class _Stalled:
    """A socket file whose read times out after ``data``, as a stream's socket does."""

    def __init__(self, data: bytes):
        import io

        self._data = io.BytesIO(data)

    def read(self, n: int) -> bytes:
        got = self._data.read(n)
        if len(got) < n:
            raise TimeoutError("timed out")
        return got


@given(st.lists(st.binary(max_size=200), min_size=1, max_size=4), st.data())
@settings(max_examples=40, deadline=None)
def test_a_stream_cut_anywhere_fails_as_a_lost_connection_and_a_stall_names_its_timeout(bodies, data):
    """The packets before the cut are read; a stream cut inside a packet's header or payload
    fails as the connection lost (the read's retry takes it up), a socket timeout names the
    read timeout's setting."""
    import pymysql

    packets = [_framed(_query_event_packet(i, body)) for i, body in enumerate(bodies)]
    whole = b"".join(packets)
    cut = data.draw(st.integers(0, len(whole) - 1))
    whole_packets = sum(1 for k in range(len(packets)) if len(b"".join(packets[:k + 1])) <= cut)
    for conn, error, why in ((_Connection(whole[:cut]), pymysql.err.OperationalError, "Lost connection"),
                             (_Connection(rfile=_Stalled(whole[:cut])), SourceError, B.READ_TIMEOUT_ENV)):
        stream = B.BinlogStream({}, 1, "mysql-bin.000001", 4, read_timeout=2.5)
        stream.checksum, stream._conn = True, conn
        read = []
        with pytest.raises(error, match=why):
            for item in stream:
                read.append(item)
        assert len(read) == whole_packets


_UUIDS = ("3E11FA47-71CA-11E1-9E33-C80AA9429562", "b6c5a1e2-0000-4000-8000-000000000001",
          "0a0a0a0a-1111-4222-8333-444444444444")


@given(st.one_of(st.none(), st.dictionaries(st.sampled_from(_UUIDS),
                                            st.lists(st.tuples(st.integers(1, 60), st.integers(0, 5)),
                                                     min_size=1, max_size=4), max_size=3)),
       st.lists(st.tuples(st.sampled_from(_UUIDS), st.one_of(st.just(0), st.integers(-3, 40))),
                max_size=40))
@settings(max_examples=150, deadline=None)
def test_the_mysql_gtid_state_is_the_parse_of_every_transaction_added(seed, added):
    """After every transaction's GTID (mostly each server's next number, some repeated, some
    out of order, UUIDs in either case), the state is the set parsed from the seed's text and
    every GTID so far; sets handed out before are not changed by later ones. Without a seed (or
    an empty one) the executed set is unknown: None throughout."""
    seed_text = None if seed is None else ",".join(
        f"{u}:" + ":".join(f"{lo}-{lo + w}" for lo, w in iv) for u, iv in seed.items())
    state = _GtidState(GtidSet.parse(seed_text), "mysql")
    texts = [seed_text] if seed_text else []
    handed = []
    nxt = {u.lower(): 61 for u in _UUIDS}
    for uuid, step in added:
        k = nxt[uuid.lower()] if step == 0 else max(1, nxt[uuid.lower()] + step)
        nxt[uuid.lower()] = max(nxt[uuid.lower()], k + 1)
        state.add_mysql(f"{uuid}:{k}")
        texts.append(f"{uuid}:{k}")
        got = state.current()
        assert got == (GtidSet.parse(",".join(texts)) if seed_text else None)
        handed.append((got, str(got)))
    assert all(str(g) == text for g, text in handed)
