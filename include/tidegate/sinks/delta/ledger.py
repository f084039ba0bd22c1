"""What the Delta sink's commits say about themselves, and the identifiers they carry. Light: no
Spark (the rules are unit-tested on their own).

Every commit of the sink (a table's MERGE, DELETE or append, the checkpoint table's row) carries

- Delta's idempotent-write identifiers: ``txnAppId`` = the sink's key and ``txnVersion`` =
  :func:`txn_version` of the run's lease epoch and the store version the delivery extends. Delta
  skips a commit whose txnVersion is not above the highest it recorded for the app in that table,
  atomically with the commit (a concurrent commit of the app is a conflict). So within a run a
  retried sub-batch is written once, and a run of an older lease epoch (a zombie) can no longer
  commit to a table a newer run has committed to.
- ``userMetadata``: :func:`commit_metadata`, with ``covers``: the source position up to which the
  table holds every change of this pipeline (the sub-batch's end). A rerun reads it back per table
  (:func:`covered_position` over the table's history) and writes each table only what follows it.
- ``snapshot`` (a sub-batch that holds a snapshot's chunks): the snapshot's id and the highest
  chunk the sub-batch holds. A snapshot is not the log: a resnapshot of a healthy pipeline hands
  off at the sinks' checkpoint, so its chunks lie before what a table covers, yet the table has
  never held them. Which snapshot's chunks a table holds is therefore read from these marks
  (:func:`held_snapshot`, :func:`needs_chunk`), not from ``covers``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from ...positions import (
    IncomparablePositionsError,
    LogPosition,
    Position,
    SnapshotPosition,
    log_position,
    position_from_json,
    position_to_json,
)

EPOCH_BITS = 32  # txnVersion = epoch in the high bits, (store version extended + 1) in the low ones
MAX_EXTENDS = (1 << EPOCH_BITS) - 2


def txn_version(epoch: int | None, extends: int) -> int:
    """The txnVersion of a commit by a run of lease ``epoch`` (None: no lease, 0) extending store
    version ``extends``; ``extends=-1`` is a claim (the lowest of the epoch). Every epoch's versions
    are above every older epoch's, and within one epoch they grow with the store version."""
    if not -1 <= extends <= MAX_EXTENDS:
        raise ValueError(f"store version {extends} does not fit a Delta txnVersion's low {EPOCH_BITS} bits")
    return ((epoch or 0) << EPOCH_BITS) | (extends + 1)


def txn_epoch(txn: int) -> int:
    """The lease epoch a txnVersion was written under (0 for versions of the sink's first form,
    which were the bare store version)."""
    return txn >> EPOCH_BITS


def commit_metadata(*, app: str, pipeline: str, sink: str, epoch: int | None, extends: int,
                    covers: Position | None, controls: list[dict[str, Any]] | None = None,
                    claim: bool = False, snapshot: SnapshotPosition | None = None) -> str:
    """The ``userMetadata`` of one commit (JSON): who wrote it, its txnVersion, what it covers,
    and the last snapshot chunk its sub-batch holds (``snapshot``)."""
    meta: dict[str, Any] = {"tidegate": {
        "app": app, "pipeline": pipeline, "sink": sink, "epoch": epoch, "extends": extends,
        "txn": txn_version(epoch, extends), "covers": position_to_json(covers)}}
    if snapshot is not None:
        meta["tidegate"]["snapshot"] = {"id": snapshot.snapshot_id, "chunk": snapshot.chunk}
    if claim:
        meta["tidegate"]["claim"] = True
    if controls:
        meta["control"] = controls
    return json.dumps(meta, default=str, sort_keys=True)


def parse_metadata(text: str | None, app: str) -> dict[str, Any] | None:
    """The ``tidegate`` part of a commit's userMetadata when this app (sink) wrote it, else None
    (another writer's commit, a DDL commit without metadata, the sink's first form without ``app``)."""
    if not text:
        return None
    try:
        meta = json.loads(text)
    except ValueError:
        return None
    mine = meta.get("tidegate") if isinstance(meta, dict) else None
    return mine if isinstance(mine, dict) and mine.get("app") == app else None


def covered_position(history: Iterable[str | None], app: str) -> Position | None:
    """Up to where a table holds this app's changes: the ``covers`` of the newest commit of the app
    that has one (``history``: the table's userMetadata, newest commit first). None: no such commit."""
    for text in history:
        mine = parse_metadata(text, app)
        if mine is not None and mine.get("covers") is not None:
            return position_from_json(mine["covers"])
    return None


def held_snapshot(history: Iterable[str | None], app: str) -> tuple[str, int] | None:
    """The (snapshot id, chunk) of the newest commit of the app that holds a snapshot's chunks
    (``history`` newest first): the table holds that snapshot up to that chunk, and no newer one.
    None: no commit of the app says (none of this sink's form, or no snapshot since)."""
    for text in history:
        mine = parse_metadata(text, app)
        if mine is not None and isinstance(mine.get("snapshot"), dict):
            return str(mine["snapshot"]["id"]), int(mine["snapshot"]["chunk"])
    return None


def needs_chunk(end: SnapshotPosition, partial: bool, held: tuple[str, int] | None,
                covers: Position | None) -> bool:
    """Whether a table still needs a snapshot's transaction ending at ``end`` (a chunk's rows, or
    at chunk 0 the ``snapshot_started`` that resets a merged table). With ``held``, its newest
    snapshot mark: a newer snapshot is needed whole, an older one not at all, the same one after
    its held chunk (from it, for a ``partial`` leading part). Without a mark (tables written
    before the marks), by ``covers``: a snapshot handing off before what the table covers was
    delivered to it already; one handing off there or later (a resnapshot at the checkpoint, a
    table added to the pipeline) was not."""
    if held is not None:
        sid, chunk = held
        if end.snapshot_id != sid:
            return end.snapshot_id > sid  # ids are time-ordered
        return end.chunk >= chunk if partial else end.chunk > chunk
    if covers is None:
        return True
    if isinstance(covers, SnapshotPosition) and covers.snapshot_id == end.snapshot_id:
        return end.chunk >= covers.chunk if partial else end.chunk > covers.chunk
    order = _order(end.handoff, log_position(covers))
    return True if order is None else order >= 0


def newest_txn(history: Iterable[str | None], app: str) -> int | None:
    """The txnVersion of the newest commit of the app (``history`` newest first), or None."""
    for text in history:
        mine = parse_metadata(text, app)
        if mine is not None and mine.get("txn") is not None:
            return int(mine["txn"])
    return None


def table_covers(table: Position | None, record: Position | None) -> Position | None:
    """What a table holds: the later of its own commits' ``covers`` and the sink's checkpoint record
    (written after every table of its sub-batch, so every table holds what it covers). Of two
    positions of different sources (an accepted gap), the table's own."""
    if table is None or record is None:
        return table or record
    return record if _order(record, table) == 1 else table


def record_after(end: Position, done: Position | None, entered: Callable[[str], bool]) -> Position | None:
    """The sink's record after a sub-batch ending at ``end``, over its record before, ``done``:
    the later of the two (after a rewind the tables still hold what they held), except inside a
    snapshot that ``done`` predates. A resnapshot starts with the sinks at its handoff, so a record
    at (or before) the handoff, as a log position, is either a sink that completed the snapshot
    there or one that had not entered it yet: ``entered(snapshot_id)`` (a snapshot mark of this
    or a newer snapshot on the sink's commits) tells them apart. Kept at the handoff, the record
    of a sink in its first chunks read as the snapshot completed, and a run killed after that
    commit left the rest of the chunks out of the sink for good (campaign seed 6013)."""
    if (isinstance(end, SnapshotPosition) and done is not None and not isinstance(done, SnapshotPosition)
            and _order(log_position(done), end.handoff) in (-1, 0) and not entered(end.snapshot_id)):
        return end
    return table_covers(end, done)


def needs(tx_end: Position, partial: bool, covers: Position | None) -> bool:
    """Whether a table that holds everything up to ``covers`` still needs a transaction ending at
    ``tx_end`` (``partial``: a leading part of a split transaction; see batching.Transaction)."""
    if covers is None:
        return True
    order = _order(tx_end, covers)
    return True if order is None else (order >= 0 if partial else order > 0)


def _order(a: Position, b: Position) -> int | None:
    """-1, 0 or 1 as ``a`` is before, at or after ``b``. Two positions of different servers
    are ordered by the transactions before them (``LogPosition.order_by_transactions``): a GTID
    failover since a table's last commit (found by the campaign, seed 5919: a run killed between
    two tables' commits, then the connection on the replica; the rerun wrote the transactions a
    table held again). None when that cannot be told: another server's log, an accepted gap."""
    try:
        return (a > b) - (a < b)
    except IncomparablePositionsError:
        if isinstance(a, LogPosition) and isinstance(b, LogPosition):
            return a.order_by_transactions(b)
        return None


__all__ = ["EPOCH_BITS", "commit_metadata", "covered_position", "held_snapshot", "needs", "needs_chunk",
           "newest_txn", "parse_metadata", "record_after", "table_covers", "txn_epoch", "txn_version"]
