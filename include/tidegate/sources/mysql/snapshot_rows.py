"""A MySQL/MariaDB snapshot chunk's rows straight from the server's row packets to events
(sources/snapshot_rows.py; docs/architecture.md, "The compiled hot path").

pymysql turns each value of a row into a Python object (an int, a Decimal, a datetime) and
``snapshot.RowEvents`` turns those into the envelope's JSON: two passes per column in Python,
most of a chunk read's CPU. A chunk of a table whose columns are all of the kinds of
:func:`text_kind` is read as raw row packets instead, and the compiled path writes each row's
event from the packet's text (tests/unit/test_snapshot_rows.py and
tests/integration/test_snapshot_sources.py compare both paths). A row it would write
differently (text that is not UTF-8, a ZEROFILL number) is decoded by pymysql.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pymysql.protocol

from ..snapshot_rows import RawRows, compiled_plan

_INTEGERS = ("tinyint", "smallint", "mediumint", "int", "integer", "bigint")
_STRINGS = ("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum",
            "binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob")
_SAME_NAME = ("year", "decimal", "double", "date", "datetime", "timestamp")


def text_kind(data_type: str, encoding: str | None) -> str | None:
    """The compiled path's kind of a column (information_schema's DATA_TYPE, and the encoding
    pymysql gives its values: None for bytes), or None for a kind only the Python path reads
    (FLOAT, BIT, SET, TIME, MySQL's JSON, spatial types...)."""
    t = data_type.lower()
    if t in _INTEGERS:
        return "int"
    if t in _SAME_NAME:
        return t
    if t in _STRINGS:
        return "binary" if encoding is None else "text"
    return None


def text_rows(build: Any, result: Any, columns: Sequence[tuple[str, str]],
              convs: Sequence[tuple[int, Callable]]) -> RawRows | None:
    """The compiled events of a chunk read by ``build`` (a ``snapshot.RowEvents``) whose
    result set is ``result`` (pymysql's, its descriptions read), with columns ``(name,
    DATA_TYPE)`` and the Python path's value converters ``convs`` (column index, converter);
    None where the Python path reads it."""
    names = [name for name, _ in columns]
    kinds = [text_kind(data_type, encoding)
             for (_, data_type), (encoding, _) in zip(columns, result.converters, strict=True)]
    plan = compiled_plan(build, names, kinds)
    if plan is None:
        return None

    def decode(packet: bytes) -> dict[str, Any]:
        row = list(result._read_row_from_packet(pymysql.protocol.MysqlPacket(packet, "utf8")))
        for i, conv in convs:
            if row[i] is not None:
                row[i] = conv(row[i])
        return dict(zip(names, row, strict=True))

    return RawRows(plan.event, decode)


def row_packets(conn: Any, result: Any) -> Iterator[bytes]:
    """The row packets of ``result``, pymysql's unbuffered result on ``conn`` (its descriptions
    read), until its end: what ``SSCursor.fetchmany`` reads, without turning them into values."""
    read = conn._read_packet
    while True:
        packet = read()
        if result._check_packet_is_eof(packet):
            result.unbuffered_active = False
            result.connection = None
            return
        yield packet.get_all_data()


__all__ = ["row_packets", "text_kind", "text_rows"]
