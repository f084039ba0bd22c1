"""A snapshot chunk's first read, kept in the checkpoint store until every sink holds the chunk.

Why: a chunk read again gives its rows as they are then. With two sinks or more, a run can die
after some sinks committed a chunk and before the others did (each sink commits on its own);
the rerun reads the chunk again for the sinks behind, later, and the keys the log changed in
between are left to the log there. Every sink's history would still replay to the table, but
the sinks would hold different snapshot rows. So the first read of a chunk is kept before any of
its rows is delivered, and a later run gives that read, not its own, to the sinks behind: the
same rows, the same upper bound, and so the same keys left to the log (``ChangedKeys`` decides
them from the read's own upper bound), the same events.

What it costs: a pipeline with one sink keeps nothing (no sink gets a chunk twice). With more,
each chunk's events are written once more, compressed, to the store, and let go once every
sink of the spec holds the chunk (checked when a run starts) or the snapshot completes. A sink
that stays behind keeps its chunks' reads in the store until it catches up.

The encoding is the events' own bytes (the envelopes) and the fields read beside them
(:data:`tidegate.shipped.ROW_FIELDS`) in a JSON head, in frames of 2,000 events, each
zstd-compressed (level 1: about 15x on envelopes, at several hundred MB/s): no pickled objects
in the store, and a chunk is held compressed, a frame at a time as objects.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import orjson
import zstandard

from ..events import ChangeEvent
from ..positions import Position, SnapshotPosition, same_lineage
from ..shipped import items_to_rows, rows_to_items
from ..spec import PipelineSpec

if TYPE_CHECKING:
    from ..run import RunContext

log = logging.getLogger(__name__)

FORMAT = 1
BATCH = 2000  # events per compressed frame: what a decode holds at once


def keeps_reads(spec: PipelineSpec) -> bool:
    return len(spec.sinks) > 1


def first_read(run: RunContext, rec: Any, chunk: int, upper: Position, events: Iterable[ChangeEvent]
               ) -> tuple[Position, Iterable[ChangeEvent]]:
    """The chunk's first read, on the run's store: the one kept (then ``events``, this run's read,
    is let go), or this one, kept before it is returned (so before any of its rows is delivered).
    Either way the events come from the kept bytes, batch by batch: a chunk is held compressed,
    never whole as objects (a chunk is one transaction, which may be larger than memory)."""
    store = run.store
    if not keeps_reads(run.spec):
        return upper, events
    kept = store.snapshots.kept_read(rec.pipeline, rec.snapshot_id, chunk)
    if kept is not None and not readable(kept[1]):
        # Kept by another version of tidegate (an upgrade between a kill and its rerun): failing
        # would fail every retry; the chunk is read again instead, as before reads were kept.
        log.warning("pipeline %s: snapshot %s: the kept first read of chunk %d is in a format this "
                    "version does not read (format %d): read again, so the sinks that lack it may get "
                    "other rows than those that hold it", rec.pipeline, rec.snapshot_id, chunk,
                    _format(kept[1]))
        store.snapshots.forget_read(rec.pipeline, rec.snapshot_id, chunk)
        kept = None
    if kept is not None:
        log.info("pipeline %s: snapshot %s: chunk %d as first read (a sink holds it, another lacks it)",
                 rec.pipeline, rec.snapshot_id, chunk)
        return kept[0], decode(kept[1])
    blob = encode(events)
    store.snapshots.keep_read(rec.pipeline, rec.snapshot_id, chunk, upper, blob)
    return upper, decode(blob)


def encode(events: Iterable[ChangeEvent]) -> bytes:
    """The events as a run of frames of up to BATCH events, each zstd-compressed on its own and
    preceded by its compressed length; the first 4 bytes are the format."""
    out = [FORMAT.to_bytes(4, "big")]
    compress = zstandard.ZstdCompressor(level=1).compress
    batch: list[ChangeEvent] = []
    for ev in events:
        batch.append(ev)
        if len(batch) == BATCH:
            out.append(_sized(compress(_frame(batch))))
            batch = []
    if batch:
        out.append(_sized(compress(_frame(batch))))
    return b"".join(out)


def _sized(frame: bytes) -> bytes:
    return len(frame).to_bytes(4, "big") + frame


def _frame(events: list[ChangeEvent]) -> bytes:
    """A JSON head (per event its bytes' lengths, its idempotency key and the index of its other
    fields, which change once per table), then every event's envelope and key bytes as they are."""
    metas: list[tuple] = []
    fields, parts = [], []
    for row in items_to_rows(events):  # the compiled loop where it is built
        _, value, key, ikey, op, db, schema, table, tx_id, tx_end, end_position, headers, commit_us = row
        if tx_end or end_position is not None:  # a chunk's end is marked after its read
            raise ValueError(f"a chunk read holds an event that ends a transaction: {ikey}")
        meta = (op, db, schema, table, tx_id, commit_us,
                headers and {k: bytes(v).decode() for k, v in headers.items()})
        if not metas or metas[-1] != meta:
            metas.append(meta)
        parts += (value, key)
        fields.append((len(value), len(key), ikey, len(metas) - 1))
    head = orjson.dumps([metas, fields])
    return len(head).to_bytes(8, "big") + head + b"".join(parts)


def _format(blob: bytes) -> int:
    return int.from_bytes(blob[:4], "big")


def readable(blob: bytes) -> bool:
    return _format(blob) == FORMAT


def decode(blob: bytes) -> Iterator[ChangeEvent]:
    """The events :func:`encode` kept, a frame at a time."""
    if not readable(blob):
        raise ValueError(f"a kept chunk read in format {_format(blob)}, this version reads {FORMAT}")
    decompress = zstandard.ZstdDecompressor().decompress
    at = 4
    while at < len(blob):
        size = int.from_bytes(blob[at:at + 4], "big")
        yield from _unframe(decompress(blob[at + 4:at + 4 + size]))
        at += 4 + size


def _unframe(frame: bytes) -> list[ChangeEvent]:
    size = int.from_bytes(frame[:8], "big")
    metas, fields = orjson.loads(frame[8:8 + size])
    rows, at = [], 8 + size
    for n_value, n_key, ikey, m in fields:
        op, db, schema, table, tx_id, commit_us, headers = metas[m]
        value, key = frame[at:at + n_value], frame[at + n_value:at + n_value + n_key]
        at += n_value + n_key
        rows.append(("event", value, key, ikey, op, db, schema, table, tx_id, False, None,
                     headers and {k: v.encode() for k, v in headers.items()}, commit_us))
    return rows_to_items(rows)


def forget_held(run: RunContext) -> None:
    """Let go the kept reads of the chunks every sink of the run's spec holds (its store)."""
    spec, store = run.spec, run.store
    if not keeps_reads(spec):
        return
    kept = store.snapshots.kept_chunks(spec.pipeline)
    if not kept:
        return
    current = store.checkpoints.current(spec.pipeline)
    for snapshot_id, chunks in kept.items():
        rec = store.snapshots.get(spec.pipeline, snapshot_id)
        last = SnapshotPosition(snapshot_id, chunks[-1], rec.handoff)
        held = min(_held(current.get(s.id), last) for s in spec.sinks)
        if held >= chunks[0]:
            store.snapshots.forget_reads(spec.pipeline, snapshot_id, held)


def _held(ckpt: Any, last: SnapshotPosition) -> int:
    """How many chunks of ``last``'s snapshot a sink at checkpoint ``ckpt`` holds (all the kept
    ones when it is past them). A sink outside the snapshot whose checkpoint is on another
    server than the snapshot's handoff is past it: the pipeline moved to that server after the
    snapshot (a GTID failover moves a snapshot a sink is in with it; accept_gap takes every sink
    out), and no rewind goes back across a failover. Found by the campaign (seed 5922: every
    sink passed a resnapshot, its run failed, the connection moved to the replica, and every
    later run failed comparing the kept reads' snapshot with the translated checkpoints)."""
    pos = None if ckpt is None else ckpt.position
    if pos is None:
        return 0
    if isinstance(pos, SnapshotPosition) and pos.snapshot_id == last.snapshot_id:
        return pos.chunk
    return last.chunk if not same_lineage(last, pos) or last < pos else 0


__all__ = ["decode", "encode", "first_read", "forget_held", "keeps_reads"]
