"""A chunk read as row events (``op: "r"``), the keys the log changes after the handoff left to
the log, and the chunk's end (the package docstring has the method)."""


from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from ..events import (
    ChangeEvent,
    PositionMark,
    encode_row,
    key_json_bytes,
    orjson_formats_like_stdlib,
)
from ..filters import ColumnFilters
from ..positions import Position, SnapshotPosition
from ..sources.base import SnapshotTable, Source, SourceItem
from ..spec import PipelineSpec
from ..store.base import CheckpointStore
from ..store.records import SnapshotRecord

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

@dataclasses.dataclass(frozen=True)
class ChunkRead:
    """A chunk as read: its row events, and ``upper``, a log position at or after every change
    the rows show (the log head read just after the read's view was taken)."""

    upper: Position
    events: Iterable[ChangeEvent]




# --------------------------------------------------------------------------- reading


def chunk_table(rec: SnapshotRecord, chunk: int) -> SnapshotTable:
    return SnapshotTable.from_json(rec.tables[rec.chunks[chunk - 1]["table"]])


class ChangedKeys:
    """The keys of a snapshot's tables that the log changes after the handoff, each with where
    the log first changes it (the end of that transaction), scanned up to the highest upper
    bound of the chunks read so far; and a chunk's rows of the keys changed up to its own upper
    bound, dropped.

    Why (docs/architecture.md, "Snapshots"): a chunk row shows its key as of the chunk's read,
    somewhere between the handoff and the chunk's upper bound. If the log changes the key in that
    stretch, the row may be newer than some of the log events that follow it, and a consumer
    would see the key go back in time; the log alone then carries the key (every change after
    the handoff is in it, each with the full row). A key the log does not change up to the upper
    bound is exactly the row, and every later change of it follows the row. Deciding by the
    chunk's own upper bound (not by how far the scan went for other chunks) makes a read give
    the same events whichever run, and in whichever order, the chunks are read
    (tidegate.snapshot.kept)."""

    def __init__(self, rec: SnapshotRecord, source: Source):
        self.source = source
        self.key_columns = {(t["schema"], t["table"]): list(t["key"]) for t in rec.tables}
        self.keys: dict[tuple[str, str], dict[bytes, Position]] = {}
        self.scanned: Position = rec.handoff
        self.dropped = 0

    def scan_to(self, upper: Position) -> None:
        if not upper > self.scanned:
            return
        pending: list[tuple[tuple[str, str], bytes]] = []  # the keys of the transaction read so far
        for item in self.source.read(self.scanned, upper):
            if not isinstance(item, ChangeEvent):
                continue
            name = (item.schema, item.table)
            cols = self.key_columns.get(name)
            if cols is not None:
                pending.append((name, bytes(item.key_bytes)))
                if item.op == "u" and item.before:  # a key change: the old key changed too
                    pending.append((name, key_json_bytes({c: item.before.get(c) for c in cols})))
            if item.tx_end:
                self._changed_at(pending, item.end_position or upper)
                pending = []
        self._changed_at(pending, upper)
        self.scanned = upper

    def _changed_at(self, keys: list[tuple[tuple[str, str], bytes]], at: Position) -> None:
        for name, key in keys:
            self.keys.setdefault(name, {}).setdefault(key, at)

    def drop_changed(self, table: SnapshotTable, events: Iterable[ChangeEvent],
                     upper: Position) -> Iterator[ChangeEvent]:
        """``events`` (a chunk read with upper bound ``upper``, scanned to) without the rows of
        keys the log changes at or before ``upper``."""
        changed = self.keys.get((table.schema, table.table))
        if not changed:
            yield from events
            return
        held: ChangeEvent | None = None
        for ev in events:
            at = changed.get(bytes(ev.key_bytes))
            if at is not None and not upper < at:
                self.dropped += 1
                if ev.snapshot == "last" and held is not None:
                    held = marked(held, "last")  # the table's last row moves to the row before
                continue
            if held is not None:
                yield held
            held = ev
        if held is not None:
            yield held


def marked(ev: ChangeEvent, mark: str) -> ChangeEvent:
    """``ev`` with another ``source.snapshot`` mark (a new event: its envelope serialized anew)."""
    env = orjson.loads(ev.value) if ev.after is None else {"after": ev.after, "key": ev.key}
    # A plain ChangeEvent: a row rebuilt from its shipped form reads its fields from its bytes,
    # and the new event's bytes are made from its fields.
    fields = {f.name: getattr(ev, f.name) for f in dataclasses.fields(ChangeEvent) if f.init}
    return ChangeEvent(**{**fields, "snapshot": mark, "after": env["after"], "key": env["key"]})


def end_chunk(events: Iterable[ChangeEvent], end: SnapshotPosition, store: CheckpointStore,
              rec: SnapshotRecord, chunk: int) -> Iterator[SourceItem]:
    """A chunk's rows as one transaction ending at ``end`` (an empty chunk: a position mark)."""
    held: ChangeEvent | None = None
    n = 0
    for ev in events:
        if held is not None:
            yield held
        held, n = ev, n + 1
    store.snapshots.record_chunk_rows(rec.pipeline, rec.snapshot_id, chunk, n)
    if held is None:
        yield PositionMark(end)
    else:
        yield held.ending(end)


def read_chunk(spec: PipelineSpec, source: Source, rec: SnapshotRecord, chunk: int,
               connector: str | None = None) -> ChunkRead:
    """One chunk (1-based): its upper bound and its row events, in key order; the last row of
    a table's last chunk is marked ``"last"``."""
    c = rec.chunks[chunk - 1]
    table = chunk_table(rec, chunk)
    build = RowEvents(spec, rec, table, chunk, connector or source.connector, source.column_filters)
    upper, rows = source.snapshots().chunk_rows(table, c["lo"], c["hi"], build)
    return ChunkRead(upper, _marked_rows(rows, build, final=c["hi"] is None))


def _marked_rows(rows: Iterable[Mapping[str, Any]], build: RowEvents, final: bool) -> Iterator[ChangeEvent]:
    held: Mapping[str, Any] | None = None
    for row in rows:
        if held is not None:
            yield build(held, "true")
        held = row
    if held is not None:
        yield build(held, "last" if final else "true")


class RowEvents:
    """Builds the ``op: r`` event of a row of one chunk (see the module docstring)."""

    def __init__(self, spec: PipelineSpec, rec: SnapshotRecord, table: SnapshotTable, chunk: int,
                 connector: str, column_filters: ColumnFilters | None = None):
        self.spec, self.table, self.connector = spec, table, connector
        # the table's column rules, applied to each row as it is read (filters.py), as the
        # source's reads apply them to log events: same value, same hash
        self.transform = column_filters.for_table(table.schema, table.table) if column_filters else None
        if self.transform is not None:
            self.transform.check_key(table.key)
        self.tx_id = f"snapshot:{rec.snapshot_id}"
        self.position = {"snapshot": rec.snapshot_id, "chunk": chunk}
        self.ts_ms = rec.ts_ms
        self.n = 0
        # a source's compiled path for its raw rows (SnapshotReads.chunk_rows), if it gives them
        self.raw: Any = None

    def __call__(self, row: Mapping[str, Any] | Any, mark: str) -> ChangeEvent:
        if self.raw is not None and row.__class__ is not dict:  # a raw row: the compiled path writes it
            ev = self.raw.event(row, mark == "last", self.n + 1)
            if ev is not None:
                self.n += 1
                return ev
            row = self.raw.decode(row)
        after = encode_row(row)
        if self.transform is not None:
            after = self.transform.row(after)
        key = {c: after[c] for c in self.table.key}
        self.n += 1
        t, spec = self.table, self.spec
        # One pass over the row's floats serves the key (its values are the row's), the position
        # (a string and an int) and the envelope: each would otherwise search them again.
        floats_ok = row_floats_like_stdlib(after)
        return ChangeEvent.native(spec.tenant, spec.pipeline, self.connector, t.db, t.schema, t.table, "r",
                                  None, after, key, self.tx_id, key_json(key, floats_ok), self.position,
                                  self.ts_ms, self.n, self.n, mark, floats_checked=floats_ok)


def row_floats_like_stdlib(row: Mapping[str, Any]) -> bool:
    """:func:`~tidegate.events.orjson_formats_like_stdlib` of a row, in one flat pass: its
    values are scalars but for JSON, array and SET columns, which are searched in depth."""
    for v in row.values():
        t = type(v)
        if t is float:
            if not (v == 0.0 or 1e-4 <= abs(v) < 1e16):  # also False for NaN and the infinities
                return False
        elif t is not str and t is not int and t is not bool and v is not None \
                and not orjson_formats_like_stdlib(v):
            return False
    return True


def key_json(key: Mapping[str, Any], floats_ok: bool | None = None) -> str:
    """The primary key's JSON (key column order), the same bytes the stdlib would write.
    ``floats_ok``: the caller already knows whether orjson writes the key's floats as the stdlib."""
    if floats_ok if floats_ok is not None else orjson_formats_like_stdlib(key):
        try:
            return orjson.dumps(key).decode("utf-8")
        except TypeError:
            pass
    return json.dumps(key, ensure_ascii=False, separators=(",", ":"))


