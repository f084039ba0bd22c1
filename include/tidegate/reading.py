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
process is rows of one format (shipped.py). :func:`read_items` then makes the run's one item
stream out of the segments read (``snapshot.items.SnapshotItems.stream``): a chunk's rows
become one transaction, less the rows whose keys the log changes after the handoff
(snapshot.ChangedKeys), and the snapshot's end brings its ``snapshot_completed``. With
``source.on_schema_change: halt``, :class:`SchemaGate` ends the stream before a schema change
of a captured table.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from .errors import ContinuityHalt
from .events import ControlMessage, PositionMark, is_control
from .positions import Position, SnapshotPosition
from .segments import (
    Chunk,
    Segment,
    Slice,
    SnapshotEnd,
    log_runs,
)
from .snapshot import read_chunk, snapshot_record
from .snapshot.items import snapshot_items

if TYPE_CHECKING:
    from .run import PlannedRun, RunContext
    from .sources.base import Source, SourceItem
    from .spec import PipelineSpec

log = logging.getLogger(__name__)

# A Spark task's result reaches the driver whole: a plan cuts the log into slices of about this
# many bytes at most (Spark setting spark.tidegate.maxTaskSliceBytes, from the spec's spark.conf).
MAX_SLICE_CONF = "spark.tidegate.maxTaskSliceBytes"
MAX_TASK_SLICE_BYTES = 16 * 1024 * 1024


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


def planned_reads(run: PlannedRun, source: Source, start: Position | None, upto: Position) -> list[Segment]:
    """The run's read plan: the bounds step's, when it starts where the run starts (a rewind since
    then moves the start back: the plan is made again), else made here."""
    record = run.record
    if record.segments and record.plan_start == start:
        return list(record.segments)
    if record.segments:
        log.info("pipeline %s run %s: the read plan of the bounds step starts at %s, the run at %s; "
                 "planned again", run.pipeline, run.run_id, record.plan_start, start)
    return plan_reads(run, source, start, upto)


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
    """The run's one item stream: its segments read by ``reader``, a snapshot's parts made into
    items (:meth:`SnapshotItems.stream <tidegate.snapshot.items.SnapshotItems.stream>`)."""
    return snapshot_items(run, source, segments).stream(reader(run, source, segments))


# --------------------------------------------------------------------------- on_schema_change: halt


class SchemaGate:
    """``on_schema_change: halt``: the stream stops before a schema change of a captured table
    (at the last whole transaction before it), unless an operator let this very change pass
    (a resolved ``schema_change`` incident at that boundary). The run delivers what came
    before; :meth:`halt` then records the incident."""

    def __init__(self, run: RunContext):
        self.spec, self.store = run.spec, run.store
        self.passed = {i.from_position for i in run.store.incidents.all(run.pipeline)
                       if i.kind == "schema_change" and i.resolved}
        self.stopped: tuple[Position | None, ControlMessage] | None = None

    def filter(self, items: Iterable[SourceItem], start: Position | None) -> Iterator[SourceItem]:
        if self.spec.source.on_schema_change != "halt":
            yield from items
            return
        boundary, tx = start, []  # the rows of the transaction in progress wait for its end
        for item in items:
            if is_control(item) and item.type == "schema_change" and boundary not in self.passed:
                self.stopped = (boundary, item)
                return
            tx.append(item)
            if isinstance(item, PositionMark) or item.tx_end:
                yield from tx
                tx, boundary = [], item.position if isinstance(item, PositionMark) else item.end_position
        yield from tx

    def halt(self, run_id: str) -> None:
        if self.stopped is None:
            return
        boundary, change = self.stopped
        detail = (f"schema change of {change.fields.get('db')}.{change.table}: "
                  f"{change.fields.get('ddl') or change.fields.get('change')}")
        inc = self.store.incidents.record(self.spec.pipeline, "schema_change", boundary,
                                          change.end_position or boundary, detail=detail, run_id=run_id)
        raise ContinuityHalt(inc)


__all__ = ["InProcessReader", "Reader", "SchemaGate", "SegmentRead", "plan_reads", "read_items"]
