"""Snapshots: the tables' current rows as ``op: "r"`` events, then the log from the handoff.

The method (docs/architecture.md, "Snapshots", has the argument in full):

1. Capture the handoff ``H`` before any chunk is read: the source head (``start: snapshot``),
   where streaming restarts after a loss (``resolve=resnapshot``), or the lowest sink checkpoint
   (a resnapshot of a healthy pipeline, so nothing after it is lost for other tables).
2. Cut each table into primary-key chunks and read them, each in its own short transaction,
   without locks (in parallel Spark tasks, or in-process for ``tidegate run``).
3. Deliver every chunk's rows, then the log from ``H``.

Every row is read after ``H``, so it already holds every change committed before ``H`` (and
maybe some after); the log from ``H`` then brings every change after ``H``, each after its key's
snapshot row. Replaying a sink's events per key therefore ends in the table's current content.

Progress is a position: :class:`~tidegate.positions.SnapshotPosition` ``(snapshot, chunk, H)``
means "chunks 1..chunk delivered". The snapshot's item stream is, per chunk, its rows as one
"transaction" whose last row ends at ``SnapshotPosition(chunk)``, then the
``snapshot_completed`` control message ending at ``H``, then the log. Checkpoints, sink-side
records, adoption and the coordinator treat it like any other stream: a killed run resumes at
the next chunk; a sink that is behind gets the chunks it lacks. ``snapshot_started`` is owed by
the checkpoint versions that start the snapshot (delivered before the first chunk).

Envelopes: ``op: "r"``, ``before: null``, ``after`` = the row, ``key`` = the primary key,
``tx_id`` = ``snapshot:{id}``, ``event_id`` = the primary key's JSON (so a resumed snapshot
re-sends the same idempotency keys), ``source.snapshot`` ``"true"`` (``"last"`` for the last
row of a table), ``ts_ms`` = when the snapshot was planned, ``source.position`` =
``{"snapshot", "chunk"}``.
The package: ``planning.py`` (a snapshot planned, sinks moved into it: :class:`SnapshotPlanner`;
completed ones settled; ``snapshot_record``, a snapshot the store must know), ``rows.py`` (a
chunk read as row events, the keys left to the log, the chunk's end), ``kept.py`` (a chunk's
first read, kept until every sink holds it). A run makes its segments as read into its item
stream through ``items.SnapshotItems`` (``items.snapshot_items`` builds it for the segments).
"""

from .planning import (
    SnapshotPlanner,
    completed_message,
    in_snapshot,
    new_snapshot_id,
    plan_snapshot,
    position_json,
    running,
    settle,
    snapshot_record,
    started_message,
    table_names,
)
from .rows import ChangedKeys, ChunkRead, RowEvents, chunk_table, end_chunk, key_json, read_chunk

__all__ = ["ChangedKeys", "ChunkRead", "RowEvents", "SnapshotPlanner", "chunk_table", "completed_message",
           "end_chunk", "in_snapshot", "key_json", "new_snapshot_id", "plan_snapshot", "position_json",
           "read_chunk", "running", "settle", "snapshot_record", "started_message", "table_names"]
