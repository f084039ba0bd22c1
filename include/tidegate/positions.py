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

JSON forms (docs/architecture.md, "Positions and checkpoints"):
  MySQL/MariaDB: {"file", "pos", "gtid_set", "server_id", "server_uuid"}
  Postgres:      {"lsn", "system_id", "timeline"}
  Snapshot:      {"snapshot", "chunk", "handoff"} (a snapshot's progress, before its handoff)
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Union

from .errors import IncomparablePositionsError

_BINLOG_FILE = re.compile(r"^(?P<base>.+)\.(?P<seq>\d+)$")
_LSN = re.compile(r"^(?P<hi>[0-9A-Fa-f]{1,8})/(?P<lo>[0-9A-Fa-f]{1,8})$")
_MARIADB_GTID = re.compile(r"^\d+-\d+-\d+$")
_UINT64 = (1 << 64) - 1


# --------------------------------------------------------------------------- GTID sets


@dataclass(frozen=True)
class GtidSet:
    """A GTID set in MySQL form (``uuid:1-5:7,uuid2:1-3``) or MariaDB form (``0-1-100,1-2-5``).

    MySQL sets are interval lists per server UUID. MariaDB positions keep, per replication
    domain, the last (server_id, seq_no) applied; a MariaDB set "contains" another when each
    domain's seq_no is at least the other's.
    """

    flavor: str  # "mysql" | "mariadb"
    mysql: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = ()
    mariadb: tuple[tuple[int, int, int], ...] = ()  # (domain, server_id, seq_no)

    @classmethod
    def parse(cls, text: str | None) -> GtidSet | None:
        text = (text or "").strip().replace("\n", "")
        if not text:
            return None
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if all(_MARIADB_GTID.match(p) for p in parts):
            by_domain: dict[int, tuple[int, int]] = {}
            for p in parts:
                d, s, n = (int(x) for x in p.split("-"))
                if d not in by_domain or n > by_domain[d][1]:
                    by_domain[d] = (s, n)
            return cls("mariadb", mariadb=tuple(sorted((d, s, n) for d, (s, n) in by_domain.items())))
        uuids: dict[str, list[tuple[int, int]]] = {}
        for p in parts:
            uuid, _, ranges = p.partition(":")
            if not ranges:
                raise ValueError(f"malformed GTID set element {p!r}: expected uuid:N[-M]")
            for r in ranges.split(":"):
                lo, _, hi = r.partition("-")
                uuids.setdefault(uuid.lower(), []).append((int(lo), int(hi or lo)))
        return cls("mysql", mysql=tuple((u, _merge(iv)) for u, iv in sorted(uuids.items())))

    def __str__(self) -> str:
        if self.flavor == "mariadb":
            return ",".join(f"{d}-{s}-{n}" for d, s, n in self.mariadb)
        return ",".join(
            u + ":" + ":".join(str(a) if a == b else f"{a}-{b}" for a, b in iv) for u, iv in self.mysql
        )

    def contains(self, other: GtidSet | None) -> bool:
        """True when every transaction of ``other`` is in this set."""
        if other is None:
            return True
        if other.flavor != self.flavor:
            return False
        if self.flavor == "mariadb":
            mine = {d: n for d, _, n in self.mariadb}
            return all(d in mine and mine[d] >= n for d, _, n in other.mariadb)
        mine_iv = dict(self.mysql)
        for uuid, intervals in other.mysql:
            have = mine_iv.get(uuid, ())
            for lo, hi in intervals:
                if not any(a <= lo and hi <= b for a, b in have):
                    return False
        return True


def _merge(intervals: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[list[int]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((a, b) for a, b in out)


# --------------------------------------------------------------------------- binlog


def _seq(file: str) -> int:
    m = _BINLOG_FILE.match(file)
    return int(m.group("seq")) if m else -1


@functools.total_ordering
@dataclass(frozen=True)
class BinlogPosition:
    """A MySQL/MariaDB binlog coordinate. Ordered by (file sequence number, offset), so order
    holds across rotation (``mysql-bin.000009`` < ``mysql-bin.000010``)."""

    file: str
    pos: int
    gtid_set: GtidSet | None = field(default=None, compare=False)
    server_id: int | None = field(default=None, compare=False)
    server_uuid: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        m = _BINLOG_FILE.match(self.file or "")
        if not m:
            raise ValueError(f"binlog file {self.file!r} is not of the form <basename>.<number>")
        if not isinstance(self.pos, int) or self.pos < 0:
            raise ValueError(f"binlog pos {self.pos!r} must be a non-negative integer")
        # Positions are compared at every sub-batch and transaction: parse the file's number once.
        object.__setattr__(self, "_seq", int(m.group("seq")))

    @property
    def file_seq(self) -> int:
        return self._seq

    @property
    def basename(self) -> str:
        return _BINLOG_FILE.match(self.file).group("base")

    @property
    def lineage(self) -> tuple[Any, ...] | None:
        """The server whose binlog this is a coordinate in; None when unknown."""
        if self.server_id is None and self.server_uuid is None:
            return None
        return ("mysql", self.server_id, self.server_uuid)

    def _key(self) -> tuple[int, int]:
        return (self._seq, self.pos)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, BinlogPosition):
            return NotImplemented
        check_comparable(self, other)
        return self._key() < other._key()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BinlogPosition):
            return NotImplemented
        return self._key() == other._key() and same_lineage(self, other)

    def __hash__(self) -> int:
        return hash(self._key())

    def bytes_to(self, other: BinlogPosition, file_sizes: dict[str, int] | None = None) -> int | None:
        """Binlog bytes from here to ``other`` (0 when ``other`` is not ahead): the offset
        difference within one file; across files only with ``file_sizes`` (``SHOW BINARY LOGS``),
        else None. None for positions of another server."""
        if not same_lineage(self, other):
            return None
        if not other > self:
            return 0
        if self.file == other.file:
            return other.pos - self.pos
        sizes = file_sizes or {}
        if self.file not in sizes or other.file not in sizes:
            return None
        between = sum(size for name, size in sizes.items() if self.file_seq < _seq(name) < other.file_seq)
        return max(0, sizes[self.file] - self.pos) + between + other.pos

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "pos": self.pos,
            "gtid_set": str(self.gtid_set) if self.gtid_set else None,
            "server_id": self.server_id,
            "server_uuid": self.server_uuid,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BinlogPosition:
        return cls(
            file=d["file"],
            pos=int(d["pos"]),
            gtid_set=GtidSet.parse(d.get("gtid_set")),
            server_id=d.get("server_id"),
            server_uuid=d.get("server_uuid"),
        )

    def __str__(self) -> str:
        return f"{self.file}:{self.pos}" + (f" [{self.gtid_set}]" if self.gtid_set else "")


# --------------------------------------------------------------------------- postgres


@functools.total_ordering
@dataclass(frozen=True)
class Lsn:
    """A PostgreSQL WAL location, an unsigned 64-bit integer written ``HI/LO`` in hex."""

    value: int

    def __post_init__(self) -> None:
        if not isinstance(self.value, int) or not 0 <= self.value <= _UINT64:
            raise ValueError(f"LSN {self.value!r} is outside the unsigned 64-bit range")

    @classmethod
    def parse(cls, text: str | Lsn) -> Lsn:
        if isinstance(text, Lsn):
            return text
        m = _LSN.match(str(text).strip())
        if not m:
            raise ValueError(f"malformed LSN {text!r}: expected HEX/HEX such as 16/B374D848")
        return cls((int(m.group("hi"), 16) << 32) | int(m.group("lo"), 16))

    def __str__(self) -> str:
        return f"{self.value >> 32:X}/{self.value & 0xFFFFFFFF:X}"

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Lsn):
            return NotImplemented
        return self.value < other.value


@functools.total_ordering
@dataclass(frozen=True)
class PgPosition:
    """A Postgres logical decoding position: a commit LSN plus the server identity."""

    lsn: Lsn
    system_id: str | None = field(default=None, compare=False)
    timeline: int | None = field(default=None, compare=False)

    @property
    def lineage(self) -> tuple[Any, ...] | None:
        """The cluster (system identifier) and timeline this LSN belongs to; None when unknown."""
        if self.system_id is None and self.timeline is None:
            return None
        return ("postgres", str(self.system_id), self.timeline)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, PgPosition):
            return NotImplemented
        check_comparable(self, other)
        return self.lsn < other.lsn

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PgPosition):
            return NotImplemented
        return self.lsn == other.lsn and same_lineage(self, other)

    def __hash__(self) -> int:
        return hash(self.lsn)

    def bytes_to(self, other: PgPosition, file_sizes: dict[str, int] | None = None) -> int | None:
        """WAL bytes from here to ``other`` (0 when ``other`` is not ahead); None for positions
        of another cluster or timeline."""
        if not same_lineage(self, other):
            return None
        return max(0, other.lsn.value - self.lsn.value)

    def to_json(self) -> dict[str, Any]:
        return {"lsn": str(self.lsn), "system_id": self.system_id, "timeline": self.timeline}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PgPosition:
        return cls(Lsn.parse(d["lsn"]), d.get("system_id"), d.get("timeline"))

    def __str__(self) -> str:
        return str(self.lsn)


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
    handoff: BinlogPosition | PgPosition

    def __post_init__(self) -> None:
        if not isinstance(self.chunk, int) or self.chunk < 0:
            raise ValueError(f"snapshot chunk {self.chunk!r} must be a non-negative integer")
        if not isinstance(self.handoff, (BinlogPosition, PgPosition)):
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
        if isinstance(other, (BinlogPosition, PgPosition)):
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
            return False if isinstance(other, (BinlogPosition, PgPosition)) else NotImplemented
        return (self.snapshot_id, self.chunk) == (other.snapshot_id, other.chunk) and \
            self.handoff == other.handoff

    def __hash__(self) -> int:
        return hash((self.snapshot_id, self.chunk))

    def at_chunk(self, chunk: int) -> SnapshotPosition:
        return SnapshotPosition(self.snapshot_id, chunk, self.handoff)

    def with_handoff(self, handoff: BinlogPosition | PgPosition) -> SnapshotPosition:
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


def log_position(p: Position) -> BinlogPosition | PgPosition:
    """The log position a position stands for at the source: a snapshot's handoff (the log the
    source must keep and read after it), any other position itself."""
    return p.handoff if isinstance(p, SnapshotPosition) else p


Position = Union[BinlogPosition, PgPosition, SnapshotPosition]


def position_from_json(d: dict[str, Any] | str | None) -> Position | None:
    """Parse a position of any kind from its JSON form (a dict or a JSON string)."""
    if d is None:
        return None
    if isinstance(d, str):
        d = json.loads(d)
    if "snapshot" in d:
        return SnapshotPosition.from_json(d)
    if "lsn" in d:
        return PgPosition.from_json(d)
    if "file" in d:
        return BinlogPosition.from_json(d)
    raise ValueError(f"not a position: {d!r} (expected keys file/pos or lsn)")


def position_to_json(p: Position | None) -> dict[str, Any] | None:
    return None if p is None else p.to_json()


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
    if lineage[0] == "mysql":
        return f"server_id {lineage[1]}" + (f", server_uuid {lineage[2]}" if lineage[2] else "")
    return f"system_id {lineage[1]}, timeline {lineage[2]}"


def lineage_of_identity(identity: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """The lineage a source identity (``Source.identity()``) gives the positions it writes."""
    if not identity:
        return None
    if identity.get("kind") == "mysql":
        return ("mysql", identity.get("server_id"), identity.get("server_uuid"))
    if identity.get("kind") == "postgres":
        return ("postgres", str(identity.get("system_id")), identity.get("timeline"))
    return None


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
