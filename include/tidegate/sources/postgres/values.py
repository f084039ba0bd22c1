"""PostgreSQL column values: from wal2json's JSON to the JSON-native values of an envelope.

wal2json writes each column as ``{"name", "type", "value"}``: integers, floating point and
numeric values as bare JSON numbers (numeric NaN/Infinity as null), booleans as JSON
booleans, everything else as PostgreSQL's text output in a string. Messages are parsed with
JSON numbers that are not integers kept as ``Decimal`` (their exact text), so a numeric's
scale survives. What each type becomes is the contract of the package
(``sources/postgres/__init__.py``, "Values").

Two ways to the same values:

* :func:`converter` maps one wal2json type name to a function over one value; the reference
  reader applies it column by column, and ``events.encode_row`` finishes the job;
* :class:`RowPlan` generates, for one table's list of column names and types (its
  signature), one function that turns a row's columns into the final dict in straight-line
  code, with no dispatch on types and no second encoding pass. The fast reader keeps one per
  (table, column count) and makes a new one when a row's signature differs.

Both give the same values for every input; ``tests/integration/test_postgres_reader.py``
compares them on a real WAL range.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
from collections.abc import Callable
from typing import Any

from ...events import decimal_text, encode_value

# Type OIDs that wal2json writes as JSON numbers or booleans (by the column's own type, so a
# domain over integer is text there, and here).
INT_OIDS = frozenset({20, 21, 23, 26})  # int8, int2, int4, oid
DECIMAL_OIDS = frozenset({700, 701, 1700})  # float4, float8, numeric
BOOL_OID = 16

UNAVAILABLE = "__debezium_unavailable_value"
_TZ_SUFFIX = re.compile(r"([+-]\d\d)(?::?(\d\d))?(?::?(\d\d))?$")
_NATIVE = (str, int, bool, type(None))


# ---------------------------------------------------------------------- one value at a time


def ts_iso(v: Any) -> Any:
    """PostgreSQL ISO output ``2024-01-02 03:04:05.5[+00]`` → ISO-8601 ``2024-01-02T03:04:05.5[+00:00]``."""
    if not isinstance(v, str) or len(v) < 11 or v[10] != " ":
        return v  # infinity, -infinity, BC dates: keep PostgreSQL's text
    s = v[:10] + "T" + v[11:]
    m = _TZ_SUFFIX.search(s[19:])
    if m:
        off = f"{m.group(1)}:{m.group(2) or '00'}" + (f":{m.group(3)}" if m.group(3) else "")
        s = s[: 19 + m.start()] + off
    return s


def ts_iso_fast(v: Any) -> Any:
    """:func:`ts_iso` without the regular expression for the two common shapes: no zone, and
    UTC written as ``+00`` (what a session with TimeZone=UTC writes)."""
    if v.__class__ is not str or len(v) < 11 or v[10] != " ":
        return ts_iso(v)
    s = v[:10] + "T" + v[11:]
    tail = s[19:]
    if "+" not in tail and "-" not in tail:
        return s
    if tail == "+00" or (tail[-3:] == "+00" and tail[-4:-3].isdigit() and tail.count("+") == 1
                         and "-" not in tail):
        return s + ":00"
    return ts_iso(v)


def bytea_bytes(v: Any) -> Any:
    if not isinstance(v, str):
        return v
    h = v[2:] if v.startswith("\\x") else v
    return bytes.fromhex(h)


def numeric_text(v: Any) -> Any:
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, float):  # NaN / Infinity (json constants)
        return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    return decimal_text(v) if isinstance(v, decimal.Decimal) else str(v)


def float_value(v: Any) -> Any:
    return float(v) if isinstance(v, (decimal.Decimal, int)) and not isinstance(v, bool) else v


def _identity(v: Any) -> Any:
    return v


def array_literal(s: str) -> Any:
    """Parse PostgreSQL's array text output (``{1,NULL,"a b",{2,3}}``) into nested lists of
    element strings (None for NULL)."""
    if not isinstance(s, str) or not s.startswith("{"):
        return s

    def parse(i: int) -> tuple[list, int]:
        out: list = []
        i += 1
        if s[i] == "}":
            return out, i + 1
        while True:
            c = s[i]
            if c == "{":
                v, i = parse(i)
                out.append(v)
            elif c == '"':
                j = i + 1
                buf = []
                while s[j] != '"':
                    if s[j] == "\\":
                        j += 1
                    buf.append(s[j])
                    j += 1
                out.append("".join(buf))
                i = j + 1
            else:
                j = i
                while s[j] not in ",}":
                    j += 1
                tok = s[i:j].strip()
                out.append(None if tok == "NULL" else tok)
                i = j
            if s[i] == ",":
                i += 1
                continue
            return out, i + 1

    try:
        return parse(0)[0]
    except (IndexError, ValueError):
        return s


def _element(base: str) -> Callable[[str], Any]:
    conv = converter(base)
    if base in ("smallint", "integer", "bigint", "oid"):
        return int
    if base == "boolean":
        return lambda t: t == "t"
    if base in ("real", "double precision"):
        return float
    if base.startswith(("numeric", "decimal")):
        return str
    return conv


def _map_nested(v: Any, fn: Callable[[str], Any]) -> Any:
    if isinstance(v, list):
        return [_map_nested(x, fn) for x in v]
    return None if v is None else fn(v)


_CONVERTERS: dict[str, Callable[[Any], Any]] = {}


def converter(typ: str) -> Callable[[Any], Any]:
    """The value converter for a wal2json ``type`` string (cached)."""
    fn = _CONVERTERS.get(typ)
    if fn is not None:
        return fn
    if typ.endswith("[]"):
        elem = _element(typ[:-2])

        def fn(v: Any, _e=elem) -> Any:
            parsed = array_literal(v)
            return _map_nested(parsed, _e) if isinstance(parsed, list) else parsed
    elif typ.startswith(("numeric", "decimal")):
        fn = numeric_text
    elif typ in ("real", "double precision"):
        fn = float_value
    elif typ == "bytea":
        fn = bytea_bytes
    elif typ.startswith("timestamp"):
        fn = ts_iso
    else:
        fn = _identity
    _CONVERTERS[typ] = fn
    return fn


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_ONE_US = dt.timedelta(microseconds=1)


def commit_time(ts: str | int | None) -> tuple[int, int | None]:
    """A transaction's commit time as (ms, µs) since the epoch: from wal2json's ``timestamp``
    text, or from an int that is already µs (the pgoutput reader's). (0, None) if absent.

    The ms are computed as they always were, through ``datetime.timestamp()`` (one correctly
    rounded float, then ``* 1000`` and ``int``): they are ``ts_ms`` in tidegate's envelope, whose
    bytes must not change. The µs are exact (``envelope: debezium`` writes them as Debezium's
    ``source.ts_us``); wal2json's text and pgoutput's binary give the same pair."""
    if ts.__class__ is int:
        return int(ts / 1_000_000 * 1000), ts  # type: ignore[operator]
    if not ts:
        return 0, None
    try:
        moment = dt.datetime.fromisoformat(ts_iso(ts))
    except ValueError:
        return 0, None
    if moment.tzinfo is None:  # never from wal2json (it writes the zone); read as timestamp() does
        moment = moment.astimezone()
    return int(moment.timestamp() * 1000), (moment - _EPOCH) // _ONE_US


def complete_after(after: dict[str, Any] | None, before: dict[str, Any] | None,
                   table_columns: Callable[[], list[str]]) -> dict[str, Any] | None:
    """Fill the columns wal2json left out of an UPDATE's new tuple (unchanged TOAST values):
    from the old tuple when it has them (REPLICA IDENTITY FULL), else with
    :data:`UNAVAILABLE`. ``table_columns()`` lists the table's columns (the column set known at
    that row, else the catalog's)."""
    if after is None:
        return None
    if before is not None and len(before) > len(after) and all(k in before for k in after):
        return {k: (after[k] if k in after else before[k]) for k in before}
    cols = table_columns()
    if len(cols) <= len(after):
        return after
    out = {}
    for c in cols:
        if c in after:
            out[c] = after[c]
        elif before is not None and c in before:
            out[c] = before[c]
        else:
            out[c] = UNAVAILABLE
    for k, v in after.items():
        out.setdefault(k, v)
    return out


# ---------------------------------------------------------------------- generated row plans

# Types whose wal2json value is always a JSON integer, boolean or string (or null): their
# value is final as it comes. Any other type without a converter of its own goes through
# events.encode_value, as on the reference path.
_FINAL_TYPES = frozenset({"smallint", "integer", "bigint", "oid", "boolean", "text", "uuid", "json",
                          "jsonb", "date", "name", "xml", "inet", "cidr", "macaddr", "interval",
                          "money", "tsvector"})
_FINAL_PREFIXES = ("character", "time ", "time(", "bit", "\"char\"")


def _is_final(typ: str) -> bool:
    return typ in _FINAL_TYPES or typ.startswith(_FINAL_PREFIXES)


def _final_value(v: Any) -> Any:
    return v if v.__class__ in _NATIVE else encode_value(v)


def _float_final(v: Any) -> Any:
    """A float orjson may write differently from the stdlib (events.orjson_formats_like_stdlib)
    or a non-finite one (as events.encode_value writes it)."""
    return v if math.isfinite(v) else encode_value(v)


class RowPlan:
    """One table signature's generated converter: ``plan.convert(columns)`` returns the row
    dict, or None when ``columns`` (wal2json column objects with ``name``, ``type`` and
    ``value``) do not have exactly this signature. ``float_flag[0]`` is set when a float of
    the row may be written differently by orjson than by the stdlib; the caller resets it."""

    __slots__ = ("convert", "signature")

    def __init__(self, signature: tuple[tuple[str, str], ...], float_flag: list[bool]):
        self.signature = signature
        self.convert = _compile(signature, float_flag)


def plan_namespace(float_flag: list[bool]) -> dict[str, Any]:
    """The globals a generated plan's code (:func:`value_code`) runs with."""
    return {"_flag": float_flag, "_ts": ts_iso_fast, "_tsc": {}, "_final": _final_value,
            "_float_final": _float_final, "_encode": encode_value, "_Decimal": decimal.Decimal,
            "_dtext": decimal_text}


def _compile(signature: tuple[tuple[str, str], ...], float_flag: list[bool]):
    ns = plan_namespace(float_flag)
    n = len(signature)
    names = ", ".join(f"c{i}" for i in range(n))
    lines = ["def convert(cols):"]
    if n == 0:
        lines += ["    if cols:", "        return None", "    return {}"]
    else:
        lines += [f"    if len(cols) != {n}:", "        return None",
                  f"    {names}{',' if n == 1 else ''} = cols"]
        checks = " or ".join(f"c{i}.name != {name!r} or c{i}.type != {typ!r}"
                             for i, (name, typ) in enumerate(signature))
        lines += [f"    if {checks}:", "        return None"]
        for i, (_name, typ) in enumerate(signature):
            lines += ["    " + line for line in value_code(i, typ, ns)]
        items = ", ".join(f"{name!r}: v{i}" for i, (name, _typ) in enumerate(signature))
        lines.append(f"    return {{{items}}}")
    exec(compile("\n".join(lines), "<postgres row plan>", "exec"), ns)  # noqa: S102 - names only appear as repr() literals
    return ns["convert"]


def value_code(i: int, typ: str, ns: dict[str, Any], src: str | None = None) -> list[str]:
    """Code setting ``v{i}`` to the final value of column ``c{i}`` of type ``typ``: what
    ``encode_value(converter(typ)(value))`` gives. ``src`` is the expression that holds the
    value as wal2json's JSON has it (default ``c{i}.value``; the pgoutput plans make it from the
    column's text, sources/postgres/pgoutput.py)."""
    x = src or f"c{i}.value"
    if typ.endswith("[]"):  # may hold floats: the event checks them itself
        ns[f"_conv{i}"] = converter(typ)
        return [f"v{i} = _encode(_conv{i}({x}))", "_flag[0] = True"]
    if typ == "bytea":
        ns[f"_conv{i}"] = converter(typ)
        return [f"v{i} = _encode(_conv{i}({x}))"]
    if typ.startswith(("numeric", "decimal")):
        # wal2json writes a bare number: an int (str() is its text) or (parsed) a Decimal
        return [f"v{i} = {x}", f"if v{i} is not None and v{i}.__class__ is not str:",
                f"    v{i} = _dtext(v{i}) if v{i}.__class__ is _Decimal else str(v{i})"]
    if typ in ("real", "double precision"):
        return [f"v{i} = {x}",
                f"if v{i}.__class__ is _Decimal or v{i}.__class__ is int or v{i}.__class__ is float:",
                f"    v{i} = float(v{i})",
                f"    if not (v{i} == 0.0 or 1e-4 <= abs(v{i}) < 1e16):",
                "        _flag[0] = True",
                f"        v{i} = _float_final(v{i})"]
    if typ.startswith("timestamp"):  # rows of a transaction often share their timestamps
        return [f"v{i} = {x}", f"t = _tsc.get(v{i})", "if t is None:",
                f"    t = _ts(v{i})", "    if len(_tsc) > 4096:", "        _tsc.clear()",
                f"    _tsc[v{i}] = t", f"v{i} = t"]
    if _is_final(typ):
        return [f"v{i} = {x}"]
    return [f"v{i} = _final({x})"]


# ---------------------------------------------------------------------- output text to values

NUMERIC_OID = 1700
_NOT_NUMBERS = ("nan", "infinity", "-infinity")


def wal2json_value(oid: int) -> Callable[[str], Any]:
    """What wal2json makes of a column's text output (before the log path's converter)."""
    if oid in INT_OIDS:
        return int
    if oid in DECIMAL_OIDS:
        return lambda t: None if t.lower() in _NOT_NUMBERS else decimal.Decimal(t)
    if oid == BOOL_OID:
        return lambda t: t == "t"
    return _text


def _text(t: str) -> str:
    return t


def _compose(first: Callable[[Any], Any], then: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def both(v: Any) -> Any:
        x = first(v)
        return None if x is None else then(x)

    return both


def compiled_kind(oid: int, typ: str, log: bool = False) -> str | None:
    """The compiled path's kind of a column's output text (``rowcodec.TEXT_KINDS``: the same JSON
    as :func:`row_converter`'s value), or None where only the Python path converts its text.
    ``log``: for the log's rows (pgoutput), where a real/double's text is read as wal2json's JSON
    number (``pgoutput.float_number``: ``-0`` is 0.0; a snapshot's ``float`` makes -0.0)."""
    if oid in INT_OIDS:
        return "int"
    if oid == BOOL_OID:
        return "bool"
    if oid == NUMERIC_OID:
        return "decimal"
    if oid in DECIMAL_OIDS:
        return "log_double" if log else "double"  # float4, float8
    if row_converter(oid, typ) is None:
        return "text"
    return "pg_timestamp" if converter(typ) is ts_iso else None


def row_converter(oid: int, typ: str) -> Callable[[Any], Any] | None:
    """A column's text (never None) to its value, as wal2json and then the log path's converter
    make it; None when that is the text itself (a text type with the identity converter)."""
    first, then = wal2json_value(oid), converter(typ)
    if then is ts_iso:
        then = ts_iso_fast  # the same text (tests/unit/test_postgres_values.py), mostly without a regex
    if first is _text:
        return None if then is _identity else then
    return first if then is _identity else _compose(first, then)
