"""With ``TYPES=edges``: the items table gets a column per type the source offers, and the workload
fills them with values at the edges of their types (the extremes, zero, the smallest fraction,
multi-byte and control characters, empty binaries, NULLs), so a value that does not survive a sink
shows in the oracle's comparison with the source's table.

The oracle's side (``envelope_row``) is written from docs/operations.md's tables, not from the code
under test: how the envelope writes each source type ("Delta Lake sink", the merged table's column
per source type, gives the same forms), with the documented losses (PostgreSQL's NaN and
infinities, and NUMERIC NaN, are null: wal2json writes them so, docs/compat.md "Values that
differ").
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

UTC = dt.UTC
PG_FRACTION = re.compile(r"(\.\d+)(?=$|[+-])")
Draw = Callable[[random.Random], object]


@dataclass(frozen=True)
class Column:
    name: str
    ddl: str
    draw: Draw  # a value at an edge of the type, or an ordinary one (None is drawn by the caller)


def _pick(*edges) -> Draw:
    """One of ``edges`` (a callable among them is drawn from)."""
    def draw(rng: random.Random):
        v = rng.choice(edges)
        return v(rng) if callable(v) else v
    return draw


def _text(alphabet: str, longest: int) -> Draw:
    return lambda rng: "".join(rng.choice(alphabet) for _ in range(rng.randint(1, longest)))


def _moment(lo: dt.datetime, hi: dt.datetime, micros: bool = True) -> Draw:
    span = int((hi - lo).total_seconds())

    def draw(rng: random.Random) -> dt.datetime:
        at = lo + dt.timedelta(seconds=rng.randrange(span))
        return at.replace(microsecond=rng.randrange(1_000_000)) if micros and rng.random() < 0.7 else at
    return draw


# Characters a text column's values are drawn from: ASCII, quotes and backslashes, JSON's escapes
# (control characters, U+2028), two- to four-byte UTF-8 (an emoji is a surrogate pair in JSON).
TEXT = "aZ09 '\"\\\t\n\r\x01\x1f\u00e4\u00df\u20ac\u2028\u4e2d\U0001F600/"
MAX_DOUBLE, MIN_DOUBLE = 1.7976931348623157e308, 5e-324
D65 = "9" * 35 + "." + "9" * 30  # DECIMAL(65,30)'s largest
MAX_REAL, MIN_REAL = 3.4028234663852886e38, 1.401298464324817e-45
LAST = dt.datetime(9999, 12, 31, 23, 59, 59, 999999)
BYTES = _pick(b"", b"\x00", b"\xff" * 16, lambda r: r.randbytes(r.randint(1, 16)))
N40 = "9" * 20 + "." + "9" * 20  # NUMERIC(40,20)'s largest

MYSQL = (
    Column("u", "BIGINT UNSIGNED NULL", _pick(0, 1, 2**63 - 1, 2**63, 2**64 - 1,
                                              lambda r: r.randrange(2**64), lambda r: r.randrange(1000))),
    Column("ti", "TINYINT NULL", _pick(-128, 127, 0, -1)),
    Column("f", "DOUBLE NULL", _pick(0.0, -0.0, 0.1, MIN_DOUBLE, 2.2250738585072014e-308, MAX_DOUBLE,
                                     -MAX_DOUBLE, 1e16, 1.0, -1.5, lambda r: r.uniform(-1e6, 1e6))),
    Column("d", "DECIMAL(65,30) NULL", _pick(D65, "-" + D65, "0", "0.000000000000000000000000000001", "-1.5",
                                             lambda r: f"{r.randrange(10**12)}.{r.randrange(10**9):09d}")),
    Column("ds", "DECIMAL(10,2) NULL", _pick("0.00", "-99999999.99", "99999999.99", "0.01", "12.50")),
    Column("dd", "DATE NULL", _pick(dt.date(1000, 1, 1), dt.date(9999, 12, 31), dt.date(2024, 2, 29))),
    Column("t", "DATETIME(6) NULL", _pick(dt.datetime(1000, 1, 1), LAST,
                                          _moment(dt.datetime(1990, 1, 1), dt.datetime(2040, 1, 1)))),
    Column("ts", "TIMESTAMP(6) NULL DEFAULT NULL",
           _pick(dt.datetime(1970, 1, 1, 0, 0, 1), dt.datetime(2038, 1, 19, 3, 14, 7, 999999),
                 _moment(dt.datetime(1990, 1, 1), dt.datetime(2037, 1, 1)))),
    # as text: the driver writes a negative timedelta wrongly (-0.5 s as '-1:59:59.500000')
    Column("tm", "TIME(6) NULL", _pick("-838:59:59", "838:59:59", "00:00:00", "-00:00:00.500000",
                                       "25:00:00.000001")),
    Column("y", "YEAR NULL", _pick(1901, 2155, 2026)),
    Column("b", "VARBINARY(16) NULL", BYTES),
    Column("bt", "BIT(7) NULL", _pick(0, 127, 1, 64)),
    Column("m", "VARCHAR(20) CHARACTER SET utf8mb4 NULL", _pick("", "\x00", _text(TEXT, 20))),
    Column("j", "JSON NULL", _pick('{"a": [1, 2.5, null], "b": "\\u00fc"}', "[]", '"x"', "1e400",
                                   '{"k": {"n": -0.0}}')),
    Column("e", "ENUM('a','b','c') NULL", _pick("a", "c")),
    Column("st", "SET('x','y','z') NULL", _pick("", "x,z", "x,y,z")),
)

POSTGRES = (
    Column("bi", "BIGINT NULL", _pick(-(2**63), 2**63 - 1, 0, lambda r: r.randrange(-(2**63), 2**63))),
    Column("sm", "SMALLINT NULL", _pick(-32768, 32767, 0)),
    Column("f", "DOUBLE PRECISION NULL", _pick(0.0, -0.0, 0.1, 1.0, MIN_DOUBLE, MAX_DOUBLE, -MAX_DOUBLE,
                                               float("nan"), float("inf"), float("-inf"),
                                               lambda r: r.uniform(-1e6, 1e6))),
    Column("r", "REAL NULL", _pick(0.0, 1.0, 0.5, MAX_REAL, MIN_REAL, float("nan"))),
    Column("d", "NUMERIC(40,20) NULL", _pick(N40, "-" + N40, "0", "0.00000000000000000001", "-1.5")),
    Column("n", "NUMERIC NULL", _pick("0", "1E-30", "123456789012345678901234567890.123456789", "-7",
                                      "NaN", "1000000")),
    Column("dd", "DATE NULL", _pick(dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.date(2024, 2, 29))),
    Column("t", "TIMESTAMP(6) NULL", _pick(dt.datetime(1, 1, 1), LAST,
                                           _moment(dt.datetime(1990, 1, 1), dt.datetime(2040, 1, 1)))),
    Column("tz", "TIMESTAMPTZ NULL",
           _pick(dt.datetime(1970, 1, 1, tzinfo=UTC),
                 dt.datetime(2026, 3, 29, 2, 30, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=45))),
                 dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.timezone(dt.timedelta(hours=1))),
                 lambda r: _moment(dt.datetime(1990, 1, 1), dt.datetime(2040, 1, 1))(r).replace(tzinfo=UTC))),
    Column("tm", "TIME NULL", _pick(dt.time(0), dt.time(23, 59, 59, 999999), dt.time(12, 0, 0, 1))),
    Column("b", "BYTEA NULL", BYTES),
    Column("m", "TEXT NULL", _pick("", _text(TEXT.replace("\x00", ""), 20))),
    Column("j", "JSONB NULL", _pick('{"a": [1, 2.5, null], "b": "\\u00fc"}', "[]", '"x"',
                                    '{"big": 123456789012345678901234567890}')),
    Column("bo", "BOOLEAN NULL", _pick(True, False)),
    Column("a", "INT[] NULL", _pick([], [1, None, -5], [-(2**31), 2**31 - 1])),
    Column("ta", "TEXT[] NULL", _pick([], ["a b", "\u00fc", None], ['"q"', "\\"])),
    Column("uu", "UUID NULL", _pick("00000000-0000-0000-0000-000000000000",
                                    "ffffffff-ffff-ffff-ffff-ffffffffffff",
                                    lambda r: str(__import__("uuid").UUID(int=r.getrandbits(128))))),
)

COLUMNS = {"mysql": MYSQL, "postgres": POSTGRES}
# The pairs table's text key column (with the id, a composite key): the empty string, quotes,
# a backslash, spaces at either end (MariaDB's PAD SPACE collation compares 'a' and 'a ' equal),
# case (its collation ignores it), two- to four-byte UTF-8, a JSON escape; through the message
# keys, the idempotency keys and the snapshot's chunk bounds.
EDGE_KEYS = ("", "a", "A", "a ", " a", "a'b", '"', "\\", "\u00e4", "\u00df", "\u4e2d\u6587",
             "\U0001F600", "\t", "\u2028", "%_", "r1")


def draw_row(rng: random.Random, kind: str) -> dict:
    """A value (NULL one time in eight) for every typed column."""
    return {c.name: None if rng.random() < 0.125 else c.draw(rng) for c in COLUMNS[kind]}


def draw_change(rng: random.Random, kind: str) -> tuple[str, object]:
    """One typed column and a new value for it (an UPDATE's ``SET``)."""
    c = rng.choice(COLUMNS[kind])
    return c.name, None if rng.random() < 0.125 else c.draw(rng)


# --------------------------------------------------------------------------- the oracle's side


def _iso_time(v: dt.timedelta) -> str:
    """A MariaDB TIME (the driver's timedelta) as ``[-]HH:MM:SS[.ffffff]``."""
    sign = "-" if v < dt.timedelta(0) else ""
    micros = abs(v) // dt.timedelta(microseconds=1)
    secs, us = divmod(micros, 1_000_000)
    text = f"{sign}{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}"
    return text + (f".{us:06d}" if us else "")


def envelope_value(kind: str, v):
    """The value the envelope carries for a source value ``v`` as the driver read it."""
    if v is None or isinstance(v, bool | int | str | list):
        return v
    if isinstance(v, float):
        return None if v != v or v in (float("inf"), float("-inf")) else v  # PostgreSQL: null
    if isinstance(v, decimal.Decimal):
        return None if v.is_nan() else format(v, "f")  # the exact text, never an exponent
    if isinstance(v, dt.datetime | dt.time):
        text = (v.astimezone(UTC) if getattr(v, "tzinfo", None) else v).isoformat()
        # PostgreSQL's text, which the envelope keeps, drops a fraction's trailing zeros
        return PG_FRACTION.sub(lambda m: m[1].rstrip("0").rstrip("."), text) if kind == "postgres" else text
    if isinstance(v, dt.date):
        return v.isoformat()
    if isinstance(v, dt.timedelta):
        return _iso_time(v)
    if isinstance(v, bytes | memoryview):
        return base64.b64encode(bytes(v)).decode()
    if isinstance(v, set):  # a MariaDB SET: its members as a list in the definition's order (x, y, z)
        return sorted(v)
    raise TypeError(f"no envelope form for {type(v).__name__} {v!r}")


def envelope_row(kind: str, row: dict) -> dict:
    names = {c.name for c in COLUMNS[kind]}
    out = {c: envelope_value(kind, x) if c in names else x for c, x in row.items()}
    if kind == "mysql":
        if out.get("bt") is not None:  # BIT(7): seven 0/1 digits
            out["bt"] = format(int.from_bytes(base64.b64decode(out["bt"]), "big"), "07b")
        if isinstance(out.get("st"), str):  # the driver may read a SET as its text
            out["st"] = out["st"].split(",") if out["st"] else []
        if "ts" in row and row["ts"] is not None:  # read in the session's UTC: ISO-8601 with +00:00
            out["ts"] = row["ts"].replace(tzinfo=UTC).isoformat()
    return out


def typed_names(kind: str) -> tuple[str, ...]:
    return tuple(c.name for c in COLUMNS[kind])
