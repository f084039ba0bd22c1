"""Snapshot chunk rows written to events by the compiled path (docs/architecture.md, "The
compiled hot path"): what the source kinds share. A kind's reads give a chunk's rows raw (MySQL:
the server's row packets, sources/mysql/snapshot_rows.py; PostgreSQL: its output text per
column, sources/postgres/snapshot.py) and a :class:`RawRows` for them, which writes each row's
``op: r`` event with ``rowcodec.TextRowPlan``, the bytes ``snapshot.RowEvents`` writes from
the row's values, or decodes the row for that Python path where the compiled one would write it
differently.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import orjson

from ..events import ChangeEvent, idempotency_key
from ..native import rowcodec
from ..shipped import ShippedEvent


class RawRows(NamedTuple):
    """The compiled events of one chunk's raw rows: ``event(row, last, n)`` gives a row's event
    or None (a ``TextRowPlan``'s entry point), ``decode(row)`` the row as the Python path's values
    (a dict of the column names)."""

    event: Callable[[Any, bool, int], ChangeEvent | None]
    decode: Callable[[Any], dict]


def compiled_plan(build: Any, names: Sequence[str], kinds: Sequence[str | None]) -> Any:
    """``rowcodec.TextRowPlan`` for a chunk read by ``build`` (a ``snapshot.RowEvents``) with
    columns ``names`` of compiled ``kinds``; None where the Python path reads the chunk: the
    module is not built, the table has column rules (they rewrite values), or a column's kind is
    not compiled (None)."""
    if rowcodec is None or build.transform is not None or None in kinds:
        return None
    table = build.table
    pk = [list(names).index(c) for c in table.key]
    pk_sorted = sorted(pk, key=lambda i: names[i])
    return rowcodec.TextRowPlan(
        [rowcodec.TEXT_KINDS[k] for k in kinds], [orjson.dumps(n) + b":" for n in names], pk, pk_sorted,
        *envelope_parts(build),
        ShippedEvent, {"op": "r", "db": table.db, "schema": table.schema, "table": table.table,
                       "tx_id": build.tx_id, "tx_end": False, "end_position": None, "commit_us": None})


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


__all__ = ["RawRows", "compiled_plan", "envelope_parts"]
