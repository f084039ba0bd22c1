"""The compiled path of snapshot chunk rows (``rowcodec.TextRowPlan``; sources/snapshot_rows.py)
against its Python twin. MySQL: row packets of the text protocol, generated from seeds with the
values the protocol carries for every covered column kind (edge values included), give the same
event bytes (value, message key, idempotency key) as pymysql's values of the same packet through
``snapshot.RowEvents``. PostgreSQL: rows of output texts, generated the same way, against the
values the chunk reader's converters make of them. A row the compiled path leaves to the Python
path comes out the same too. The real servers' rows: tests/integration/test_snapshot_sources.py.
"""

from __future__ import annotations

import random
import struct

import pytest
from _tidegate_fakes import pos
from pymysql.connections import MySQLResult
from pymysql.constants import FIELD_TYPE
from pymysql.converters import decoders
from tidegate import snapshot
from tidegate.native import rowcodec
from tidegate.shipped import ShippedEvent
from tidegate.snapshot import rows as snapshot_rows
from tidegate.sources.base import SnapshotTable
from tidegate.sources.mysql.snapshot import column_reader
from tidegate.sources.mysql.snapshot_rows import text_kind, text_rows
from tidegate.sources.postgres.snapshot import compiled_kind, row_decoder
from tidegate.sources.snapshot_rows import RawRows, compiled_plan
from tidegate.spec import load_spec_text
from tidegate.store.records import SnapshotRecord


@pytest.fixture(autouse=True)
def _compiled_path_built():
    if rowcodec is None:  # make install builds it; TIDEGATE_NATIVE=0 turns it off
        pytest.fail("tidegate.native.rowcodec is not loaded: these tests compare it with the Python path")


# (name, DATA_TYPE, pymysql field type, encoding) of the generated table; "id" and "c" are its key
COLUMNS = [("id", "bigint", FIELD_TYPE.LONGLONG, "ascii"), ("c", "varchar", FIELD_TYPE.VAR_STRING, "utf8"),
           ("y", "year", FIELD_TYPE.YEAR, "ascii"), ("d", "decimal", FIELD_TYPE.NEWDECIMAL, "ascii"),
           ("f", "double", FIELD_TYPE.DOUBLE, "ascii"), ("b", "blob", FIELD_TYPE.BLOB, None),
           ("dt", "date", FIELD_TYPE.DATE, "ascii"), ("t", "datetime", FIELD_TYPE.DATETIME, "ascii"),
           ("ts", "timestamp", FIELD_TYPE.TIMESTAMP, "ascii"), ("é\"x", "text", FIELD_TYPE.BLOB, "utf8")]


def lenenc(v: bytes | None) -> bytes:
    if v is None:
        return b"\xfb"
    n = len(v)
    if n < 251:
        return bytes([n]) + v
    if n < 1 << 16:
        return b"\xfc" + struct.pack("<H", n) + v
    return b"\xfd" + struct.pack("<I", n)[:3] + v


def value(rng: random.Random, data_type: str) -> bytes | None:
    """Text the server could send for a column of ``data_type`` (or NULL), edges included."""
    if rng.random() < 0.08:
        return None
    pick = rng.choice
    if data_type == "bigint":
        return pick([b"0", b"-9223372036854775808", b"18446744073709551615", b"0042",
                     str(rng.randint(-10**12, 10**12)).encode()])
    if data_type == "year":
        return pick([b"0000", b"1901", b"2155", b"2024"])
    if data_type == "decimal":
        return pick([b"0.00", b"-0.01", b"12.30", b"0012.30", b"0.000001", b"0.0000001", b"0.000000",
                     b"12345678901234567890.5", f"{rng.uniform(-1e6, 1e6):.4f}".encode()])
    if data_type == "double":
        return pick([b"0", b"-0", b"1e-5", b"1e16", b"1.7976931348623157e308", b"0.3333333333333333",
                     b"-2.5e-300", repr(rng.uniform(-1e9, 1e9)).encode()])
    if data_type == "blob":
        return rng.randbytes(pick([0, 3, 300, 70000]))
    if data_type in ("varchar", "text"):
        text = "".join(pick("ab \"\\'\n\t\x01\x1f\x7fé€😀中") for _ in range(rng.randint(0, 40)))
        return text.encode()
    date = pick(["0000-00-00", "2024-02-29", "2023-02-29", "0001-01-01", "9999-12-31", "2024-13-01",
                 f"{rng.randint(1, 9999):04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"])
    if data_type == "date":
        return date.encode()
    frac = pick(["", ".0", ".000", ".5", ".123", ".000000", ".000001", ".999999", ".120"])
    return f"{date} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}{frac}".encode()


def row_events(connector: str) -> snapshot.RowEvents:
    spec = load_spec_text("pipeline: p\ntenant: t\nsource: {kind: mysql, conn_id: c}\n"
                          "sinks: [{id: k, kind: kafka, conn_id: k, topic: t}]\n")
    table = SnapshotTable("shop", "shop", "orders", ("id", "c"))
    rec = SnapshotRecord("p", "s1", "start", pos(1), [table.to_json()],
                         [{"table": 0, "lo": None, "hi": None}], 1_700_000_000_123)
    return snapshot.RowEvents(spec, rec, table, 3, connector)


def chunk_events(packets: list[bytes], compiled: bool) -> list:
    build = row_events("mysql")
    result = MySQLResult.__new__(MySQLResult)
    result.unbuffered_active = False
    result.converters = [(enc, decoders.get(ft)) for _, _, ft, enc in COLUMNS]
    convs = [(i, conv) for i, (_, t, _, _) in enumerate(COLUMNS)
             for conv in [column_reader(t, t, False)[1]] if conv is not None]
    raw = text_rows(build, result, [(n, t) for n, t, _, _ in COLUMNS], convs)
    if compiled:
        build.raw = raw
        rows = iter(packets)
    else:
        rows = (raw.decode(p) for p in packets)
    return list(snapshot_rows._marked_rows(rows, build, final=True))


@pytest.mark.parametrize("seed", range(8))
def test_generated_text_rows_give_the_python_paths_bytes(seed):
    rng = random.Random(seed)
    packets = [b"".join(lenenc(str(i).encode() if name == "id" else value(rng, t))
                        for name, t, _, _ in COLUMNS) for i in range(1, 301)]
    python = chunk_events(packets, compiled=False)
    for ev in chunk_events(packets, compiled=True):
        plain = python.pop(0)
        assert (ev.value, ev.key_bytes, ev.idempotency_key) == \
            (plain.value, plain.key_bytes, plain.idempotency_key)
    assert not python


def test_both_paths_ran_on_the_generated_rows():
    rng = random.Random(0)
    packets = [b"".join(lenenc(str(i).encode() if name == "id" else value(rng, t))
                        for name, t, _, _ in COLUMNS) for i in range(1, 301)]
    events = chunk_events(packets, compiled=True)
    compiled = sum(type(e) is ShippedEvent for e in events)
    assert 0 < compiled < len(events)
    assert events[-1].snapshot == "last" and {e.snapshot for e in events[:-1]} == {"true"}


def test_column_kinds_of_the_compiled_path():
    assert text_kind("BIGINT", "ascii") == "int" and text_kind("varchar", "utf8") == "text"
    assert text_kind("varchar", None) == "binary" and text_kind("blob", "utf8") == "text"
    assert [text_kind(t, "ascii") for t in ("float", "bit", "set", "time", "json", "point")] == [None] * 6


def test_text_that_is_not_utf8_fails_as_in_the_python_path():
    """The server sends utf8mb4 to a snapshot's connection; bytes that are not UTF-8 anyway are
    pymysql's UnicodeDecodeError on both paths (the compiled one leaves the row to pymysql)."""
    packet = b"".join(lenenc(b"1" if name == "id" else b"\xff\xfe" if name == "c" else None)
                      for name, _, _, _ in COLUMNS)
    for compiled in (True, False):
        with pytest.raises(UnicodeDecodeError):
            chunk_events([packet], compiled)


# (name, type oid, type as format_type writes it) of a generated PostgreSQL table; key: id, c
PG_COLUMNS = [("id", 20, "bigint"), ("c", 1043, "character varying(20)"), ("i", 23, "integer"),
              ("o", 26, "oid"), ("n", 1700, "numeric(12,4)"), ("r", 700, "real"),
              ("d", 701, "double precision"),
              ("b", 16, "boolean"), ("dt", 1082, "date"), ("ts", 1114, "timestamp(6) without time zone"),
              ("tz", 1184, "timestamp(3) with time zone"), ("j", 3802, "jsonb"), ("u", 2950, "uuid")]


def pg_text(rng: random.Random, oid: int) -> str | None:
    """Output text PostgreSQL could give a column of type ``oid`` (or NULL), edges included."""
    if rng.random() < 0.08:
        return None
    pick = rng.choice
    if oid in (20, 23, 26):
        return pick(["0", "-9223372036854775808", "4294967295", str(rng.randint(-10**12, 10**12))])
    if oid == 1700:
        return pick(["NaN", "Infinity", "0.0000", "-0.0001", "0.0000001", "1e-9", "12.3400",
                     f"{rng.uniform(-1e6, 1e6):.4f}", "123456789012345678901234567890"])
    if oid in (700, 701):
        return pick(["0", "-0", "NaN", "Infinity", "-Infinity", "1e-05", "1e+16", "3.4028235e+38",
                     "0.33333334", repr(rng.uniform(-1e9, 1e9))])
    if oid == 16:
        return pick(["t", "f"])
    if oid in (1114, 1184):
        zone = pick(["+00", "+05:30", "-08", ""]) if oid == 1184 else ""
        frac = pick(["", ".5", ".123", ".999999"])
        day = f"{rng.randint(1, 9999):04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        time = f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
        return pick(["infinity", "-infinity", "0044-03-15 12:00:00 BC", f"{day} {time}{frac}{zone}"])
    return "".join(pick("ab \"\\'\n\t\x01\x1f\x7fé€😀中") for _ in range(rng.randint(0, 30)))


def pg_chunk_events(rows: list[tuple], compiled: bool) -> list:
    build = row_events("postgresql")
    columns = [(name, oid, typ, typ) for name, oid, typ in PG_COLUMNS]
    decode = row_decoder(columns)
    names = [c[0] for c in columns]
    plan = compiled_plan(build, names, [compiled_kind(oid, typ) for _, oid, typ in PG_COLUMNS])
    assert plan is not None
    if compiled:
        build.raw = RawRows(plan.values_event, decode)
    return list(snapshot_rows._marked_rows(iter(rows) if compiled else map(decode, rows), build, final=True))


@pytest.mark.parametrize("seed", range(8))
def test_generated_postgres_text_rows_give_the_python_paths_bytes(seed):
    rng = random.Random(seed)
    rows = [tuple(str(i) if name == "id" else pg_text(rng, oid) for name, oid, _ in PG_COLUMNS)
            for i in range(1, 301)]
    fast, python = pg_chunk_events(rows, compiled=True), pg_chunk_events(rows, compiled=False)
    assert [(e.value, e.key_bytes, e.idempotency_key) for e in fast] == \
        [(e.value, e.key_bytes, e.idempotency_key) for e in python]
    assert 0 < sum(type(e) is ShippedEvent for e in fast) < len(fast)
