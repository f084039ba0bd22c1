"""A table's columns right after a DDL statement, as the binlog itself tells them.

The binlog records a DDL as its text, not the definition it leaves. The definition shows in
the next TABLE_MAP event of the table (with ``binlog_row_metadata=FULL``: names, types,
signedness, character sets, ENUM/SET values), written before its next row event.
:func:`columns_after` looks for it with a short read of its own, from the end of the statement
forward, and stops at:

* the first TABLE_MAP of the table: its columns are the answer;
* a later DDL that changes the table: the definition the first one left was replaced before
  any row used it, so it is not known (None);
* :data:`LOOKAHEAD_BYTES` of binlog, or the server's current end of binlog: not known (None).

The answer depends on the binlog only (not on the range a run reads, how it is sliced or
when it is read), so every replay gives the same message; the one exception is a statement
whose table has no row yet in the binlog when it is read: a later read may find one.

Types are written the way ``SHOW COLUMNS`` would for what the table map holds: lengths the
map does not carry in characters (CHAR/VARCHAR/TEXT hold bytes there) are left out.
"""

from __future__ import annotations

from typing import Any

from . import values as code  # the column type codes
from .binlog_client import FORMAT_DESCRIPTION_EVENT, QUERY_EVENT, TABLE_MAP_EVENT, BinlogStream
from .ddl import tables_changed
from .row_plans import TableMap, parse_table_map, table_names

BODY = 20  # payload offset of an event body: status byte + 19-byte header
LOOKAHEAD_BYTES = 8 * 1024 * 1024

_INTEGERS = {code.TINY: "tinyint", code.SHORT: "smallint", code.INT24: "mediumint", code.LONG: "int",
             code.LONGLONG: "bigint"}
_SIMPLE = {code.FLOAT: "float", code.DOUBLE: "double", code.DATE: "date", code.NEWDATE: "date",
           code.YEAR: "year", code.JSON: "json", code.GEOMETRY: "geometry", code.DATETIME: "datetime",
           code.TIMESTAMP: "timestamp", code.TIME: "time"}
_WITH_FSP = {code.DATETIME2: "datetime", code.TIMESTAMP2: "timestamp", code.TIME2: "time"}
_BLOBS = {1: "tiny", 2: "", 3: "medium", 4: "long"}


def column_type(col: Any) -> str:
    """A table map column's type in SQL words (``int unsigned``, ``decimal(10,2)``,
    ``datetime(6)``, ``enum('a','b')``, ``varchar``, ``longtext``, ...)."""
    t = col.type
    binary = col.collation == code.BINARY_COLLATION
    if t in _INTEGERS:
        return _INTEGERS[t] + (" unsigned" if col.unsigned else "")
    if t in (code.NEWDECIMAL, code.DECIMAL):
        return f"decimal({col.precision},{col.decimals})" + (" unsigned" if col.unsigned else "")
    if t in _WITH_FSP:
        return _WITH_FSP[t] + (f"({col.decimals})" if col.decimals else "")
    if t in _SIMPLE:
        return _SIMPLE[t] + (" unsigned" if col.unsigned and t in (code.FLOAT, code.DOUBLE) else "")
    if t in (code.VARCHAR, code.VAR_STRING):
        return "varbinary" if binary else "varchar"
    if t == code.STRING:
        return "binary" if binary else "char"
    if t in (code.BLOB, code.TINY_BLOB, code.MEDIUM_BLOB, code.LONG_BLOB):
        size = _BLOBS.get(col.length, "")
        return size + ("blob" if binary else "text")
    if t in (code.ENUM, code.SET):
        values = col.enum_set_raw or []
        words = ",".join("'" + v.decode("utf-8", "replace").replace("'", "''") + "'" for v in values)
        return ("enum" if t == code.ENUM else "set") + f"({words})"
    if t == code.BIT:
        return f"bit({col.bits})"
    return f"type {t}"


def describe(tm: TableMap) -> list[dict[str, str]] | None:
    """The table map's columns as ``[{"name", "type"}]`` in table order (None when the binlog
    has no column names: ``binlog_row_metadata`` is not FULL)."""
    if any(not c.name for c in tm.columns):
        return None
    return [{"name": c.name, "type": column_type(c)} for c in tm.columns]


def columns_after(settings: dict[str, Any], server_id: int, file: str, pos: int, db: str, table: str,
                  *, mariadb: bool, budget: int = LOOKAHEAD_BYTES) -> list[dict[str, str]] | None:
    """The columns of ``db.table`` as the binlog describes them after ``file:pos`` (the end of
    a DDL statement), or None when it does not tell (see the module docstring). Reads with its
    own replication connection, as client ``server_id``."""
    stream = BinlogStream(settings, server_id, file, pos)
    post_header = bytes(256)
    scanned = 0
    try:
        for etype, _ts, _sid, log_pos, size, pkt, end in stream:
            if etype == FORMAT_DESCRIPTION_EVENT:
                lengths = pkt[BODY + 57:end - 1]
                post_header = bytes(lengths) + bytes(max(0, 256 - len(lengths)))
                continue
            if log_pos == 0:
                continue  # an artificial event the server makes up at the start of a file
            scanned += size
            if etype == TABLE_MAP_EVENT:
                phl = post_header[TABLE_MAP_EVENT - 1] or 8
                _tid, schema, name = table_names(pkt, BODY, phl)
                if (schema, name) == (db, table):
                    return describe(parse_table_map(pkt, BODY, end, phl, mariadb=mariadb))
            elif etype == QUERY_EVENT:
                default_db, q = query_text(pkt, end, post_header[QUERY_EVENT - 1] or 13)
                change = tables_changed(q, default_db)
                if change is not None and any(d == db and t in (table, None) for d, t in change.tables):
                    return None
            if scanned > budget:
                return None
        return None
    finally:
        stream.close()


def query_text(pkt: bytes, end: int, post_header_len: int) -> tuple[str, str]:
    """(default database, statement text stripped) of a QUERY event."""
    schema_len = pkt[BODY + 8]
    status_len = int.from_bytes(pkt[BODY + 11:BODY + 13], "little")
    o = BODY + post_header_len + status_len
    schema = pkt[o:o + schema_len].decode("utf-8", "replace")
    q = pkt[o + schema_len + 1:end].decode("utf-8", errors="backslashreplace").strip()
    return schema, q
