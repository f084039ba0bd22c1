"""The source interface: everything the engine, the guards and the Spark job ask of a source.

MySQL/MariaDB (binlog) and Postgres (logical decoding) implement it; nothing outside this package
switches on the source kind or probes for optional methods.

``read(start, upto)`` yields, in source order, :class:`ChangeEvent` rows, ``schema_change``
:class:`ControlMessage` items where the log changes a captured table's definition (inside the
transaction that changes it, like a row; the last item of each transaction has
``tx_end=True`` and ``end_position``) and :class:`PositionMark` records for ranges with
nothing to deliver. It covers exactly the transactions that commit after
``start`` and at or before ``upto``, never blocks waiting for new changes, and streams in
bounded memory. When the range is exhausted it yields a final ``PositionMark(upto)`` if the
last transaction ended before ``upto``, so checkpoints can reach the run's upper bound.

Continuity (docs/architecture.md, "Continuity"): :meth:`Source.check_retention` raises a
:class:`~tidegate.errors.ChangesLostError` when the log no longer holds what a checkpoint
needs; :meth:`Source.restart_stream` makes the log readable again after an operator accepted
such a loss; :meth:`Source.translate` places a checkpoint of another server of
the same replication topology on this one (only where :attr:`Source.translates_positions`).

Snapshots (docs/architecture.md, "Snapshots"): :meth:`Source.snapshot_tables` names the tables
and their primary keys, :meth:`Source.chunk_plan` cuts a table into primary-key chunks and
:meth:`Source.read_chunk` reads one chunk, each in its own short transaction and without
locking the table, as rows whose values have the JSON form of the same columns in log events.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import CannotTranslateError, SnapshotError
from ..events import ChangeEvent, ControlMessage, PositionMark
from ..filters import ColumnFilters, catalog_problems, filter_items, is_pattern
from ..positions import Position
from ..store.base import CheckpointStore
from ..store.records import CheckpointRecord
from .preflight import ERROR, WARNING, Problem

if TYPE_CHECKING:
    from ..connections import Connection
    from ..spec import PipelineSpec

SourceItem = ChangeEvent | ControlMessage | PositionMark
# A chunk bound: the primary key's values in key order, JSON-safe (None: unbounded).
ChunkBound = list | None


@dataclass(frozen=True)
class SnapshotTable:
    """A table a snapshot reads: where it lives and its primary key columns, in key order."""

    db: str
    schema: str
    table: str
    key: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"

    def to_json(self) -> dict[str, Any]:
        return {"db": self.db, "schema": self.schema, "table": self.table, "key": list(self.key)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SnapshotTable:
        return cls(d["db"], d["schema"], d["table"], tuple(d["key"]))


def snapshot_tables_of(pipeline: str, captured: Sequence[str] | None, existing: set[str],
                       tables: Sequence[str] | None, primary_key: Callable[[str, str], list[str]],
                       missing_hint: str) -> list[SnapshotTable]:
    """The :class:`SnapshotTable` of each table a snapshot reads (:func:`choose_tables`), given
    the tables that exist and how to look up a table's primary key columns (in key order).
    A table that does not exist, or has no primary key, is refused by name."""
    names = choose_tables(pipeline, captured, sorted(existing), tables)
    missing = [n for n in names if n not in existing]
    if missing:
        raise SnapshotError(f"pipeline {pipeline!r}: cannot snapshot {', '.join(missing)}: {missing_hint}")
    out = []
    for name in names:
        db, table = name.split(".", 1)
        key = primary_key(db, table)
        if not key:
            raise SnapshotError(
                f"pipeline {pipeline!r}: table {name} has no primary key, and a snapshot reads tables in "
                f"primary-key chunks: add one (ALTER TABLE {name} ADD PRIMARY KEY (...)), or leave {name} "
                f"out of source.tables / the tables param")
        out.append(SnapshotTable(db, db, table, tuple(key)))
    return out


def choose_tables(pipeline: str, captured: Sequence[str] | None, existing: Sequence[str],
            tables: Sequence[str] | None) -> list[str]:
    """The tables to snapshot: ``tables`` (each captured), else the captured ones (spec order; the
    existing tables patterns capture, sorted), else every existing table. ``captured`` None: no
    table filter; an empty list: a filter that captures none of the existing tables."""
    if not tables:
        return list(captured) if captured is not None else list(existing)
    if captured is not None:
        foreign = [t for t in tables if t not in captured]
        if foreign:
            raise SnapshotError(f"pipeline {pipeline!r} does not capture {', '.join(foreign)}: the tables "
                                f"param names tables of source.tables ({', '.join(captured)})")
    return list(tables)


class SnapshotReads(abc.ABC):
    """What a source gives a snapshot (docs/architecture.md, "Snapshots"): the tables it reads,
    each cut into primary-key ranges, a range's rows with the log position they show, and where
    the log takes over. ``source``: the source they read. A source kind implements
    :meth:`read_chunk` or :meth:`open_chunk` (each default is made of the other)."""

    def __init__(self, source: Source):
        self.source = source

    @abc.abstractmethod
    def tables(self, tables: Sequence[str] | None = None) -> list[SnapshotTable]:
        """The tables a snapshot reads, in a stable order: ``tables`` (names as in the spec's
        ``source.tables``; each must be captured), or every captured table. Raises
        :class:`~tidegate.errors.SnapshotError` naming a table that has no primary key or does
        not exist."""

    @abc.abstractmethod
    def chunk_plan(self, table: SnapshotTable, chunk_rows: int) -> list[tuple[ChunkBound, ChunkBound]]:
        """The table cut into primary-key ranges ``(lo, hi]`` of at most ``chunk_rows`` rows (as
        the table is now), in key order; the first ``lo`` and the last ``hi`` are None, so the
        ranges cover every key, also keys inserted later."""

    def read_chunk(self, table: SnapshotTable, lo: ChunkBound, hi: ChunkBound) -> Iterator[dict[str, Any]]:
        """The rows whose key lies in ``(lo, hi]``, in key order, read in one short transaction
        without locks; values have the JSON form log events give the same columns."""
        return self.open_chunk(table, lo, hi)[1]

    def open_chunk(self, table: SnapshotTable, lo: ChunkBound, hi: ChunkBound
                   ) -> tuple[Position, Iterator[dict[str, Any]]]:
        """:meth:`read_chunk` with its upper bound: ``(upper, rows)`` where every change the rows
        show is at or before ``upper`` in the log (docs/architecture.md, "Snapshots"). Sources
        read the log head just after the read's view is taken and stream the rows; this
        default reads the rows first and the head after them."""
        rows = list(self.read_chunk(table, lo, hi))
        return self.source.head(), iter(rows)

    def chunk_rows(self, table: SnapshotTable, lo: ChunkBound, hi: ChunkBound, build: Any
                   ) -> tuple[Position, Iterator[Any]]:
        """:meth:`open_chunk` for ``build`` (a ``snapshot.RowEvents``), which turns each row
        into its event: a source with a compiled path may give raw rows and set ``build.raw``,
        which turns those into events (sources/mysql/snapshot_rows.py)."""
        return self.open_chunk(table, lo, hi)

    def handoff(self, at: Position) -> Position:
        """Where the log takes over from a snapshot planned at ``at``: a position at or before
        ``at`` such that every change logged at or before it is visible to every chunk read
        from now on. A change can be in the log before it is visible (a commit waiting for a
        semi-synchronous or synchronous replica); such a change must come from the log.
        Default: ``at`` (a source whose commits are visible when logged)."""
        return at


class Source(abc.ABC):
    kind: str = ""
    connector: str = ""  # the envelope's source.connector ("mysql", "postgresql")
    # Whether a checkpoint taken on another server can be placed on this one by its GTID set
    # (MySQL/MariaDB with GTIDs); Postgres positions never survive a change of cluster/timeline.
    translates_positions: bool = False
    # Every source is built from these two (sources.make_source): a reader process or a Spark
    # task rebuilds its own source from them, and the snapshot reads use them.
    spec: PipelineSpec
    conn: Connection
    # The salt of hashed columns (from source.hash_salt, resolved by the Parts that made the
    # source; shipped beside the connection to a reader process or a Spark task) and the column
    # rules it serves; None without rules, so reads without filters pay nothing (filters.py).
    hash_salt: bytes | None = None
    column_filters: ColumnFilters | None = None

    def use_filters(self, hash_salt: bytes | None) -> None:
        """Take the spec's column rules, with the salt of its hashed columns."""
        self.hash_salt = hash_salt
        self.column_filters = ColumnFilters.of(self.spec.source.columns, hash_salt)

    def filtered(self, items: Iterator[SourceItem]) -> Iterator[SourceItem]:
        """What a read yields, with the column rules applied (every decoder's items pass here,
        before they leave the source's process)."""
        return items if self.column_filters is None else filter_items(items, self.column_filters)

    def filter_problems(self) -> list[Problem]:
        """The filters against the server's tables (a pattern that matches nothing, a rule on a
        column a table lacks, a key column excluded); [] without filters or a catalog."""
        src = self.spec.source
        if not src.columns and not any(is_pattern(t) or t.startswith("!") for t in src.tables):
            return []
        catalog = self.table_catalog()
        if catalog is None:
            return []
        return [Problem("filters", subject, message, ERROR if error else WARNING)
                for subject, message, error in catalog_problems(src.tables, src.columns, catalog)]

    def table_catalog(self) -> dict[str, tuple[list[str], list[str]]] | None:
        """``schema.table`` -> (its columns, its primary key columns), for :meth:`filter_problems`;
        None where the source cannot list them."""
        return None

    def column_types(self) -> Any:
        """What ``envelope: debezium`` needs of the source (a
        :class:`~tidegate.debezium.envelope.SourceInfo`: the connector, the database's name,
        every table's column types as its catalog spells them); None where the source cannot say."""
        return None

    # ------------------------------------------------------------------ identity and positions

    @abc.abstractmethod
    def identity(self) -> dict[str, Any]:
        """What identifies the server (compared by the failover guard); its ``kind``, and the
        fields that make the lineage of the positions it writes."""

    @abc.abstractmethod
    def head(self) -> Position:
        """The current end of the change log: a run's upper bound."""

    @abc.abstractmethod
    def earliest(self) -> Position:
        """The earliest position the log can still be read from."""

    def log_sizes(self) -> dict[str, int] | None:
        """The size of each log segment still on the server, for lag arithmetic across
        segments (``Position.bytes_to``); None where positions need none (an LSN)."""
        return None

    # ------------------------------------------------------------------ reading

    @abc.abstractmethod
    def read(self, start: Position | None, upto: Position) -> Iterator[SourceItem]:
        """Changes committed in (start, upto], in source order."""

    def has_changes(self, start: Position | None, upto: Position) -> bool:
        """Whether (start, upto] holds anything to deliver (a row or a schema change). The head
        also moves for changes a pipeline does not carry (other tables, empty transactions, WAL
        housekeeping); a run then has nothing to deliver and need not start Spark. Default: read
        until the first such item."""
        return any(not isinstance(item, PositionMark) for item in self.read(start, upto))

    def slices(self, start: Position | None, upto: Position,
               max_bytes: int | None = None) -> list[tuple[Position | None, Position]]:
        """(start, upto] cut into ranges :meth:`read_slice` can read independently (in parallel
        Spark tasks); concatenated in order they equal :meth:`read`. ``max_bytes``: cut where
        the log allows so that slices hold about that many bytes of log at most (a reader
        that takes a slice whole, a Spark task, asks for it). Default: one slice."""
        return [(start, upto)]

    def read_slice(self, start: Position | None, end: Position, index: int = 0) -> Iterator[SourceItem]:
        """Read one slice of :meth:`slices`; ``index`` (the slice's) tells concurrent reads apart."""
        return self.read(start, end)

    # ------------------------------------------------------------------ continuity

    @abc.abstractmethod
    def check_retention(self, checkpoint: Position | None, *, first_run: bool) -> dict[str, Any]:
        """Whether the log still holds everything after ``checkpoint`` (the lowest sink
        checkpoint). Raises :class:`~tidegate.errors.ChangesLostError` (its ``kind`` names the
        incident) when it does not. On a pipeline's ``first_run`` a source may create what
        reading needs (the Postgres slot). Returns facts for the log."""

    @abc.abstractmethod
    def restart_stream(self) -> Position:
        """After an operator accepted lost changes: make the log readable again (Postgres:
        replace the slot) and return the position changes are delivered from, from now on."""

    def translate(self, checkpoint: Position) -> Position:
        """The position on this server where a checkpoint taken on another server of the same
        replication topology resumes, with nothing lost and nothing repeated. Raises
        :class:`~tidegate.errors.CannotTranslateError` (or another SourceError) when it cannot."""
        raise CannotTranslateError(f"a {self.kind} source cannot place a checkpoint of another server "
                                   f"on this one")

    def describe_change(self, old_identity: dict[str, Any]) -> str:
        """What changed behind the connection since ``old_identity``, in words an operator can
        act on."""
        return f"the source identity changed from {old_identity} to {self.identity()}"

    # ------------------------------------------------------------------ snapshots

    def snapshots(self) -> SnapshotReads:
        """The source's snapshot reads (:class:`SnapshotReads`). Raises
        :class:`~tidegate.errors.SnapshotError` for a source that cannot take snapshots."""
        raise SnapshotError(f"a {self.kind or type(self).__name__} source cannot take snapshots")

    def release(self, position: Position) -> None:  # noqa: B027 - optional hook
        """Tell the server it may recycle the log up to ``position`` (Postgres slot advance)."""

    def log_held(self) -> dict[str, Any] | None:
        """What the server keeps of its log for this pipeline (Postgres: the slot's
        ``restart_lsn`` and the WAL ``bytes`` from there to the current WAL LSN), for ``tidegate
        status``; None where the log's retention is the server's own (a binlog expiry)."""
        return None

    def log_gone_before(self, start: Position) -> str | None:
        """None when the log after ``start`` (a position of this server) can still be read;
        otherwise where the log now starts and which setting keeps more of it, in words an
        operator can act on. Asked before a replay, a backfill or a rewind reads an old range."""
        earliest = self.earliest()
        if start < earliest:
            return f"the {self.kind} source's log now starts at {earliest}"
        return None

    # ------------------------------------------------------------------ settings

    @abc.abstractmethod
    def preflight(self, checkpoint: CheckpointRecord | None = None) -> list[Problem]:
        """Settings, privileges and retention headroom against the oldest sink checkpoint (its
        position and when it was written), one :class:`Problem` per problem."""

    # ------------------------------------------------------------------ memory between runs

    # The lease epoch of the run that reads (None: a read outside a run's lease): shipped to a
    # reader process beside the connection.
    lease_epoch: int | None = None

    def use_lease(self, epoch: int) -> None:
        """Reads from now on belong to the run holding lease ``epoch`` (a source may name its
        sessions for it: a PostgreSQL slot held by an older epoch's stalled read is taken over)."""
        self.lease_epoch = epoch

    def use_store(self, store: CheckpointStore) -> None:  # noqa: B027 - optional hook
        """The checkpoint store, for facts about its log a source keeps between runs (Postgres:
        the column set of each table as of a position). Given where a run reads (the runner's
        process); a source without it keeps those facts for one read only."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Must not raise."""
