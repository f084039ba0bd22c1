"""Source items carried between processes as flat rows (a Spark task to the driver, a reader
process to the run's process), and rebuilt without parsing the envelope again.

A change event travels as the bytes a run sends (``ChangeEvent.value``, ``key_bytes``) and the
few fields the coordinator, the batching and the sinks read beside them (:data:`ROW_FIELDS`);
the receiving side rebuilds it as a :class:`ShippedEvent`, which parses the envelope only if
something asks for a field that did not travel (``before``, ``after``, ...). Position marks
travel as their position; control messages, rare and small, travel whole (pickled).

Spark tasks ship rows. A reader process ships a batch as one message (:func:`pack`): packed
where the compiled path is built (the events' bytes in one bytes object, see
``tidegate.native.rowcodec.pack_items``), rows where it is not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from .events import ChangeEvent, ControlMessage, PositionMark, cached, filled, is_control
from .native import rowcodec

# What one event carries to the run's process, in this order (a "mark" row carries only
# its position). Everything the coordinator, the batching and the sinks read.
ROW_FIELDS = ("value", "key_bytes", "idempotency_key", "op", "db", "schema", "table", "tx_id",
              "tx_end", "end_position", "headers", "commit_us")


def item_to_row(item: ChangeEvent | ControlMessage | PositionMark) -> tuple:
    """A source item as a flat row: the serialized envelope and the fields read beside it (a
    control message, rare and small, travels whole)."""
    if isinstance(item, PositionMark):
        return ("mark", item.position)
    if is_control(item):
        return ("control", item)
    return ("event", item.value, item.key_bytes, item.idempotency_key, item.op, item.db, item.schema,
            item.table, item.tx_id, item.tx_end, item.end_position, item.headers, item.commit_us)


def items_to_rows(items: list) -> list[tuple]:
    """``[item_to_row(item) for item in items]``, through the compiled loop where it is built
    (tidegate.native)."""
    if rowcodec is None:
        return [item_to_row(item) for item in items]
    return rowcodec.rows_from_items(items, ShippedEvent, item_to_row)


def row_to_item(row: tuple) -> ChangeEvent | ControlMessage | PositionMark:
    if row[0] == "mark":
        return PositionMark(row[1])
    if row[0] == "control":
        return row[1]
    return ShippedEvent.from_row(row)


def rows_to_items(rows: list[tuple]) -> list[ChangeEvent | ControlMessage | PositionMark]:
    """``[row_to_item(row) for row in rows]``, through the compiled loop where it is built
    (tidegate.native)."""
    if rowcodec is None:
        return [row_to_item(row) for row in rows]
    return rowcodec.events_from_rows(rows, ShippedEvent, row_to_item)


def pack(items: list) -> tuple:
    """A batch of items as the message a reader process sends: packed (one bytes object for the
    events' bytes and keys, see tidegate.native.rowcodec) where the compiled path is built, else
    rows. :func:`unpack` gives the items back."""
    if rowcodec is None:
        return ("rows", items_to_rows(items))
    return ("packed", *rowcodec.pack_items(items, ShippedEvent, item_to_row))


def unpack(message: tuple) -> list[ChangeEvent | ControlMessage | PositionMark]:
    if message[0] == "rows":
        return rows_to_items(message[1])
    if rowcodec is None:
        raise RuntimeError("a packed batch needs tidegate.native.rowcodec, which this process "
                           "did not load (TIDEGATE_NATIVE=0 on one side only?)")
    _, blob, metas, others = message
    return rowcodec.unpack_items(blob, metas, others, ShippedEvent, row_to_item)


def _from_envelope(read: Callable[[dict], Any]) -> cached:
    """A field of a :class:`ShippedEvent` that did not travel: read from the envelope on first use."""
    return cached(lambda ev: read(ev._env))


class ShippedEvent(ChangeEvent):
    """A :class:`ChangeEvent` rebuilt on the driver from a task's row: the fields of
    :data:`ROW_FIELDS` are set, ``value`` is the task's bytes, and every other field is parsed
    from ``value`` only when read (the sinks and the coordinator never read them)."""

    tenant = _from_envelope(lambda env: env["idempotency_key"].partition("|")[0])
    pipeline = _from_envelope(lambda env: env["source"]["pipeline"])
    connector = _from_envelope(lambda env: env["source"]["connector"])
    before = _from_envelope(lambda env: env["before"])
    after = _from_envelope(lambda env: env["after"])
    key = _from_envelope(lambda env: env["key"])
    event_id = _from_envelope(lambda env: env["idempotency_key"].rsplit("|", 1)[1])
    position = _from_envelope(lambda env: env["source"]["position"])
    ts_ms = _from_envelope(lambda env: env["source"]["ts_ms"])
    total_order = _from_envelope(lambda env: env["transaction"]["total_order"])
    data_collection_order = _from_envelope(lambda env: env["transaction"]["data_collection_order"])
    snapshot = _from_envelope(lambda env: env["source"]["snapshot"])
    id = _from_envelope(lambda env: env["id"])

    @classmethod
    def from_row(cls, row: tuple) -> ShippedEvent:
        (_, value, key_bytes, ikey, op, db, schema, table, tx_id, tx_end, end_position, headers,
         commit_us) = row
        fields = {"value": value, "key_bytes": key_bytes, "idempotency_key": ikey, "op": op, "db": db,
                  "schema": schema, "table": table, "tx_id": tx_id, "tx_end": tx_end,
                  "end_position": end_position, "commit_us": commit_us}
        if headers:
            fields["headers"] = headers
        return filled(cls, fields)

    @cached
    def _env(self) -> dict:
        """The envelope, parsed once: only when a field that did not travel is read."""
        return orjson.loads(self.value)
