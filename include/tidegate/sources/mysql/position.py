"""MySQL/MariaDB positions: a binlog coordinate with the server it belongs to, and GTID sets.

JSON: ``{"kind": "mysql", "file", "pos", "gtid_set", "server_id", "server_uuid"}``; the lineage
is the server (server id and uuid). What positions share across kinds is in
:mod:`tidegate.positions`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from ...positions import LogPosition, check_comparable, same_lineage

_BINLOG_FILE = re.compile(r"^(?P<base>.+)\.(?P<seq>\d+)$")
_MARIADB_GTID = re.compile(r"^\d+-\d+-\d+$")


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
        return cls("mysql", mysql=tuple((u, merge_intervals(iv)) for u, iv in sorted(uuids.items())))

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


def merge_intervals(intervals: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Closed intervals sorted, with the overlapping and adjacent ones joined (1-3 and 4-6
    become 1-6), as a MySQL GTID set holds them."""
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
class BinlogPosition(LogPosition):
    """A MySQL/MariaDB binlog coordinate. Ordered by (file sequence number, offset), so order
    holds across rotation (``mysql-bin.000009`` < ``mysql-bin.000010``)."""

    kind = "mysql"  # the source kind (the JSON's "kind", the lineage's first item)

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

    @functools.cached_property
    def file_seq(self) -> int:
        # Positions are compared at every sub-batch and transaction: parse the file's number once.
        return _seq(self.file)

    @property
    def basename(self) -> str:
        return _BINLOG_FILE.match(self.file).group("base")

    @property
    def lineage(self) -> tuple[Any, ...] | None:
        """The server whose binlog this is a coordinate in; None when unknown."""
        if self.server_id is None and self.server_uuid is None:
            return None
        return (self.kind, self.server_id, self.server_uuid)

    def _key(self) -> tuple[int, int]:
        return (self.file_seq, self.pos)

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

    def order_by_transactions(self, other: LogPosition) -> int | None:
        """By the executed GTID sets the two positions carry (see :class:`LogPosition`)."""
        mine, theirs = self.gtid_set, getattr(other, "gtid_set", None)
        if mine is None or theirs is None:
            return None
        below, above = theirs.contains(mine), mine.contains(theirs)
        if below and above:
            return 0
        return -1 if below else (1 if above else None)

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
            "kind": self.kind,
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

    @classmethod
    def lineage_of_identity(cls, identity: dict[str, Any]) -> tuple[Any, ...]:
        return (cls.kind, identity.get("server_id"), identity.get("server_uuid"))

    @staticmethod
    def describe_lineage(lineage: tuple[Any, ...]) -> str:
        return f"server_id {lineage[1]}" + (f", server_uuid {lineage[2]}" if lineage[2] else "")

    def __str__(self) -> str:
        return f"{self.file}:{self.pos}" + (f" [{self.gtid_set}]" if self.gtid_set else "")
