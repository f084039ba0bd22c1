"""MySQL/MariaDB column values: from the binlog's stored forms to JSON-native values.

Shared by both log readers. The fast reader's generated row code (``row_plans.py``) calls the
helpers here for the packed forms (DECIMAL, TIME2, DATE, DATETIME2, TIMESTAMP2, the pre-5.6
temporal types, BIT, MySQL binary JSON) and for character sets; the library reader
(``tests/reference_decoders/mysql_library.py``) uses the fixes at the end of this module on
the values python-mysql-replication decodes. What each type becomes is the contract of the package
(``sources/mysql/__init__.py``, "Values").

Where python-mysql-replication (the ``library`` decoder) is wrong, the fast decoder is right
and so differs; every such case is rare or impossible with the default settings:

* zero values: YEAR ``0000`` and the zero TIMESTAMP are null (the library gives 1900 and
  1970-01-01T00:00:00+00:00); impossible dates stored with ``ALLOW_INVALID_DATES`` are null
  (the library fails);
* BINARY(n) holding only zero bytes is n zero bytes (the binlog strips trailing zeros and the
  library then gives ``""`` instead of padding);
* character sets: ucs2/utf16/utf32 text is decoded as the big-endian encodings MySQL uses
  (the library gives base64, garbled text or fails); bytes that cp1252 leaves undefined in a latin1
  column map to the same code points, as in MySQL (the library fails); ENUM/SET values are
  decoded with the column's character set (the library drops non-UTF-8 values);
* names of 128 bytes or more and metadata lengths are read as length-encoded integers, as the
  server writes them;
* a primary key with a prefix part (``PRIMARY KEY (name(10))``) still gives the event a
  ``key`` (the library gives none);
* MySQL binary JSON with opaque values (DECIMAL, dates) is rendered (the library fails), and
  a document that is a single string keeps its quotes (the library drops them).
"""

from __future__ import annotations

import binascii
import codecs
import datetime as dt
import json
import struct
from collections.abc import Callable
from typing import Any

from ...errors import SourceError

# column types (the server's enum_field_types)
DECIMAL, TINY, SHORT, LONG, FLOAT, DOUBLE, NULL, TIMESTAMP, LONGLONG, INT24 = range(10)
DATE, TIME, DATETIME, YEAR, NEWDATE, VARCHAR, BIT, TIMESTAMP2, DATETIME2, TIME2 = range(10, 20)
JSON, NEWDECIMAL, ENUM, SET = 245, 246, 247, 248
TINY_BLOB, MEDIUM_BLOB, LONG_BLOB, BLOB, VAR_STRING, STRING, GEOMETRY = range(249, 256)

NUMERIC_TYPES = frozenset({TINY, SHORT, INT24, LONG, LONGLONG, NEWDECIMAL, FLOAT, DOUBLE, YEAR})
BINARY_COLLATION = 63

# MySQL character set names whose Python codec has another name or byte order
_CODEC_BY_CHARSET = {
    "utf8mb4": "utf-8", "utf8mb3": "utf-8", "utf8": "utf-8", "latin1": "tidegate-latin1",
    "koi8r": "koi8_r", "koi8u": "koi8_u", "ucs2": "utf-16-be", "utf16": "utf-16-be",
    "utf16le": "utf-16-le", "utf32": "utf-32-be", "binary": None,
}


def mysql_latin1(data: bytes) -> str:
    """MySQL's latin1 is cp1252, except that the five bytes cp1252 leaves undefined map to the
    code points of the same value."""
    try:
        return data.decode("cp1252")
    except UnicodeDecodeError:
        return "".join(bytes([b]).decode("cp1252", "strict") if b not in CP1252_HOLES else chr(b)
                       for b in data)


CP1252_HOLES = frozenset({0x81, 0x8D, 0x8F, 0x90, 0x9D})


def python_codec(charset: str | None) -> str | None:
    """The Python codec for a MySQL character set name, or None to keep the bytes (binary, and
    character sets Python has no codec for, which the library also passes on as bytes)."""
    if charset is None:
        return "utf-8"
    name = _CODEC_BY_CHARSET.get(charset.lower(), charset.lower())
    if name is None or name == "tidegate-latin1":
        return name
    try:
        codecs.lookup(name)
    except LookupError:
        return None
    return name


# --------------------------------------------------------------------------- value helpers

UNPACK = {fmt: struct.Struct(fmt).unpack_from for fmt in ("<b", "<h", "<H", "<i", "<I", "<q", "<Q",
                                                              "<f", "<d", ">I", ">H", ">i")}
DIGITS_BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)  # bytes for 0..9 leftover decimal digits
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_DAYS = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _valid_date(y: int, m: int, d: int) -> bool:
    if y == 0 or m == 0 or d == 0 or m > 12:
        return False
    if d <= _DAYS[m]:
        return True
    return m == 2 and d == 29 and y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)


def float32_shortest(x: float) -> float:
    """The shortest decimal that reads back as the same 32-bit float (3.14, not 3.1400001)."""
    if x != x or x in (float("inf"), float("-inf")):
        return x
    packed = struct.pack("<f", x)
    for digits in range(6, 10):
        cand = float(f"{x:.{digits}g}")
        if struct.pack("<f", cand) == packed:
            return cand
    return x


def decimal_reader(precision: int, scale: int) -> tuple[int, Callable[[bytes, int], str]]:
    """(size in bytes, reader) for DECIMAL(precision, scale) in the binlog's packed form: the
    integer and fraction digits in groups of nine per 4 bytes (big-endian), leftover digits in
    1-4 bytes, the sign in the top bit (flipped), negative numbers with every bit inverted."""
    intg = precision - scale
    intg_full, intg_left = divmod(intg, 9)
    frac_full, frac_left = divmod(scale, 9)
    sizes = ([DIGITS_BYTES[intg_left]] if intg_left else []) + [4] * intg_full
    fsizes = [4] * frac_full + ([DIGITS_BYTES[frac_left]] if frac_left else [])
    size = sum(sizes) + sum(fsizes)
    nbits = size * 8
    sign_bit = 1 << (nbits - 1)
    all_ones = (1 << nbits) - 1
    # (shift, mask) of every group, most significant first; the fraction groups' digit counts
    groups = []
    shift = nbits
    for s in sizes + fsizes:
        shift -= s * 8
        groups.append((shift, (1 << (s * 8)) - 1))
    n_int = len(sizes)
    int_groups = groups[:n_int]
    frac_groups = groups[n_int:]
    frac_digits = [9] * frac_full + ([frac_left] if frac_left else [])
    int_weights = [10 ** (9 * (n_int - 1 - k)) for k in range(n_int)]
    frac_weights = []
    remaining = scale
    for d in frac_digits:
        remaining -= d
        frac_weights.append(10 ** remaining)
    def read(buf: bytes, o: int) -> str:
        x = int.from_bytes(buf[o:o + size], "big")
        neg = not (x & sign_bit)
        x ^= sign_bit
        if neg:
            x ^= all_ones
        ip = 0
        for (sh, mask), w in zip(int_groups, int_weights, strict=True):
            ip += ((x >> sh) & mask) * w
        if scale:
            fp = 0
            for (sh, mask), w in zip(frac_groups, frac_weights, strict=True):
                fp += ((x >> sh) & mask) * w
            return f"{'-' if neg else ''}{ip}.{fp:0{scale}d}"
        return f"-{ip}" if neg else str(ip)

    return size, read


def fsp_bytes(fsp: int) -> int:
    return (fsp + 1) // 2


def time2_reader(fsp: int) -> tuple[int, Callable[[bytes, int], str]]:
    """TIME(fsp): an offset-binary packed value, see MySQL's my_time_packed_from_binary."""
    size = 3 + fsp_bytes(fsp)

    def read(buf: bytes, o: int) -> str:
        intpart = (buf[o] << 16 | buf[o + 1] << 8 | buf[o + 2]) - 0x800000
        if fsp <= 0:
            packed = intpart << 24
        elif fsp <= 2:
            frac = buf[o + 3]
            if intpart < 0 and frac:
                intpart += 1
                frac -= 0x100
            packed = (intpart << 24) + frac * 10000
        elif fsp <= 4:
            frac = buf[o + 3] << 8 | buf[o + 4]
            if intpart < 0 and frac:
                intpart += 1
                frac -= 0x10000
            packed = (intpart << 24) + frac * 100
        else:
            packed = int.from_bytes(buf[o:o + 6], "big") - 0x800000000000
        sign = "-" if packed < 0 else ""
        packed = abs(packed)
        hms, us = packed >> 24, packed & 0xFFFFFF
        h, m, s = (hms >> 12) & 0x3FF, (hms >> 6) & 0x3F, hms & 0x3F
        if us:
            return f"{sign}{h:02d}:{m:02d}:{s:02d}.{us:06d}"
        return f"{sign}{h:02d}:{m:02d}:{s:02d}"

    return size, read


def date_value(x: int) -> str | None:
    y, m, d = x >> 9, (x >> 5) & 0xF, x & 0x1F
    if not _valid_date(y, m, d):
        return None
    return f"{y:04d}-{m:02d}-{d:02d}"


def old_time_value(x: int) -> str:
    """TIME in the pre-5.6 format: HHMMSS as a decimal number (non-negative, as the library)."""
    return f"{x // 10000:02d}:{(x % 10000) // 100:02d}:{x % 100:02d}"


def old_datetime_value(x: int) -> str | None:
    """DATETIME in the pre-5.6 format: YYYYMMDDhhmmss as a decimal number."""
    if x == 0:
        return None
    d, t = divmod(x, 1_000_000)
    y, m, dd = d // 10000, (d % 10000) // 100, d % 100
    if not _valid_date(y, m, dd):
        return None
    return f"{y:04d}-{m:02d}-{dd:02d}T{t // 10000:02d}:{(t % 10000) // 100:02d}:{t % 100:02d}"


def old_timestamp_value(secs: int) -> str | None:
    if secs == 0:
        return None
    return (_EPOCH + dt.timedelta(seconds=secs)).isoformat()


def b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def bits_text(data: bytes, nbits: int) -> str:
    return format(int.from_bytes(data, "big"), f"0{nbits}b")


# ------------------------------------------------------------------ MySQL binary JSON


def mysql_json_text(data: bytes) -> str | None:
    """MySQL's binary JSON as compact JSON text (MariaDB stores JSON as text instead), written
    as ``json.dumps(..., ensure_ascii=False, separators=(",", ":"))`` writes the same value."""
    if not data:
        return None
    out: list[str] = []
    _dump(_json_value(data[0], data, 1), out)
    return "".join(out)


class _RawNumber(str):
    """A JSON number whose text is kept as is (a DECIMAL inside binary JSON)."""


def _dump(v: Any, out: list[str]) -> None:
    if isinstance(v, _RawNumber):
        out.append(str.__str__(v))
    elif isinstance(v, str):
        out.append(json.dumps(v, ensure_ascii=False))
    elif v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, float):
        out.append(float.__repr__(v))
    elif isinstance(v, int):
        out.append(int.__repr__(v))
    elif isinstance(v, dict):
        out.append("{")
        for k, (key, x) in enumerate(v.items()):
            if k:
                out.append(",")
            out.append(json.dumps(key, ensure_ascii=False))
            out.append(":")
            _dump(x, out)
        out.append("}")
    else:
        out.append("[")
        for k, x in enumerate(v):
            if k:
                out.append(",")
            _dump(x, out)
        out.append("]")


_JSON_NUMBERS = {0x5: "<h", 0x6: "<H", 0x7: "<i", 0x8: "<I", 0x9: "<q", 0xA: "<Q", 0xB: "<d"}


def _json_value(t: int, data: bytes, o: int) -> Any:
    if t in (0x0, 0x1, 0x2, 0x3):  # small/large object/array
        return _json_container(data, o, small=t in (0x0, 0x2), is_object=t in (0x0, 0x1))
    if t == 0x4:
        return {0: None, 1: True, 2: False}[data[o]]
    if t in _JSON_NUMBERS:  # int16, uint16, int32, uint32, int64, uint64, double
        return UNPACK[_JSON_NUMBERS[t]](data, o)[0]
    if t == 0xC:
        n, o = _varlen(data, o)
        return data[o:o + n].decode("utf-8", "replace")
    if t == 0xF:  # opaque: a MySQL type byte, a length and the value in that type's format
        ftype = data[o]
        n, p = _varlen(data, o + 1)
        raw = data[p:p + n]
        if ftype in (NEWDECIMAL, DECIMAL) and len(raw) >= 2:
            _size, read = decimal_reader(raw[0], raw[1])
            return _RawNumber(read(raw, 2))
        if ftype in (TIME, TIME2, DATE, DATETIME, DATETIME2, TIMESTAMP, TIMESTAMP2) and len(raw) >= 8:
            return _json_temporal(ftype, int.from_bytes(raw[:8], "little", signed=True))
        return raw.decode("utf-8", "ignore")
    raise SourceError(f"unknown MySQL binary JSON value type {t}")


def _json_temporal(ftype: int, v: int) -> str:
    sign = "-" if v < 0 else ""
    v = abs(v)
    intpart, us = v >> 24, v & 0xFFFFFF
    if ftype in (TIME, TIME2):
        h, m, s = (intpart >> 12) & 0x3FF, (intpart >> 6) & 0x3F, intpart & 0x3F
        return f"{sign}{h:02d}:{m:02d}:{s:02d}.{us:06d}"
    ymd, hms = intpart >> 17, intpart & 0x1FFFF
    ym = ymd >> 5
    y, mo, d = ym // 13, ym % 13, ymd & 0x1F
    h, m, s = hms >> 12, (hms >> 6) & 0x3F, hms & 0x3F
    if ftype == DATE:
        return f"{y:04d}-{mo:02d}-{d:02d}"
    return f"{y:04d}-{mo:02d}-{d:02d} {h:02d}:{m:02d}:{s:02d}.{us:06d}"


def _varlen(data: bytes, o: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = data[o]
        o += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, o
        shift += 7


def _json_container(data: bytes, o: int, small: bool, is_object: bool) -> Any:
    u = UNPACK["<H"] if small else UNPACK["<I"]
    osz = 2 if small else 4
    base = o  # offsets inside the container are relative to its start
    count = u(data, o)[0]
    key_entry = 2 + osz
    value_entry = 1 + osz
    keys = []
    p = base + 2 * osz
    if is_object:
        for _ in range(count):
            koff = u(data, p)[0]
            klen = UNPACK["<H"](data, p + osz)[0]
            keys.append(data[base + koff:base + koff + klen].decode("utf-8", "replace"))
            p += key_entry
    values = []
    for _ in range(count):
        t = data[p]
        inline = t in (0x4, 0x5, 0x6) or (not small and t in (0x7, 0x8))
        if inline:
            values.append(_json_value(t, data, p + 1))
        else:
            values.append(_json_value(t, data, base + u(data, p + 1)[0]))
        p += value_entry
    return dict(zip(keys, values, strict=True)) if is_object else values


def datetime2_seconds(raw: bytes, cache: dict[bytes, str | None]) -> str | None:
    """The whole-seconds ISO text of a DATETIME2's first five bytes (None for zero and
    impossible dates), remembered in ``cache``."""
    x = int.from_bytes(raw, "big")
    ym = (x >> 22) & 0x1FFFF
    y, m, d = ym // 13, ym % 13, (x >> 17) & 0x1F
    hh, mm, ss = (x >> 12) & 0x1F, (x >> 6) & 0x3F, x & 0x3F
    if _valid_date(y, m, d) and hh < 24 and mm < 60 and ss < 60:
        text = f"{y:04d}-{m:02d}-{d:02d}T{hh:02d}:{mm:02d}:{ss:02d}"
    else:
        text = None
    if len(cache) > 4096:
        cache.clear()
    cache[raw] = text
    return text


def timestamp2_seconds(raw: bytes, cache: dict[bytes, str]) -> str:
    """The whole-seconds UTC ISO text (without offset) of a TIMESTAMP2's 4 bytes, remembered in
    ``cache``; "" for the zero TIMESTAMP '0000-00-00 00:00:00' (null)."""
    secs = int.from_bytes(raw, "big")
    text = (_EPOCH + dt.timedelta(seconds=secs)).strftime("%Y-%m-%dT%H:%M:%S") if secs else ""
    if len(cache) > 4096:
        cache.clear()
    cache[raw] = text
    return text


# ------------------------------------------------------------------ library reader fixes
# python-mysql-replication decodes into Python objects that events.encode_value then maps to
# JSON; these put right what it gets wrong (see tests/reference_decoders/mysql_library.py).


def library_json_text(v: Any) -> str | None:
    """MySQL binary JSON (decoded by the library with bytes keys/strings) → JSON text."""
    if v is None:
        return None
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8")
    if isinstance(v, str):
        return v

    def norm(o: Any) -> Any:
        if isinstance(o, (bytes, bytearray)):
            return bytes(o).decode("utf-8", "replace")
        if isinstance(o, dict):
            return {norm(k): norm(x) for k, x in o.items()}
        if isinstance(o, (list, tuple)):
            return [norm(x) for x in o]
        return o

    return json.dumps(norm(v), ensure_ascii=False, separators=(",", ":"))


def as_utc(v: Any) -> Any:
    """A TIMESTAMP the library decodes as a naive datetime is UTC."""
    return v.replace(tzinfo=dt.UTC) if isinstance(v, dt.datetime) else v


def fix_negative_time2(v: Any) -> Any:
    """python-mysql-replication decodes a negative TIME(fsp>0) with fraction f as -(s + (1 - f))
    (it negates the integer and fractional parts separately): undo that."""
    if not isinstance(v, dt.timedelta) or v >= dt.timedelta(0):
        return v
    mag = -v
    frac = mag.microseconds
    if not frac:
        return v
    whole = mag.days * 86400 + mag.seconds
    return -dt.timedelta(seconds=whole, microseconds=1_000_000 - frac)
