"""A run's segments as read made into its one item stream: a chunk's rows as the sinks get them,
a snapshot's end as its ``snapshot_completed`` message, the log's items as they are (the package
docstring has the method)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..events import ChangeEvent, ControlMessage
from ..positions import Position, SnapshotPosition
from ..segments import Chunk, Segment, SnapshotEnd
from .kept import first_read, forget_held
from .planning import completed_message, snapshot_record
from .rows import ChangedKeys, chunk_table, end_chunk

if TYPE_CHECKING:
    from ..run import RunContext
    from ..sources.base import Source, SourceItem

log = logging.getLogger(__name__)


class SnapshotItems:
    """One run's snapshot parts, on its opened ``source`` and store; ``records``: the snapshots
    the run reads, by id. The keys the log changes after a snapshot's handoff are scanned once
    per snapshot, across its chunks (:class:`ChangedKeys`)."""

    def __init__(self, run: RunContext, source: Source, records: Mapping[str, Any]):
        self.run, self.source, self.records = run, source, records
        self.changed: dict[str, ChangedKeys] = {}

    def stream(self, reads: Iterable[Any]) -> Iterator[SourceItem]:
        """The run's one item stream from its segments as read (``reading.SegmentRead``, in plan
        order): a chunk's rows as :meth:`chunk` makes them, a snapshot's end as its message, the
        log's items as they come."""
        for seg, items, upper in reads:
            if isinstance(seg, Chunk):
                yield from self.chunk(seg.end, items, upper)
            elif isinstance(seg, SnapshotEnd):
                yield self.end(seg.snapshot_id)
            else:
                yield from items

    def chunk(self, end: SnapshotPosition, items: Iterable[ChangeEvent], upper: Position
              ) -> Iterator[SourceItem]:
        """Chunk ``end.chunk`` as read: its kept first read (or this one, kept), the rows whose
        keys the log changed up to its upper bound left to the log, then its end."""
        rec = self.records[end.snapshot_id]
        upper, items = first_read(self.run, rec, end.chunk, upper, items)
        keys = self.changed.setdefault(end.snapshot_id, ChangedKeys(rec, self.source))
        keys.scan_to(upper)
        kept = keys.drop_changed(chunk_table(rec, end.chunk), items, upper)
        yield from end_chunk(kept, end, self.run.store, rec, end.chunk)

    def end(self, snapshot_id: str) -> ControlMessage:
        """The snapshot's ``snapshot_completed`` message, with the rows its chunks delivered."""
        rec, pipeline = self.records[snapshot_id], self.run.pipeline
        keys = self.changed.get(snapshot_id)
        if keys is not None and keys.dropped:
            log.info("pipeline %s: snapshot %s: %d row(s) left to the log (their keys changed after the "
                     "handoff)", pipeline, snapshot_id, keys.dropped)
        rows = sum(self.run.store.snapshots.chunk_rows(pipeline, snapshot_id).values())
        return completed_message(self.run.spec, rec, rows)


def snapshot_items(run: RunContext, source: Source, segments: Sequence[Segment]) -> SnapshotItems:
    """The snapshot parts of a run about to read ``segments`` (on its opened ``source`` and
    store): the kept first reads that every sink holds let go, and the snapshots whose end is
    among the segments looked up, each logged with the chunks the run reads of it."""
    forget_held(run)
    records = {}
    for snapshot_id in dict.fromkeys(s.snapshot_id for s in segments if isinstance(s, SnapshotEnd)):
        todo = [s.number for s in segments if isinstance(s, Chunk) and s.snapshot_id == snapshot_id]
        rec = records[snapshot_id] = snapshot_record(run.store, run.pipeline, snapshot_id)
        log.info("pipeline %s: snapshot %s: reading chunks %s of %d, then the log from %s", run.pipeline,
                 snapshot_id, f"{todo[0]}..{todo[-1]}" if todo else "none", len(rec.chunks), rec.handoff)
    return SnapshotItems(run, source, records)


__all__ = ["SnapshotItems", "snapshot_items"]
