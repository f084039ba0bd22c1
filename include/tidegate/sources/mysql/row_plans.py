"""Row plans of the fast binlog reader: TABLE_MAP parsing and per-table generated decoders.

A TABLE_MAP event describes a table: names, column types with their type metadata
(lengths, precision, fractional seconds, ...), nullability and, with
``binlog_row_metadata=FULL``, the optional metadata (column names, signedness, character
sets, ENUM/SET values, primary key). :func:`parse_table_map` reads it into a
:class:`TableMap`, and :func:`build_plan` turns that into a :class:`TablePlan`: the table's
names and key plus one Python function, generated for this table, that decodes a full row
image in straight-line code. There is no dispatch on column types at row time, no column
objects and no intermediate values: each column's bytes become the final JSON-native value
(the one ``events.encode_value`` would give, see "Values" in ``sources/mysql/__init__.py``)
in one step, through the helpers of ``values.py``.

MariaDB writes the table map again before every row event. The reader caches plans by the
table map's bytes (which include the table id), so a table costs one parse and one code
generation per definition, not per event.

Where this decoder deliberately differs from python-mysql-replication (the library reader),
``values.py`` says so.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from ...errors import SourceError
from ...native import rowcodec
from .values import (  # noqa: F401 - the column type codes are part of this module's interface
    BINARY_COLLATION,
    BIT,
    BLOB,
    DATE,
    DATETIME,
    DATETIME2,
    DECIMAL,
    DIGITS_BYTES,
    DOUBLE,
    ENUM,
    FLOAT,
    GEOMETRY,
    INT24,
    JSON,
    LONG,
    LONG_BLOB,
    LONGLONG,
    MEDIUM_BLOB,
    NEWDATE,
    NEWDECIMAL,
    NULL,
    NUMERIC_TYPES,
    SET,
    SHORT,
    STRING,
    TIME,
    TIME2,
    TIMESTAMP,
    TIMESTAMP2,
    TINY,
    TINY_BLOB,
    UNPACK,
    VAR_STRING,
    VARCHAR,
    YEAR,
    b64,
    bits_text,
    date_value,
    datetime2_seconds,
    float32_shortest,
    fsp_bytes,
    mysql_json_text,
    mysql_latin1,
    old_datetime_value,
    old_time_value,
    old_timestamp_value,
    time2_reader,
    timestamp2_seconds,
)

# optional metadata field types (TABLE_MAP, binlog_row_metadata)
SIGNEDNESS, DEFAULT_CHARSET, COLUMN_CHARSET, COLUMN_NAME = 1, 2, 3, 4
SET_STR_VALUE, ENUM_STR_VALUE, GEOMETRY_TYPE = 5, 6, 7
SIMPLE_PRIMARY_KEY, PRIMARY_KEY_WITH_PREFIX = 8, 9
ENUM_AND_SET_DEFAULT_CHARSET, ENUM_AND_SET_COLUMN_CHARSET, COLUMN_VISIBILITY = 10, 11, 12

# --------------------------------------------------------------------------- table map


@dataclass
class Column:
    index: int
    type: int  # the real type (ENUM/SET instead of STRING)
    nullable: bool
    name: str | None = None
    unsigned: bool = False
    collation: int | None = None
    length: int = 0  # VARCHAR/CHAR max bytes; BLOB/JSON/GEOMETRY length bytes; ENUM/SET pack size
    precision: int = 0
    decimals: int = 0  # NEWDECIMAL scale; fsp of TIME2/DATETIME2/TIMESTAMP2
    bits: int = 0
    enum_values: list[str] | None = None
    set_values: list[str] | None = None
    enum_set_raw: list[bytes] | None = None


@dataclass
class TableMap:
    table_id: int
    schema: str
    table: str
    columns: list[Column]
    pk_indexes: list[int] = field(default_factory=list)


def lenenc(buf: bytes, o: int) -> tuple[int, int]:
    """A length-encoded integer at ``o``: (value, offset after it)."""
    c = buf[o]
    if c < 251:
        return c, o + 1
    if c == 252:
        return buf[o + 1] | buf[o + 2] << 8, o + 3
    if c == 253:
        return buf[o + 1] | buf[o + 2] << 8 | buf[o + 3] << 16, o + 4
    if c == 254:
        return int.from_bytes(buf[o + 1:o + 9], "little"), o + 9
    raise SourceError(f"malformed length-encoded integer (first byte {c}) in a binlog event")


def table_id_at(buf: bytes, o: int, post_header_len: int) -> int:
    return int.from_bytes(buf[o:o + (6 if post_header_len != 6 else 4)], "little")


def table_names(buf: bytes, o: int, post_header_len: int) -> tuple[int, str, str]:
    """(table id, schema, table) of a TABLE_MAP body at ``o``, without parsing the columns."""
    tid = table_id_at(buf, o, post_header_len)
    o += post_header_len
    n = buf[o]
    schema = buf[o + 1:o + 1 + n].decode("utf-8")
    o += n + 2  # length byte, name, NUL
    n = buf[o]
    table = buf[o + 1:o + 1 + n].decode("utf-8")
    return tid, schema, table


def parse_table_map(buf: bytes, o: int, end: int, post_header_len: int, *,
                    mariadb: bool = True) -> TableMap:
    """Parse the TABLE_MAP body ``buf[o:end]``. ``mariadb``: MariaDB lists a character set
    for GEOMETRY columns too, MySQL does not."""
    tid = table_id_at(buf, o, post_header_len)
    o += post_header_len
    n = buf[o]
    schema = buf[o + 1:o + 1 + n].decode("utf-8")
    o += n + 2
    n = buf[o]
    table = buf[o + 1:o + 1 + n].decode("utf-8")
    o += n + 2
    ncols, o = lenenc(buf, o)
    types = buf[o:o + ncols]
    o += ncols
    meta_len, o = lenenc(buf, o)
    meta_end = o + meta_len
    nulls = buf[meta_end:meta_end + (ncols + 7) // 8]
    columns = []
    for i in range(ncols):
        t = types[i]
        col = Column(i, t, bool(nulls[i >> 3] & (1 << (i & 7))))
        if t in (VARCHAR, VAR_STRING):
            col.length = buf[o] | buf[o + 1] << 8
            o += 2
        elif t == STRING:
            real, low = buf[o], buf[o + 1]
            o += 2
            if real in (ENUM, SET):
                col.type, col.length = real, low
            else:  # CHAR/BINARY: the length's two high bits hide in the type byte
                col.length = (((real << 4) & 0x300) ^ 0x300) + low
        elif t in (FLOAT, DOUBLE, BLOB, GEOMETRY, JSON, TINY_BLOB, MEDIUM_BLOB, LONG_BLOB):
            col.length = buf[o]
            o += 1
        elif t in (TIMESTAMP2, DATETIME2, TIME2):
            col.decimals = buf[o]
            o += 1
        elif t == NEWDECIMAL:
            col.precision, col.decimals = buf[o], buf[o + 1]
            o += 2
        elif t == BIT:
            col.bits = buf[o + 1] * 8 + buf[o]
            o += 2
        columns.append(col)
    o = meta_end + (ncols + 7) // 8
    tm = TableMap(tid, schema, table, columns)
    while o < end:
        kind = buf[o]
        n, o = lenenc(buf, o + 1)
        _optional_metadata(tm, kind, buf, o, o + n, mariadb)
        o += n
    return tm


def _is_character(t: int, mariadb: bool) -> bool:
    # ENUM/SET have their own lists. GEOMETRY is binary, but MariaDB lists it among the
    # character columns, so it must be counted there for the positions to line up.
    return t in (STRING, VAR_STRING, VARCHAR, BLOB, TINY_BLOB, MEDIUM_BLOB, LONG_BLOB) or \
        (mariadb and t == GEOMETRY)


def _optional_metadata(tm: TableMap, kind: int, buf: bytes, o: int, end: int, mariadb: bool) -> None:
    cols = tm.columns
    if kind == SIGNEDNESS:
        k = 0
        for c in cols:
            if c.type in NUMERIC_TYPES:
                c.unsigned = bool(buf[o + (k >> 3)] & (0x80 >> (k & 7)))
                k += 1
    elif kind in (DEFAULT_CHARSET, COLUMN_CHARSET, ENUM_AND_SET_DEFAULT_CHARSET,
                  ENUM_AND_SET_COLUMN_CHARSET):
        if kind in (DEFAULT_CHARSET, COLUMN_CHARSET):
            targets = [c for c in cols if _is_character(c.type, mariadb)]
            ids = _ints(buf, o, end) if kind == COLUMN_CHARSET else None
        else:
            targets = [c for c in cols if c.type in (ENUM, SET)]
            ids = _ints(buf, o, end) if kind == ENUM_AND_SET_COLUMN_CHARSET else None
        if ids is None:  # default collation, then (index among targets, collation) pairs
            default, p = lenenc(buf, o)
            exceptions = {}
            while p < end:
                idx, p = lenenc(buf, p)
                exceptions[idx], p = lenenc(buf, p)
            for k, c in enumerate(targets):
                c.collation = exceptions.get(k, default)
        else:
            for c, cid in zip(targets, ids, strict=False):
                c.collation = cid
    elif kind == COLUMN_NAME:
        p = o
        for c in cols:
            if p >= end:
                break
            n, p = lenenc(buf, p)
            c.name = buf[p:p + n].decode("utf-8")
            p += n
    elif kind in (SET_STR_VALUE, ENUM_STR_VALUE):
        targets = [c for c in cols if c.type == (SET if kind == SET_STR_VALUE else ENUM)]
        p = o
        for c in targets:
            if p >= end:
                break
            count, p = lenenc(buf, p)
            values = []
            for _ in range(count):
                n, p = lenenc(buf, p)
                values.append(bytes(buf[p:p + n]))
                p += n
            c.enum_set_raw = values
    elif kind == SIMPLE_PRIMARY_KEY:
        tm.pk_indexes = _ints(buf, o, end)
    elif kind == PRIMARY_KEY_WITH_PREFIX:
        ints = _ints(buf, o, end)
        tm.pk_indexes = ints[0::2]


def _ints(buf: bytes, o: int, end: int) -> list[int]:
    out = []
    while o < end:
        v, o = lenenc(buf, o)
        out.append(v)
    return out


# --------------------------------------------------------------------------- row plans


class UnsupportedColumn(SourceError):
    pass


@dataclass
class TablePlan:
    """What the reader needs to turn a table's row images into events."""

    table_id: int
    schema: str
    table: str
    names: tuple[str | None, ...]
    pk: tuple[str, ...]  # primary key columns in table order (as the library orders them)
    missing_name: int | None  # index of the first column without a name (metadata not FULL)
    full_bitmap: bytes  # the columns-present bitmap of a full row image
    decode: Callable[[bytes, int], tuple[dict[str, Any], int]] | None
    # decode sets float_flag[0] when it meets a float that orjson would write differently
    # from the stdlib (events.orjson_formats_like_stdlib); the reader resets it per event
    float_flag: list[bool] = field(default_factory=lambda: [False])
    error: str | None = None  # why rows of this table cannot be decoded (unsupported type)
    # the compiled path's plan (tidegate.native.rowcodec.NativePlan), None where it does not
    # cover every column of the table (or is not built): native_plan()
    native: Any = None


def build_plan(tm: TableMap, codec_for: Callable[[int | None], str | None]) -> TablePlan:
    """The :class:`TablePlan` of a parsed table map. ``codec_for(collation_id)`` names the
    Python codec of a collation (None: binary, keep the bytes)."""
    cols = tm.columns
    n = len(cols)
    names = tuple(c.name for c in cols)
    missing = next((c.index for c in cols if not c.name), None)
    pk_set = set(tm.pk_indexes)
    pk = tuple(c.name for c in cols if c.index in pk_set and c.name)
    full = bytes([0xFF] * (n // 8)) + (bytes([(1 << (n % 8)) - 1]) if n % 8 else b"")
    plan = TablePlan(tm.table_id, tm.schema, tm.table, names, pk, missing, full, None)
    if missing is not None:
        return plan
    try:
        plan.decode = _compile(tm, codec_for, plan.float_flag)
    except UnsupportedColumn as exc:
        plan.error = str(exc)
        return plan
    plan.native = native_plan(tm, codec_for)
    return plan


# --------------------------------------------------------------------------- native plans

# Integer column types and their size in bytes, for the compiled path.
_INT_SIZES = {TINY: 1, SHORT: 2, INT24: 3, LONG: 4, LONGLONG: 8}
_BLOB_TYPES = (BLOB, TINY_BLOB, MEDIUM_BLOB, LONG_BLOB)


def native_plan(tm: TableMap, codec_for: Callable[[int | None], str | None]) -> Any:
    """The table's plan for the compiled path (tidegate.native.rowcodec), or None when the
    extension is not there or a column is of a kind it does not cover (the whole table then
    takes the Python path). Covered: integers, DOUBLE, YEAR, DECIMAL of scale up to 6,
    CHAR/VARCHAR/TEXT in UTF-8 and BINARY/VARBINARY/BLOB, DATE, DATETIME2, TIMESTAMP2, TIME2."""
    if rowcodec is None:
        return None
    k = rowcodec.KINDS
    columns = []
    for c in tm.columns:
        t = c.type
        if t in _INT_SIZES:
            columns.append((k["int"], _INT_SIZES[t], int(c.unsigned), 0))
        elif t == DOUBLE:
            columns.append((k["double"], 0, 0, 0))
        elif t == YEAR:
            columns.append((k["year"], 0, 0, 0))
        elif t == NEWDECIMAL and c.decimals <= 6 and c.precision <= 65:
            columns.append((k["decimal"], c.precision, c.decimals, 0))
        elif t in (VARCHAR, VAR_STRING, STRING) + _BLOB_TYPES:
            codec = codec_for(c.collation)
            if codec not in ("utf-8", None):
                return None
            if t in _BLOB_TYPES:
                width = c.length
            else:
                width = 2 if c.length > 255 else 1
            pad = c.length if (t == STRING and codec is None) else 0
            columns.append((k["text"], width, int(codec == "utf-8"), pad))
        elif t == DATE:
            columns.append((k["date"], 0, 0, 0))
        elif t in (DATETIME2, TIMESTAMP2, TIME2):
            kind = {DATETIME2: "datetime2", TIMESTAMP2: "timestamp2", TIME2: "time2"}[t]
            columns.append((k[kind], c.decimals, 0, 0))
        else:
            return None
    names = [orjson.dumps(c.name) + b":" for c in tm.columns]
    pk_set = set(tm.pk_indexes)
    pk = [c.index for c in tm.columns if c.index in pk_set and c.name]
    pk_sorted = sorted(pk, key=lambda i: tm.columns[i].name)
    return rowcodec.NativePlan(columns, names, pk, pk_sorted)


def _compile(tm: TableMap, codec_for: Callable[[int | None], str | None], float_flag: list[bool]):
    """Generate ``decode(buf, o) -> (row dict, offset after the row)`` for a full row image:
    the NULL bitmap, then each non-NULL column's bytes."""
    ns: dict[str, Any] = {"_b64": b64, "_f32": float32_shortest, "_int": int.from_bytes,
                          "_flag": float_flag, "_MISS": _MISS,
                          "_date": date_value, "_bits": bits_text, "_json": mysql_json_text,
                          "_latin1": mysql_latin1, "_otime": old_time_value,
                          "_odatetime": old_datetime_value, "_otimestamp": old_timestamp_value}
    for fmt, fn in UNPACK.items():
        ns["_" + {"<": "le", ">": "be"}[fmt[0]] + fmt[1]] = fn
    n = len(tm.columns)
    nbytes = (n + 7) // 8
    lines = ["def decode(buf, o):"]
    for k in range(nbytes):
        lines.append(f"    n{k} = buf[o + {k}]")
    lines.append(f"    o += {nbytes}")
    for c in tm.columns:
        i = c.index
        body = _column_code(c, i, ns, codec_for, tm)
        lines.append(f"    if n{i >> 3} & {1 << (i & 7)}:")
        lines.append(f"        v{i} = None")
        lines.append("    else:")
        lines.extend("        " + line for line in body)
    items = ", ".join(f"{c.name!r}: v{c.index}" for c in tm.columns)
    lines.append(f"    return {{{items}}}, o")
    src = "\n".join(lines)
    exec(compile(src, f"<row plan {tm.schema}.{tm.table}>", "exec"), ns)  # noqa: S102 - generated from type codes; names only appear as repr() literals
    return ns["decode"]


_MISS = object()


def _frac_code(fsp: int, at: int) -> list[str]:
    """Code setting ``us`` to the fractional microseconds stored at ``o + at``."""
    if fsp <= 2:
        return [f"us = buf[o + {at}] * 10000"]
    if fsp <= 4:
        return [f"us = (buf[o + {at}] << 8 | buf[o + {at + 1}]) * 100"]
    return [f"us = buf[o + {at}] << 16 | buf[o + {at + 1}] << 8 | buf[o + {at + 2}]"]


def _decimal_code(i: int, precision: int, scale: int, ns: dict[str, Any]) -> list[str]:
    """Inline code for DECIMAL(precision, scale) in the binlog's packed form: the integer and
    fraction digits in groups of nine per 4 bytes (big-endian), leftover digits in 1-4 bytes,
    the sign in the top bit (flipped), negative numbers with every bit inverted. The text is
    the server's own text, every place of the scale (``0.0000001000``, never ``1.000E-7``).
    Format specs in f-strings are slow, so zero padding is ``str(n + 10**width)[1:]``."""
    intg = precision - scale
    intg_full, intg_left = divmod(intg, 9)
    frac_full, frac_left = divmod(scale, 9)
    isizes = ([DIGITS_BYTES[intg_left]] if intg_left else []) + [4] * intg_full
    fdigits = [9] * frac_full + ([frac_left] if frac_left else [])
    fsizes = [4 if d == 9 else DIGITS_BYTES[d] for d in fdigits]
    sizes = isizes + fsizes
    size = sum(sizes)
    fmt = ">" + "".join({1: "B", 2: "H", 3: "3s", 4: "I"}[z] for z in sizes)
    ns[f"_dec{i}"] = struct.Struct(fmt).unpack_from
    g = [f"g{k}" for k in range(len(sizes))]
    code = [f"{', '.join(g)}, = _dec{i}(buf, o)"]
    code += [f"g{k} = _int(g{k}, 'big')" for k, z in enumerate(sizes) if z == 3]
    top = 1 << (sizes[0] * 8 - 1)
    masks = [(1 << (z * 8)) - 1 for z in sizes]
    # weights of the integer groups, most significant first; fraction groups likewise
    iw = [10 ** (9 * (len(isizes) - 1 - k)) for k in range(len(isizes))]
    fw, left = [], scale
    for d in fdigits:
        left -= d
        fw.append(10 ** left)

    def value(flip: list[int]) -> list[str]:
        terms = [f"(g{k} ^ {flip[k]}) * {w}" if flip[k] else f"g{k} * {w}" for k, w in enumerate(iw)]
        fterms = [f"(g{k} ^ {flip[k]}) * {w}" if flip[k] else f"g{k} * {w}"
                  for k, w in zip(range(len(isizes), len(sizes)), fw, strict=True)]
        return [f"ip = {' + '.join(terms) or '0'}"] + ([f"fp = {' + '.join(fterms)}"] if scale else [])

    pos = [top] + [0] * (len(sizes) - 1)
    neg = [masks[0] ^ top] + masks[1:]
    text = f"f'{{sg}}{{ip}}.{{str(fp + {10 ** scale})[1:]}}'" if scale else "f'{sg}{ip}'"
    code += [f"if g0 & {top}:", "    sg = ''"] + ["    " + line for line in value(pos)]
    code += ["else:", "    sg = '-'"] + ["    " + line for line in value(neg)]
    code += [f"v{i} = {text}"]
    return code + [f"o += {size}"]


def _text_code(i: int, start: str, stop: str, codec: str | None, pad: int = 0) -> list[str]:
    if codec is None:
        if pad:
            return [f"v{i} = _b64(buf[{start}:{stop}].ljust({pad}, b'\\x00'))"]
        return [f"v{i} = _b64(buf[{start}:{stop}])"]
    if codec == "tidegate-latin1":
        return [f"v{i} = _latin1(buf[{start}:{stop}])"]
    return [f"v{i} = buf[{start}:{stop}].decode({codec!r})"]


def _column_code(c: Column, i: int, ns: dict[str, Any], codec_for, tm: TableMap) -> list[str]:
    t, u = c.type, c.unsigned
    if t == TINY:
        return [f"v{i} = buf[o]", "o += 1"] if u else \
            [f"v{i} = buf[o]", "o += 1", f"if v{i} > 127:", f"    v{i} -= 256"]
    if t == SHORT:
        return [f"v{i} = _le{'H' if u else 'h'}(buf, o)[0]", "o += 2"]
    if t == INT24:
        return [f"v{i} = _int(buf[o:o + 3], 'little', signed={not u})", "o += 3"]
    if t == LONG:
        return [f"v{i} = _le{'I' if u else 'i'}(buf, o)[0]", "o += 4"]
    if t == LONGLONG:
        return [f"v{i} = _le{'Q' if u else 'q'}(buf, o)[0]", "o += 8"]
    if t in (FLOAT, DOUBLE):
        read = "_f32(_lef(buf, o)[0])" if t == FLOAT else "_led(buf, o)[0]"
        return [f"v{i} = {read}", f"o += {4 if t == FLOAT else 8}",
                f"if not (v{i} == 0.0 or 1e-4 <= abs(v{i}) < 1e16):", "    _flag[0] = True"]
    if t == YEAR:
        return [f"v{i} = buf[o]", "o += 1", f"v{i} = v{i} + 1900 if v{i} else None"]
    if t == NEWDECIMAL:
        return _decimal_code(i, c.precision, c.decimals, ns)
    if t in (VARCHAR, VAR_STRING, STRING):
        codec = codec_for(c.collation)
        pad = c.length if (t == STRING and codec is None) else 0
        if c.length > 255:
            head = ["ln = buf[o] | buf[o + 1] << 8", "o += 2"]
        else:
            head = ["ln = buf[o]", "o += 1"]
        return head + _text_code(i, "o", "o + ln", codec, pad) + ["o += ln"]
    if t in (BLOB, TINY_BLOB, MEDIUM_BLOB, LONG_BLOB, GEOMETRY, JSON):
        ls = c.length
        head = [f"ln = _int(buf[o:o + {ls}], 'little')", f"o += {ls}"]
        if t == JSON:
            return head + [f"v{i} = _json(buf[o:o + ln])", "o += ln"]
        codec = None if t == GEOMETRY else codec_for(c.collation)
        return head + _text_code(i, "o", "o + ln", codec) + ["o += ln"]
    if t == ENUM:
        values = [""] + [_enum_text(v, c, codec_for) for v in (c.enum_set_raw or [])]
        if not c.enum_set_raw:
            ns[f"_enum{i}"] = None
            return [f"v{i} = None", f"o += {c.length}"]
        ns[f"_enum{i}"] = tuple(values)
        idx = "buf[o]" if c.length == 1 else "buf[o] | buf[o + 1] << 8"
        return [f"v{i} = _enum{i}[{idx}]", f"o += {c.length}"]
    if t == SET:
        members = sorted((_enum_text(v, c, codec_for), 1 << k) for k, v in enumerate(c.enum_set_raw or []))
        ns[f"_set{i}"] = tuple(members)
        if not c.enum_set_raw:
            return [f"v{i} = None", f"o += {c.length}"]
        return [f"mask = _int(buf[o:o + {c.length}], 'little')",
                f"v{i} = [name for name, bit in _set{i} if mask & bit]", f"o += {c.length}"]
    if t == BIT:
        nb = (c.bits + 7) // 8
        return [f"v{i} = _bits(buf[o:o + {nb}], {c.bits})", f"o += {nb}"]
    if t == DATE:  # dates repeat a lot: cache the text by the stored value
        ns[f"_c{i}"] = {}
        return ["x = buf[o] | buf[o + 1] << 8 | buf[o + 2] << 16", f"v{i} = _c{i}.get(x, _MISS)",
                f"if v{i} is _MISS:", f"    v{i} = _date(x)",
                f"    if len(_c{i}) > 4096:", f"        _c{i}.clear()", f"    _c{i}[x] = v{i}", "o += 3"]
    if t == DATETIME2:  # whole seconds are cached by their 5 bytes: bulk writes repeat them
        ns[f"_c{i}"] = {}
        ns["_dtfmt"] = datetime2_seconds
        code = ["k = buf[o:o + 5]", f"v{i} = _c{i}.get(k, _MISS)",
                f"if v{i} is _MISS:", f"    v{i} = _dtfmt(k, _c{i})"]
        if c.decimals:
            code += [f"if v{i} is not None:"] + ["    " + line for line in _frac_code(c.decimals, 5)] + \
                    ["    if us:", f"        v{i} = f'{{v{i}}}.{{str(us + 1000000)[1:]}}'"]
        return code + [f"o += {5 + fsp_bytes(c.decimals)}"]
    if t == TIMESTAMP2:
        ns[f"_c{i}"] = {}
        ns["_tsfmt"] = timestamp2_seconds
        code = ["k = buf[o:o + 4]", f"v{i} = _c{i}.get(k)", f"if v{i} is None:",
                f"    v{i} = _tsfmt(k, _c{i})", f"if v{i}:"]
        if c.decimals:
            code += ["    " + line for line in _frac_code(c.decimals, 4)] + \
                    ["    if us:", f"        v{i} = f'{{v{i}}}.{{str(us + 1000000)[1:]}}'"]
        return code + [f"    v{i} += '+00:00'", "else:", f"    v{i} = None",
                       f"o += {4 + fsp_bytes(c.decimals)}"]
    if t == TIME2:
        size, read = time2_reader(c.decimals)
        ns[f"_t{i}"] = read
        return [f"v{i} = _t{i}(buf, o)", f"o += {size}"]
    if t == TIME:
        return [f"v{i} = _otime(buf[o] | buf[o + 1] << 8 | buf[o + 2] << 16)", "o += 3"]
    if t == DATETIME:
        return [f"v{i} = _odatetime(_leQ(buf, o)[0])", "o += 8"]
    if t == TIMESTAMP:
        return [f"v{i} = _otimestamp(_leI(buf, o)[0])", "o += 4"]
    raise UnsupportedColumn(f"column {c.name!r} of {tm.schema}.{tm.table} has binlog type {t}, "
                            f"which the binlog reader does not decode")


def _enum_text(raw: bytes, c: Column, codec_for) -> str:
    codec = codec_for(c.collation)
    if codec is None:
        return raw.decode("utf-8", "replace")
    if codec == "tidegate-latin1":
        return mysql_latin1(raw)
    return raw.decode(codec, "replace")
