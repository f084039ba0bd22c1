"""The parts of a run's read plan, as data (docs/architecture.md, "One run"): a snapshot's
chunks, its end, log slices; their JSON form in the run's record. reading.py plans and reads them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from .positions import Position, SnapshotPosition, position_from_json, position_to_json


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One chunk of a snapshot; ``end`` is the snapshot position once it is delivered."""

    end: SnapshotPosition

    @property
    def snapshot_id(self) -> str:
        return self.end.snapshot_id

    @property
    def number(self) -> int:
        return self.end.chunk


@dataclasses.dataclass(frozen=True)
class SnapshotEnd:
    """The end of a snapshot: its ``snapshot_completed`` message, ending at the handoff."""

    snapshot_id: str


@dataclasses.dataclass(frozen=True)
class Slice:
    """A part of the log, (start, end], that a reader decodes on its own."""

    start: Position | None
    end: Position


Segment = Chunk | SnapshotEnd | Slice


def segment_to_json(seg: Segment) -> dict[str, Any]:
    if isinstance(seg, Chunk):
        return {"chunk": position_to_json(seg.end)}
    if isinstance(seg, SnapshotEnd):
        return {"snapshot_end": seg.snapshot_id}
    return {"slice": [position_to_json(seg.start), position_to_json(seg.end)]}


def segment_from_json(d: Mapping[str, Any]) -> Segment:
    if "chunk" in d:
        return Chunk(position_from_json(d["chunk"]))
    if "snapshot_end" in d:
        return SnapshotEnd(d["snapshot_end"])
    start, end = d["slice"]
    return Slice(position_from_json(start), position_from_json(end))


def log_runs(segments: Sequence[Segment]) -> list[Slice]:
    """The plan's slices joined where they touch: a reader that takes the log as a stream reads
    each run of slices in one go (concatenated in order, slices read as their whole range)."""
    out: list[Slice] = []
    for seg in segments:
        if not isinstance(seg, Slice):
            continue
        if out and out[-1].end == seg.start:
            out[-1] = Slice(out[-1].start, seg.end)
        else:
            out.append(seg)
    return out


__all__ = ["Chunk", "Segment", "Slice", "SnapshotEnd", "log_runs", "segment_from_json",
           "segment_to_json"]
