"""Source positions: immutable, totally ordered value types with a JSON form.

A position is where a reader stands in a source's change log. Checkpoints are positions at
a source transaction boundary (the position *after* a transaction's commit).

Every position carries its *lineage*: the source identity whose log it is a coordinate in
(MySQL/MariaDB: the server id and server uuid; Postgres: the system identifier and the
timeline). Positions are ordered only within one lineage. Two servers of a replication
topology write different binlog files and offsets for the same transactions, and a promoted
standby continues on a new timeline, so ordering positions of two lineages is an error
(:class:`~tidegate.errors.IncomparablePositionsError`), never a silent answer: moving from
one lineage to another goes only through the failover guard (GTID translation, or a halt
that records the gap). A position without identity fields (written by hand, in a unit test)
has no lineage and orders against any position.

This module holds what is the same for every source kind: the :class:`LogPosition` base, the
snapshot position, ordering helpers and the JSON dispatch. Each source kind's log position is
in its package (``sources/mysql/position.py``: ``BinlogPosition``, ``GtidSet``;
``sources/postgres/position.py``: ``Lsn``, ``PgPosition``), found through
:mod:`tidegate.kinds`.

JSON forms (docs/architecture.md, "Positions and their lineage"):
  a log position: {"kind": <source kind>, ...the kind's fields}
  Snapshot:       {"snapshot", "chunk", "handoff"} (a snapshot's progress, before its handoff)
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Union

from .errors import IncomparablePositionsError
from .kinds import source_kind


class LogPosition:
    """A coordinate in one source kind's change log; each source kind subclasses it (a frozen,
    totally ordered dataclass). ``lineage`` starts with the kind's name."""

    kind: str = ""  # the source kind: tags the JSON form and starts the lineage

    @property
    def lineage(self) -> tuple[Any, ...] | None:
        """The source identity this is a coordinate in; None when unknown."""
        raise NotImplementedError

    def bytes_to(self, other: Any, file_sizes: dict[str, int] | None = None) -> int | None:
        """Log bytes from here to ``other`` (0 when not ahead; None when unknown)."""
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        """The JSON form, with ``"kind": self.kind``."""
        raise NotImplementedError

    def order_by_transactions(self, other: LogPosition) -> int | None:
        """For two positions of different lineages of one topology (a GTID failover moved the
        pipeline between them): -1, 0 or 1 as the transactions before this position are fewer
        than, the same as or more than those before ``other``. None when that cannot be told:
        the kind has no global transaction ids (the default), or neither holds the other's."""
        return None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LogPosition:
        raise NotImplementedError

    @classmethod
    def lineage_of_identity(cls, identity: dict[str, Any]) -> tuple[Any, ...]:
        """The lineage a source identity (``Source.identity()``) of this kind gives its positions."""
        raise NotImplementedError

    @staticmethod
    def describe_lineage(lineage: tuple[Any, ...]) -> str:
        """A lineage of this kind in words, for messages."""
        raise NotImplementedError


# --------------------------------------------------------------------------- snapshots
# (snapshots: docs/architecture.md, "Snapshots")


@dataclass(frozen=True)
class SnapshotPosition:
    """Progress of a snapshot: chunks 1..``chunk`` of snapshot ``snapshot_id`` are delivered
    (``chunk`` 0: none yet); the log takes over at ``handoff`` once every chunk is delivered.

    Every position of a snapshot lies just before its handoff: it is lower than the handoff
    and every later log position, higher than every log position before the handoff. Within
    one snapshot positions are ordered by chunk; two snapshots by handoff, then by id (ids are
    time-ordered). The lineage is the handoff's.
    JSON: ``{"snapshot": id, "chunk": n, "handoff": {...}}``.
    """

    snapshot_id: str
    chunk: int
    handoff: LogPosition

    def __post_init__(self) -> None:
        if not isinstance(self.chunk, int) or self.chunk < 0:
            raise ValueError(f"snapshot chunk {self.chunk!r} must be a non-negative integer")
        if not isinstance(self.handoff, LogPosition):
            raise ValueError(f"a snapshot's handoff must be a log position, got {self.handoff!r}")

    @property
    def lineage(self) -> tuple[Any, ...] | None:
        return self.handoff.lineage

    def _cmp(self, other: object) -> int | None:
        """-1/0/1 against ``other`` (None: not a position)."""
        if isinstance(other, SnapshotPosition):
            if self.snapshot_id == other.snapshot_id:
                return (self.chunk > other.chunk) - (self.chunk < other.chunk)
            if self.handoff != other.handoff:
                return 1 if self.handoff > other.handoff else -1
            return 1 if self.snapshot_id > other.snapshot_id else -1
        if isinstance(other, LogPosition):
            return 1 if self.handoff > other else -1  # just before the handoff
        return None

    def __lt__(self, other: object) -> bool:
        c = self._cmp(other)
        return NotImplemented if c is None else c < 0

    def __le__(self, other: object) -> bool:
        c = self._cmp(other)
        return NotImplemented if c is None else c <= 0

    def __gt__(self, other: object) -> bool:
        c = self._cmp(other)
        return NotImplemented if c is None else c > 0

    def __ge__(self, other: object) -> bool:
        c = self._cmp(other)
        return NotImplemented if c is None else c >= 0

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SnapshotPosition):
            return False if isinstance(other, LogPosition) else NotImplemented
        return (self.snapshot_id, self.chunk) == (other.snapshot_id, other.chunk) and \
            self.handoff == other.handoff

    def __hash__(self) -> int:
        return hash((self.snapshot_id, self.chunk))

    def at_chunk(self, chunk: int) -> SnapshotPosition:
        return SnapshotPosition(self.snapshot_id, chunk, self.handoff)

    def with_handoff(self, handoff: LogPosition) -> SnapshotPosition:
        return SnapshotPosition(self.snapshot_id, self.chunk, handoff)

    def bytes_to(self, other: Position, file_sizes: dict[str, int] | None = None) -> int | None:
        """Log bytes from the handoff to ``other`` (the log still to read after the snapshot)."""
        return self.handoff.bytes_to(log_position(other), file_sizes)

    def to_json(self) -> dict[str, Any]:
        return {"snapshot": self.snapshot_id, "chunk": self.chunk, "handoff": self.handoff.to_json()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SnapshotPosition:
        handoff = position_from_json(d["handoff"])
        if isinstance(handoff, SnapshotPosition):
            raise ValueError(f"a snapshot's handoff must be a log position: {d!r}")
        return cls(str(d["snapshot"]), int(d["chunk"]), handoff)

    def __str__(self) -> str:
        return f"snapshot {self.snapshot_id} chunk {self.chunk} (handoff {self.handoff})"


def log_position(p: Position) -> LogPosition:
    """The log position a position stands for at the source: a snapshot's handoff (the log the
    source must keep and read after it), any other position itself."""
    return p.handoff if isinstance(p, SnapshotPosition) else p


Position = Union[LogPosition, SnapshotPosition]


def position_from_json(d: dict[str, Any] | str | None) -> Position | None:
    """Parse a position of any kind from its JSON form (a dict or a JSON string)."""
    if d is None:
        return None
    if isinstance(d, str):
        d = json.loads(d)
    if "snapshot" in d:
        return SnapshotPosition.from_json(d)
    kind = d.get("kind") or _legacy_kind(d)
    if kind is None:
        raise ValueError(f"not a position: {d!r} (expected a source kind's position, with its \"kind\")")
    return source_kind(kind).position_type().from_json(d)


# Log positions written before they carried their kind (in stores, sink-side checkpoint records,
# journals and XComs of older versions) have no "kind": this is the one place that tells them
# apart, by the keys each kind wrote then. New JSON always carries its kind.
_LEGACY_KIND_BY_KEY = (("lsn", "postgres"), ("file", "mysql"))


def _legacy_kind(d: dict[str, Any]) -> str | None:
    return next((kind for key, kind in _LEGACY_KIND_BY_KEY if key in d), None)


def position_to_json(p: Position | None) -> dict[str, Any] | None:
    return None if p is None else p.to_json()


def position_text(d: dict[str, Any] | str | None) -> str | None:
    """A position (or its JSON) as people read it: MariaDB/MySQL ``file:pos [gtid set]``,
    PostgreSQL's LSN ``X/Y``, a snapshot's chunk and handoff. None for None; JSON that is not a
    position is returned as compact JSON rather than raising (a page must still render)."""
    if d is None:
        return None
    try:
        pos = position_from_json(d) if isinstance(d, (dict, str)) else d
    except (ValueError, KeyError, TypeError):
        return json.dumps(d, sort_keys=True) if not isinstance(d, str) else d
    return str(pos)


def same_lineage(a: Position, b: Position) -> bool:
    """Whether ``a`` and ``b`` are coordinates in the same log (a position without lineage
    matches any)."""
    la, lb = a.lineage, b.lineage
    return la is None or lb is None or la == lb


def check_comparable(a: Position, b: Position) -> None:
    """Raise :class:`IncomparablePositionsError` when ``a`` and ``b`` belong to two lineages."""
    if not same_lineage(a, b):
        raise IncomparablePositionsError(
            f"positions {a} ({describe_lineage(a.lineage)}) and {b} ({describe_lineage(b.lineage)}) "
            f"belong to two different source identities and cannot be ordered; a change of server "
            f"is handled by the failover guard (it translates checkpoints by GTID or halts with the "
            f"gap): run the pipeline with its guards", a=a, b=b)


def describe_lineage(lineage: tuple[Any, ...] | None) -> str:
    if lineage is None:
        return "no identity"
    return source_kind(lineage[0]).position_type().describe_lineage(lineage)


def lineage_of_identity(identity: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """The lineage a source identity (``Source.identity()``) gives the positions it writes."""
    if not identity:
        return None
    try:
        kind = source_kind(identity.get("kind"))
    except ValueError:
        return None
    return kind.position_type().lineage_of_identity(identity)


def lowest_start(positions: Iterable[Position | None]) -> Position | None:
    """Where a read must start to serve every sink: the lowest position. None (a sink without
    a checkpoint) means from the pipeline's start, which is lower than any position."""
    ps = list(positions)
    if not ps or any(p is None for p in ps):
        return None
    return min(ps)


def oldest(positions: Iterable[Position | None]) -> Position | None:
    """The lowest of the positions that exist (None when there is none): the oldest sink
    checkpoint, which the log must still hold."""
    return min((p for p in positions if p is not None), default=None)


def later(a: Position | None, b: Position | None) -> Position | None:
    """The later of two positions of one source (None means 'nothing yet'); raises
    :class:`IncomparablePositionsError` for positions of two lineages."""
    if a is None:
        return b
    if b is None:
        return a
    return b if b > a else a
