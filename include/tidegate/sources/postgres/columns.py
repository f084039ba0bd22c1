"""Schema changes of a PostgreSQL table, noticed from the rows (wal2json carries no DDL).

Every row wal2json writes lists its columns with their names and types. A table's *column
set* changes when a row's columns differ from the last set seen for the table (ADD COLUMN,
DROP COLUMN, a type change, a rename); :class:`ColumnTracker` notices it and the reader emits
a ``schema_change`` control message (``change: "columns"``) just before that row, inside the
row's transaction. ``TRUNCATE`` (wal2json's ``T``) is a ``change: "truncate"`` message where
it sits.

Which rows tell the column set:

* an INSERT lists every column: its set is the table's;
* an UPDATE's new tuple leaves out the unchanged TOAST values, so a column missing from it is
  not taken as dropped when its type can be TOASTed (any variable-length type), unless the
  old tuple is a whole row (``REPLICA IDENTITY FULL``) that lacks it too; a column of a
  fixed-length type cannot be left out, so its absence is a drop. A new column, or a known
  one with another type, is a change whatever the row;
* a DELETE (only the old key, or the old row) is not looked at.

So a dropped variable-length column that only UPDATEs follow shows at the table's next
INSERT (or the next UPDATE that proves it). A table the pipeline has never seen gets its
first set from an INSERT (or an UPDATE with a whole old row) and no message.

Remembered between runs: each new set is recorded in the checkpoint store with the end of the
transaction where it was first seen (:meth:`Columns.record`), and a read
from ``start`` begins with, per table, the last set recorded at or before ``start``. A change
whose rows come in a later run than the DDL is noticed, and a replay of a range notices the
same changes at the same rows, with the same ids, as the first read did.
"""

from __future__ import annotations

from typing import Any, Protocol

from ...errors import IncomparablePositionsError
from ...events import ControlMessage
from ...store.base import CheckpointStore
from .position import PgPosition

Signature = tuple[tuple[str, str], ...]  # ((name, type), ...) in column order

# Types whose values have a fixed length: never TOASTed, so never left out of an UPDATE.
FIXED_LENGTH_TYPES = frozenset({
    "smallint", "integer", "bigint", "boolean", "real", "double precision", "date", "uuid", "oid",
    "money", '"char"', "interval", "macaddr", "macaddr8", "pg_lsn", "xid", "cid", "tid", "point",
    "time without time zone", "time with time zone", "timestamp without time zone",
    "timestamp with time zone"})
_FIXED_PREFIXES = ("timestamp(", "time(", "interval(")


def may_be_left_out(typ: str) -> bool:
    """Whether an UPDATE's new tuple may leave a column of this type out (an unchanged TOAST
    value): every variable-length type may."""
    return typ not in FIXED_LENGTH_TYPES and not typ.startswith(_FIXED_PREFIXES)


def as_json(sig: Signature) -> list[dict[str, str]]:
    return [{"name": n, "type": t} for n, t in sig]


class Memory(Protocol):
    """Where a tracker keeps column sets between reads."""

    def sets(self, schema: str, table: str) -> list[tuple[PgPosition, Signature]]: ...

    def record(self, schema: str, table: str, position: PgPosition, sig: Signature) -> None: ...


class StoreMemory:
    """Column sets in the checkpoint store (loaded once per source)."""

    def __init__(self, store: CheckpointStore, pipeline: str):
        self.store = store
        self.pipeline = pipeline
        self._sets: dict[tuple[str, str], list[tuple[PgPosition, Signature]]] | None = None

    def _load(self) -> dict[tuple[str, str], list[tuple[PgPosition, Signature]]]:
        if self._sets is None:
            self._sets = {}
            for rec in self.store.columns.all(self.pipeline):
                sig = tuple((c["name"], c["type"]) for c in rec.columns)
                self._sets.setdefault((rec.schema, rec.table), []).append((rec.position, sig))
        return self._sets

    def sets(self, schema: str, table: str) -> list[tuple[PgPosition, Signature]]:
        return self._load().get((schema, table), [])

    def record(self, schema: str, table: str, position: PgPosition, sig: Signature) -> None:
        self.store.columns.record(self.pipeline, schema, table, position, as_json(sig))
        self._load().setdefault((schema, table), []).append((position, sig))


class LocalMemory:
    """Column sets kept in the process only (a source without the store)."""

    def __init__(self) -> None:
        self._sets: dict[tuple[str, str], list[tuple[PgPosition, Signature]]] = {}

    def sets(self, schema: str, table: str) -> list[tuple[PgPosition, Signature]]:
        return self._sets.get((schema, table), [])

    def record(self, schema: str, table: str, position: PgPosition, sig: Signature) -> None:
        self._sets.setdefault((schema, table), []).append((position, sig))


def known_at(sets: list[tuple[PgPosition, Signature]], start: PgPosition) -> Signature | None:
    """The last set recorded at or before ``start`` (positions of another cluster or timeline
    say nothing about this log and are passed over)."""
    best: tuple[PgPosition, Signature] | None = None
    for position, sig in sets:
        try:
            if position <= start and (best is None or position > best[0]):
                best = (position, sig)
        except IncomparablePositionsError:
            continue
    return None if best is None else best[1]


class ColumnTracker:
    """The column sets of one read, from ``start``; see the module docstring."""

    def __init__(self, memory: Memory, start: PgPosition, tenant: str, pipeline: str):
        self.memory = memory
        self.start = start
        self.tenant = tenant
        self.pipeline = pipeline
        self.current: dict[tuple[str, str], Signature | None] = {}

    def known(self, schema: str, table: str) -> Signature | None:
        key = (schema, table)
        if key not in self.current:
            self.current[key] = known_at(self.memory.sets(schema, table), self.start)
        return self.current[key]

    def names(self, schema: str, table: str) -> list[str] | None:
        """The table's column names as of the row being read, when known: what an UPDATE that
        left unchanged TOAST values out really holds (the catalog holds today's columns)."""
        known = self.known(schema, table)
        return None if known is None else [n for n, _ in known]

    def observe(self, schema: str, table: str, op: str, new: Signature, old: Signature | None,
                end: PgPosition) -> tuple[Signature, Signature] | None:
        """A row of ``op`` (``c`` or ``u``) whose new tuple has the columns ``new`` (and old tuple
        ``old``) in the transaction ending at ``end``: (previous set, new set) when it shows a
        change of the table's column set, else None. New sets are remembered."""
        known = self.known(schema, table)
        if known == new:
            return None
        if known is None:  # the first row of a table the pipeline has not seen
            first = new if op == "c" else (old if old is not None and _covers(old, new) else None)
            if first is not None:
                self._remember(schema, table, end, first)
            return None
        changed = _changed(known, new, old) if op == "u" else new
        if changed is None:
            return None
        self._remember(schema, table, end, changed)
        return known, changed

    def _remember(self, schema: str, table: str, end: PgPosition, sig: Signature) -> None:
        self.current[(schema, table)] = sig
        self.memory.record(schema, table, end, sig)

    # A message carries the end of its transaction even when a row follows it there: a halt
    # before it (on_schema_change: halt) names where the change is committed.

    def columns_message(self, schema: str, table: str, change: tuple[Signature, Signature], *,
                        event_id: str, position: dict[str, Any], ts_ms: int, tx_id: str,
                        end: PgPosition | None = None) -> ControlMessage:
        before, after = change
        return ControlMessage(self.tenant, self.pipeline, "schema_change", event_id, position, ts_ms,
                              {"change": "columns", "db": schema, "schema": schema, "table": table,
                               "columns": as_json(after), "previous_columns": as_json(before)},
                              tx_id=tx_id, end_position=end)

    def truncate_message(self, schema: str, table: str, *, lsn: str, position: dict[str, Any],
                         ts_ms: int, tx_id: str, end: PgPosition | None = None,
                         commit_us: int | None = None) -> ControlMessage:
        known = self.known(schema, table)
        return ControlMessage(self.tenant, self.pipeline, "schema_change", f"{lsn}:truncate:{schema}.{table}",
                              position, ts_ms,
                              {"change": "truncate", "db": schema, "schema": schema, "table": table,
                               "columns": as_json(known) if known is not None else None},
                              tx_id=tx_id, end_position=end, commit_us=commit_us)


def _covers(old: Signature, new: Signature) -> bool:
    names = {n for n, _ in old}
    return all(n in names for n, _ in new)


def _dropped(known: Signature, new: Signature, old: Signature | None) -> set[str]:
    """The known columns an UPDATE's tuples show to be gone: missing from the new tuple and
    either of a fixed-length type or missing from a whole old row too (the old tuple holds
    every column of the new one: REPLICA IDENTITY FULL)."""
    present = {n for n, _ in new}
    whole_old = {n for n, _ in old} if old is not None and _covers(old, new) else None
    return {n for n, t in known if n not in present
            and (not may_be_left_out(t) or (whole_old is not None and n not in whole_old))}


def _changed(known: Signature, new: Signature, old: Signature | None) -> Signature | None:
    """An UPDATE's new tuple against the known set: the new set, or None when the difference is
    only unchanged TOAST values left out."""
    types = dict(known)
    grown = any(n not in types or types[n] != t for n, t in new)  # a new column, another type
    dropped = _dropped(known, new, old)
    if not grown and not dropped:
        return None
    return _merge(known, new, dropped)


def _merge(known: Signature, new: Signature, dropped: set[str]) -> Signature:
    """The set after an UPDATE that changed it: its new tuple's columns, plus the known ones it
    left out that are not ``dropped``, each placed after the column it followed."""
    present = {n for n, _ in new}
    out = list(new)
    prev: str | None = None
    for n, t in known:
        if n in present:
            prev = n
            continue
        if n in dropped:
            continue
        at = 0 if prev is None else next((i + 1 for i, (m, _) in enumerate(out) if m == prev), len(out))
        out.insert(at, (n, t))
        prev = n
    return tuple(out)
