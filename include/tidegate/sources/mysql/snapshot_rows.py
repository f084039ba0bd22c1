"""A snapshot chunk's rows straight from the server's row packets to events (docs/performance.md,
"Snapshots beside Debezium").

pymysql turns each value of a row into a Python object (an int, a Decimal, a datetime) and
``snapshots.RowEvents`` turns those into the envelope's JSON: two passes per column in Python,
most of a chunk read's CPU. Where the compiled path is built (tidegate.native), a chunk of a
table whose columns are all of the kinds in :func:`text_kind` is read as raw row packets
instead, and ``rowcodec.TextRowPlan`` writes each row's event from the packet's text, the same
bytes the Python path gives (tests/unit/test_snapshot_rows.py and
tests/integration/test_snapshot_sources.py compare them). A row it does not write the same way
(text that is not UTF-8, a ZEROFILL number, a negative zero) is decoded by pymysql and built by
the Python path, as every row of a table with another column kind is, or of a table with column
rules (``filters``), which are applied to values.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import orjson
import pymysql.protocol

from ...events import ChangeEvent, idempotency_key
from ...native import rowcodec
from ...shipped import ShippedEvent

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


class TextRows:
    """The compiled events of one chunk's row packets (the module docstring): :meth:`event`
    gives a row's event or None, :meth:`decode` the row as pymysql's values for the Python path."""

    def __init__(self, plan: Any, result: Any, names: Sequence[str], convs: Sequence[tuple[int, Any]]):
        self.plan, self.result, self.names, self.convs = plan, result, list(names), list(convs)

    def event(self, packet: bytes, last: bool, n: int) -> ChangeEvent | None:
        return self.plan.event(packet, last, n)

    def decode(self, packet: bytes) -> dict[str, Any]:
        row = list(self.result._read_row_from_packet(pymysql.protocol.MysqlPacket(packet, "utf8")))
        for i, conv in self.convs:
            if row[i] is not None:
                row[i] = conv(row[i])
        return dict(zip(self.names, row, strict=True))


def text_rows(build: Any, result: Any, columns: Sequence[tuple[str, str]],
              convs: Sequence[tuple[int, Any]]) -> TextRows | None:
    """The compiled events for a chunk read by ``build`` (a ``snapshots.RowEvents``) whose
    result set is ``result`` (pymysql's, its descriptions read) and whose columns are
    ``columns`` (name, DATA_TYPE); None where the Python path reads it."""
    if rowcodec is None or build.transform is not None:
        return None
    kinds = [text_kind(data_type, encoding)
             for (_, data_type), (encoding, _) in zip(columns, result.converters, strict=True)]
    if None in kinds:
        return None
    names = [name for name, _ in columns]
    table = build.table
    pk = [names.index(c) for c in table.key]
    pk_sorted = sorted(pk, key=lambda i: names[i])
    plan = rowcodec.TextRowPlan(
        [rowcodec.TEXT_KINDS[k] for k in kinds], [orjson.dumps(n) + b":" for n in names], pk, pk_sorted,
        *envelope_parts(build),
        ShippedEvent, {"op": "r", "db": table.db, "schema": table.schema, "table": table.table,
                       "tx_id": build.tx_id, "tx_end": False, "end_position": None, "commit_us": None})
    return TextRows(plan, result, names, convs)


def envelope_parts(build: Any) -> tuple[bytes, bytes, bytes, bytes]:
    """The fixed parts of a chunk's envelopes, as ``ChangeEvent.envelope`` orders them: the
    idempotency key up to the key's JSON, the source block up to the snapshot mark's text, the
    transaction block up to its total order, and the end."""
    spec, t = build.spec, build.table
    ikey = idempotency_key(spec.tenant, spec.pipeline, t.db, t.table, build.tx_id, "").encode("utf-8")
    source = orjson.dumps({"connector": build.connector, "pipeline": spec.pipeline, "db": t.db,
                           "schema": t.schema, "table": t.table, "tx_id": build.tx_id,
                           "position": build.position, "ts_ms": build.ts_ms})
    source_head = b',"source":' + source[:-1] + b',"snapshot":"'
    tx_head = b'"},"transaction":{"id":' + orjson.dumps(build.tx_id) + b',"total_order":'
    tail = b'},"ts_ms":' + orjson.dumps(build.ts_ms) + b"}"
    return ikey, source_head, tx_head, tail


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


__all__ = ["TextRows", "envelope_parts", "row_packets", "text_kind", "text_rows"]
