"""PostgreSQL positions: a WAL location (:class:`Lsn`) and a commit LSN with the cluster and
timeline it belongs to (:class:`PgPosition`).

JSON: ``{"kind": "postgres", "lsn", "system_id", "timeline"}``; the lineage is the cluster
(system identifier) and the timeline. What positions share across kinds is in
:mod:`tidegate.positions`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from ...positions import LogPosition, check_comparable, same_lineage

_LSN = re.compile(r"^(?P<hi>[0-9A-Fa-f]{1,8})/(?P<lo>[0-9A-Fa-f]{1,8})$")
_UINT64 = (1 << 64) - 1


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
class PgPosition(LogPosition):
    """A Postgres logical decoding position: a commit LSN plus the server identity."""

    kind = "postgres"  # the source kind (the JSON's "kind", the lineage's first item)

    lsn: Lsn
    system_id: str | None = field(default=None, compare=False)
    timeline: int | None = field(default=None, compare=False)

    @property
    def lineage(self) -> tuple[Any, ...] | None:
        """The cluster (system identifier) and timeline this LSN belongs to; None when unknown."""
        if self.system_id is None and self.timeline is None:
            return None
        return (self.kind, str(self.system_id), self.timeline)

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
        return {"kind": self.kind, "lsn": str(self.lsn), "system_id": self.system_id,
                "timeline": self.timeline}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PgPosition:
        return cls(Lsn.parse(d["lsn"]), d.get("system_id"), d.get("timeline"))

    @classmethod
    def lineage_of_identity(cls, identity: dict[str, Any]) -> tuple[Any, ...]:
        return (cls.kind, str(identity.get("system_id")), identity.get("timeline"))

    @staticmethod
    def describe_lineage(lineage: tuple[Any, ...]) -> str:
        return f"system_id {lineage[1]}, timeline {lineage[2]}"

    def __str__(self) -> str:
        return str(self.lsn)
