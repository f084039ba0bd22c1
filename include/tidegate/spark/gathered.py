"""A run with parallel parts as one Spark job of two stages (docs/architecture.md, "Processes").

A read plan with parallel parts (snapshot chunks, several log slices) is read by one Spark task
per part, side by side; their rows are gathered into one partition, sorted by (part, row), and
delivered there by one task, as a one-slice run is (delivery.py). The job, built by
:func:`gathered_frame`::

    spark.range(parts, numPartitions=parts)       one row per part, one partition each
      .mapInArrow(read the part)                  stage 1: (part, seq, batch) rows
      .repartition(1).sortWithinPartitions(part, seq)   the shuffle: every part's rows, in order
      .mapInArrow(deliver)                        stage 2: the run, its one row the report

A row of stage 1 is a pickled batch of shipped rows (chunks.py's ``batch``, 2,000 events), so
the shuffle and the sort move a few large values per part; the envelopes are serialized once,
in the part's task, and never parsed again.

Reading has no side effect (a binlog dump, a chunk's short transaction), so Spark may run a
part again at will: a stage-1 retry, or stage 1 again when the executor holding its shuffle
output is lost before the delivery task fetched it. The delivery task is the run: its retry is
a new run of the same record (delivery.py).

The delivery task takes the gathered rows only when the run reads the plan it was made for (the
bounds step's, which the parts are); a run that planned again (a checkpoint moved back since the
bounds) reads its own plan in the task, as a one-slice run does, and lets the gathered rows go.

A log whose read holds what a newer run takes over by its lease epoch (a PostgreSQL slot:
``SourceKind.log_read_under_lease``) is no part: the run's lease is taken in the delivery task,
so a stage-1 task could name no epoch on its session, and a stalled one could not be taken over.
The delivery task reads such a log itself, under the lease, after the gathered chunks.
"""

from __future__ import annotations

import itertools
import logging
import pickle
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..events import PositionMark
from ..kinds import source_kind
from ..parts import fixed_connection
from ..reading import SegmentRead
from ..segments import Chunk, Slice, SnapshotEnd
from ..shipped import pack, unpack
from ..snapshot import read_chunk, snapshot_record
from ..store import open_store
from .slices import NOTE, executor_note

if TYPE_CHECKING:
    from ..reading import Reader
    from ..run import RunContext
    from ..segments import Segment
    from ..sources.base import Source
    from ..spec import PipelineSpec

log = logging.getLogger(__name__)

PART_SCHEMA = "part INT, seq INT, batch BINARY"
BATCH_ROWS = 2000  # items to a message (a Spark row of stage 1), as a reader process ships them


def parts_of(segments: Sequence[Segment], slices: bool = True) -> list[Chunk | Slice]:
    """The plan's parts a task reads each: its chunks and (``slices``) its log slices, in plan
    order."""
    return [s for s in segments if isinstance(s, Chunk) or (slices and isinstance(s, Slice))]


def gathered_parts(spec: PipelineSpec, segments: Sequence[Segment]) -> list[Chunk | Slice]:
    """The parts of pipeline ``spec``'s plan that Spark tasks of their own read: its log slices
    only when the source's log read holds nothing that only the run's lease may take over (the
    module's docstring). The one answer both stages and the run's report go by."""
    return parts_of(segments, not source_kind(spec.source.kind).log_read_under_lease)


def part_reader(spec: PipelineSpec, connection: Any, salt: bytes | None, store_url: str,
                parts: Sequence[Chunk | Slice]) -> Any:
    """Stage 1's function: for each part index it is given (one per partition), that part's
    messages as Arrow batches of :data:`PART_SCHEMA`."""

    def read_parts(batches: Iterator[Any]) -> Iterator[Any]:
        indexes = [int(i) for b in batches for i in b.column(0).to_pylist()]
        for index in indexes:
            yield from _part_batches(index, _part_messages(spec, connection, salt, store_url, parts, index))

    return read_parts


def _part_messages(spec: PipelineSpec, connection: Any, salt: bytes | None, store_url: str,
                   parts: Sequence[Chunk | Slice], index: int) -> Iterator[tuple]:
    """Part ``index`` as messages: its items packed as a reader process packs them
    (``shipped.pack``: the compiled path where it is built), a chunk's upper bound first, a
    slice's note (what its task read, where its code came from) last."""
    part = parts[index]
    source = fixed_connection(connection, salt).source(spec)
    try:
        if isinstance(part, Slice):
            t0, count = time.monotonic(), [0]
            yield from _packed(source.read_slice(part.start, part.end, index), count)
            yield (NOTE, executor_note(spec.pipeline, index, len(parts), count[0], time.monotonic() - t0))
            return
        with open_store(store_url) as store:
            rec = snapshot_record(store, spec.pipeline, part.snapshot_id)
        read = read_chunk(spec, source, rec, part.number)
        yield ("upper", read.upper)
        yield from _packed(read.events, [0])
    finally:
        source.close()


def _packed(items: Iterable[Any], count: list[int]) -> Iterator[tuple]:
    """``items`` as packed batches of :data:`BATCH_ROWS`; ``count[0]`` counts the events."""
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) >= BATCH_ROWS:
            count[0] += sum(not isinstance(i, PositionMark) for i in batch)
            yield pack(batch)
            batch = []
    if batch:
        count[0] += sum(not isinstance(i, PositionMark) for i in batch)
        yield pack(batch)


def _part_batches(index: int, messages: Iterable[tuple]) -> Iterator[Any]:
    """One Arrow batch per message: (part, seq, the pickled message)."""
    import pyarrow as pa  # in the Spark task that packs; a driver importing this module needs none

    for seq, message in enumerate(messages):
        yield pa.RecordBatch.from_arrays(
            [pa.array([index], pa.int32()), pa.array([seq], pa.int32()),
             pa.array([pickle.dumps(message, pickle.HIGHEST_PROTOCOL)], pa.binary())],
            names=["part", "seq", "batch"])


def gathered_frame(spark: Any, read_parts: Any, count: int, deliver: Any, schema: str, *,
                   tasks: int | None = None, barrier: bool = False) -> Any:
    """The run's job: ``count`` parts read by ``read_parts`` in ``tasks`` tasks side by side (each
    a run of consecutive parts, one after the other; default one task a part), gathered in
    (part, seq) order into one partition that ``deliver`` maps to the report."""
    # Adaptive execution runs each shuffle's map stage as a job of its own; without it the run is
    # one job (what an operator finds in the Spark UI), and it has nothing to adapt: one output
    # partition, a sort of a few rows per part.
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    partitions = max(1, min(count, tasks or count))
    read = spark.range(count, numPartitions=partitions).mapInArrow(read_parts, PART_SCHEMA)
    gathered = read.repartition(1).sortWithinPartitions("part", "seq")
    return gathered.mapInArrow(deliver, schema, barrier=barrier)


def _items(messages: Iterable[tuple[Any, tuple]]) -> Iterator[Any]:
    """A part's items from its messages (a slice's note, its last, logged)."""
    for _, message in messages:
        if message[0] == NOTE:
            log.info("%s", message[1])
        else:
            yield from unpack(message)


class GatheredReader:
    """The delivery task's reader: the plan's parts from the gathered rows (``batches``, Arrow
    batches of :data:`PART_SCHEMA` in (part, seq) order) when the run reads ``plan``; else
    ``fallback`` reads what the run asks. The rows stream through: each read's items must be
    taken before the next read is asked for (as ``SnapshotItems.stream`` does). ``parts``: those of
    the plan that stage 1 read (:func:`gathered_parts`); log slices not among them ``fallback``
    reads here."""

    def __init__(self, batches: Iterator[Any], plan: Sequence[Segment], parts: Sequence[Chunk | Slice],
                 fallback: Reader):
        self.batches, self.plan, self.fallback = batches, list(plan), fallback
        self.slices_gathered = any(isinstance(p, Slice) for p in parts)
        self.taken = False

    def ahead(self, source: Source, segments: Sequence[Segment]) -> None:
        """The parts were read before this task began."""

    def __call__(self, run: RunContext, source: Source, segments: Sequence[Segment]) -> Iterator[SegmentRead]:
        if list(segments) != self.plan:
            log.info("pipeline %s: the run planned again since the bounds step: its plan is read in "
                     "this task, the gathered parts are let go", run.pipeline)
            self.drain()
            yield from self.fallback(run, source, segments)
            return
        self.taken = True
        parts = itertools.groupby(self._messages(), key=lambda pm: pm[0])
        slices = [s for s in self.plan if isinstance(s, Slice)]
        for seg in self.plan:
            if isinstance(seg, Chunk):
                _, messages = next(parts)
                _, (_, upper) = next(messages)  # the chunk's upper bound comes first
                yield SegmentRead(seg, _items(messages), upper)
            elif isinstance(seg, SnapshotEnd):
                yield SegmentRead(seg, ())
        if slices and not self.slices_gathered:
            log.info("pipeline %s: the log (%s, %s] is read in the delivery task, under the run's lease "
                     "(lease epoch %s)", run.pipeline, slices[0].start, slices[-1].end, source.lease_epoch)
            yield from self.fallback(run, source, slices)
        elif slices:
            yield SegmentRead(Slice(slices[0].start, slices[-1].end),
                              (i for _ in slices for i in _items(next(parts)[1])))

    def _messages(self) -> Iterator[tuple[int, tuple]]:
        """(part, its next message) in order, a Spark row unpickled at a time."""
        for batch in self.batches:
            for part, blob in zip(batch.column(0).to_pylist(), batch.column(2).to_pylist(), strict=True):
                yield part, pickle.loads(blob)

    def drain(self) -> None:
        """Read the rest of the input (PySpark gives a worker back to the pool only then)."""
        for _ in self.batches:
            pass


__all__ = ["GatheredReader", "PART_SCHEMA", "gathered_frame", "gathered_parts", "part_reader", "parts_of"]
