"""A run's read plan and the readers that carry it out (docs/architecture.md, "One run").

The bounds step turns a run's range (lowest start, upper bound] into its **read plan**: ordered
segments, each read on its own:

* :class:`Chunk`: one primary-key chunk of a snapshot in progress (its end is the snapshot
  position after it);
* :class:`SnapshotEnd`: the snapshot's end, where its ``snapshot_completed`` message goes;
* :class:`Slice`: a part of the log that a reader decodes on its own (``Source.slices``).

Chunks come first, then the snapshot's end, then the log from its handoff. The plan travels in
the run's record, so the delivery reads what the bounds step planned.

A **reader** takes the segments and gives each one's items back in plan order
(:class:`SegmentRead`); where it reads them is its own business: :class:`InProcessReader`
here, the reader process (reader_process.py) or Spark tasks (tidegate/spark/). What crosses a
process is rows of one format (shipped.py). :func:`run_items` then makes the run's one item
stream out of the segments read: a chunk's rows become one transaction, less the rows whose
keys the log changes after the handoff (snapshots.ChangedKeys), and the snapshot's end brings
its ``snapshot_completed``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from .chunk_reads import first_read, forget_held
from .errors import SnapshotError
from .positions import Position, SnapshotPosition, position_from_json, position_to_json
from .snapshots import ChangedKeys, chunk_table, completed_message, end_chunk, read_chunk

if TYPE_CHECKING:
    from .run import RunContext
    from .sources.base import Source, SourceItem
    from .spec import PipelineSpec
    from .store import CheckpointStore

log = logging.getLogger(__name__)

# A Spark task's result reaches the driver whole: a plan cuts the log into slices of about this
# many bytes at most (Spark setting spark.tidegate.maxTaskSliceBytes, from the spec's spark.conf).
MAX_SLICE_CONF = "spark.tidegate.maxTaskSliceBytes"
MAX_TASK_SLICE_BYTES = 16 * 1024 * 1024


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


class SegmentRead(NamedTuple):
    """A segment as read: its items and, for a chunk, ``upper``: a log position at or after
    every change its rows show (the log head read just after the chunk's view was taken)."""

    segment: Segment
    items: Iterable[SourceItem]
    upper: Position | None = None


class Reader(Protocol):
    """Reads a run's segments and gives each one back, in plan order."""

    def __call__(self, run: RunContext, source: Source, segments: Sequence[Segment]) -> Iterator[SegmentRead]:
        """The segments of ``run`` (its spec and opened store) read from its opened ``source``."""

    def ahead(self, source: Source, segments: Sequence[Segment]) -> None:
        """The run's planned segments, told before its sinks open: a reader may start on them
        (the plan the run then reads can still differ)."""


# --------------------------------------------------------------------------- the plan


def plan_reads(run: RunContext, source: Source, start: Position | None, upto: Position) -> list[Segment]:
    """The read plan of (start, upto]: from a snapshot position, the snapshot's remaining
    chunks and its end, then the log from its handoff; the log cut into slices a Spark task can
    take whole."""
    spec, segments = run.spec, []
    if isinstance(start, SnapshotPosition):
        rec = snapshot_record(run.store, spec.pipeline, start.snapshot_id)
        segments += [Chunk(start.at_chunk(c)) for c in range(start.chunk + 1, len(rec.chunks) + 1)]
        segments.append(SnapshotEnd(rec.snapshot_id))
        if upto > rec.handoff:
            segments += log_slices(spec, source, rec.handoff, upto)
        return segments
    return log_slices(spec, source, start, upto)


def log_slices(spec: PipelineSpec, source: Source, start: Position | None, upto: Position) -> list[Segment]:
    """(start, upto] as slices; at least one, even when empty: reading it gives the final
    position mark that moves the checkpoints (and carries a message a sink is owed)."""
    limit = max_slice_bytes(spec)
    # A little under the limit: the source cuts at transaction boundaries at or past its
    # target, so a slice holds the target plus at most one transaction.
    cut = source.slices(start, upto, max_bytes=limit * 3 // 4)
    return [Slice(a, b) for a, b in cut] or [Slice(start, upto)]


def max_slice_bytes(spec: PipelineSpec) -> int:
    configured = spec.spark.conf.get(MAX_SLICE_CONF)
    return int(configured) if configured else MAX_TASK_SLICE_BYTES


def plan_start(segments: Sequence[Segment]) -> Position | None:
    """Where a plan starts reading, to compare with where the run starts (the plan is the
    bounds step's; a checkpoint moved back since, by a rewind, makes it stale)."""
    first = segments[0] if segments else None
    if isinstance(first, Chunk):
        return dataclasses.replace(first.end, chunk=first.end.chunk - 1)
    return first.start if isinstance(first, Slice) else None


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


# --------------------------------------------------------------------------- readers


def read_chunk_segment(run: RunContext, source: Source, seg: Chunk) -> SegmentRead:
    read = read_chunk(run.spec, source, snapshot_record(run.store, run.pipeline, seg.snapshot_id), seg.number)
    return SegmentRead(seg, read.events, read.upper)


class InProcessReader:
    """Every segment read here, one after the other: chunks with the run's own source
    connection, the log as one stream per run of touching slices."""

    def __call__(self, run: RunContext, source: Source, segments: Sequence[Segment]) -> Iterator[SegmentRead]:
        for seg in segments:
            if isinstance(seg, Chunk):
                yield read_chunk_segment(run, source, seg)
            elif isinstance(seg, SnapshotEnd):
                yield SegmentRead(seg, ())
        for stretch in log_runs(segments):
            yield SegmentRead(stretch, self.read_log(source, stretch))

    def read_log(self, source: Source, stretch: Slice) -> Iterable[SourceItem]:
        return source.read(stretch.start, stretch.end)

    def ahead(self, source: Source, segments: Sequence[Segment]) -> None:
        """Nothing is read before the run asks: this process is busy opening the sinks."""


# --------------------------------------------------------------------------- the run's items


def read_items(run: RunContext, source: Source, segments: Sequence[Segment], reader: Reader
               ) -> Iterator[SourceItem]:
    """The run's one item stream: its segments read by ``reader``, made into items by :func:`run_items`."""
    forget_held(run)
    records = {}
    for snapshot_id in dict.fromkeys(s.snapshot_id for s in segments if isinstance(s, SnapshotEnd)):
        todo = [s.number for s in segments if isinstance(s, Chunk) and s.snapshot_id == snapshot_id]
        rec = records[snapshot_id] = snapshot_record(run.store, run.pipeline, snapshot_id)
        log.info("pipeline %s: snapshot %s: reading chunks %s of %d, then the log from %s", run.pipeline,
                 snapshot_id, f"{todo[0]}..{todo[-1]}" if todo else "none", len(rec.chunks), rec.handoff)
    return run_items(run, source, reader(run, source, segments), records)


def run_items(run: RunContext, source: Source, reads: Iterable[SegmentRead], records: Mapping[str, Any]
              ) -> Iterator[SourceItem]:
    """The run's one item stream from its segments as read (see the module docstring);
    ``records``: the snapshots the segments belong to, by id."""
    spec, store = run.spec, run.store
    changed: dict[str, ChangedKeys] = {}
    for seg, items, upper in reads:
        if isinstance(seg, Chunk):
            rec = records[seg.snapshot_id]
            upper, items = first_read(run, rec, seg.number, upper, items)
            keys = changed.setdefault(seg.snapshot_id, ChangedKeys(rec, source))
            keys.scan_to(upper)
            kept = keys.drop_changed(chunk_table(rec, seg.number), items, upper)
            yield from end_chunk(kept, seg.end, store, rec, seg.number)
        elif isinstance(seg, SnapshotEnd):
            rec = records[seg.snapshot_id]
            keys = changed.get(seg.snapshot_id)
            if keys is not None and keys.dropped:
                log.info(
                    "pipeline %s: snapshot %s: %d row(s) left to the log (their keys changed after the "
                    "handoff)", spec.pipeline, rec.snapshot_id, keys.dropped)
            rows = sum(store.snapshots.chunk_rows(spec.pipeline, rec.snapshot_id).values())
            yield completed_message(spec, rec, rows)
        else:
            yield from items


def snapshot_record(store: CheckpointStore, pipeline: str, snapshot_id: str) -> Any:
    rec = store.snapshots.get(pipeline, snapshot_id)
    if rec is None:
        raise SnapshotError(f"pipeline {pipeline!r}: a checkpoint is in snapshot {snapshot_id}, "
                            f"which the checkpoint store does not know (another store?): rewind the "
                            f"checkpoints or trigger resolve=resnapshot")
    return rec


__all__ = ["Chunk", "InProcessReader", "Reader", "Segment", "SegmentRead", "Slice", "SnapshotEnd",
           "log_runs", "plan_reads", "plan_start", "read_items", "run_items", "segment_from_json",
           "segment_to_json"]
