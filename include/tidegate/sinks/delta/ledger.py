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
  A table's commit also says ``since``: up to where the sink took the table to hold its changes
  before it, which tells a RESTORE in between (below).
- ``snapshot`` (a sub-batch that holds a snapshot's chunks): the snapshot's id and the highest
  chunk the sub-batch holds. A snapshot is not the log: a resnapshot of a healthy pipeline hands
  off at the sinks' checkpoint, so its chunks lie before what a table covers, yet the table has
  never held them. Which snapshot's chunks a table holds is therefore read from these marks
  (:func:`held_snapshot`, :func:`needs_chunk`), not from ``covers``.

A table's history is read as its lineage (:func:`lineage`): a ``RESTORE TABLE`` (Delta's undo) to
version V undoes every commit after V before it, so what the table holds is read from the commits
it still descends from, and changes of the sink a RESTORE undid and no later commit gave back
(:func:`restore_loss`) are a loss the sink tells (docs/architecture.md, "A Delta table restored
behind the sink").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

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


# A run reads a table's lineage again after this many commits to it (sink.told_if_restored): fewer
# than the newest commits a run reads first (Tables.lineage's 50), so a RESTORE made while a run
# writes the table is told by that run or the next.
RECHECK_COMMITS = 20

UNSAID = object()  # commit_metadata's ``since`` of a commit that is not a table's


def commit_metadata(*, app: str, pipeline: str, sink: str, epoch: int | None, extends: int,
                    covers: Position | None, controls: list[dict[str, Any]] | None = None,
                    claim: bool = False, snapshot: SnapshotPosition | None = None,
                    since: Position | None | object = UNSAID) -> str:
    """The ``userMetadata`` of one commit (JSON): who wrote it, its txnVersion, what it covers,
    the last snapshot chunk its sub-batch holds (``snapshot``) and, for a table's commit, up to
    where the sink took the table to hold its changes before it (``since``; None: none of them),
    which tells a table restored in between (:func:`restore_loss`)."""
    meta: dict[str, Any] = {"tidegate": {
        "app": app, "pipeline": pipeline, "sink": sink, "epoch": epoch, "extends": extends,
        "txn": txn_version(epoch, extends), "covers": position_to_json(covers)}}
    if since is not UNSAID:
        meta["tidegate"]["since"] = position_to_json(since)  # type: ignore[arg-type]
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


@dataclass(frozen=True)
class Commit:
    """One commit of a table's history: its version, its userMetadata, and for a RESTORE the
    version it took the table back to (None for any other commit)."""

    version: int
    meta: str | None
    restored: int | None = None


def lineage(commits: Iterable[Commit]) -> tuple[list[Commit], list[Commit]]:
    """The commits the table's current state descends from, and those a RESTORE undid, each newest
    first. A RESTORE at version R to version V undoes the commits between the two; a RESTORE that a
    later one undid undoes nothing."""
    kept: list[Commit] = []
    undone: list[Commit] = []
    ceiling: int | None = None  # commits above it were undone
    for c in sorted(commits, key=lambda c: -c.version):
        if ceiling is not None and c.version > ceiling:
            undone.append(c)
            continue
        kept.append(c)
        if c.restored is not None:
            ceiling = c.restored if ceiling is None else min(ceiling, c.restored)
    return kept, undone


def restored_version(row: Any, rows: Sequence[Any]) -> int | None:
    """The version a RESTORE commit (a row of DESCRIBE HISTORY) took its table back to, None for any
    other commit. A RESTORE to a timestamp restored the newest version committed at or before it;
    one whose parameters say neither is taken as undoing every earlier commit (-1), so that a loss
    is told rather than missed."""
    if row["operation"] != "RESTORE":
        return None
    params = row["operationParameters"] or {}
    if params.get("version") is not None:
        return int(params["version"])
    try:
        ts = datetime.fromisoformat(str(params.get("timestamp")))
        return max((r["version"] for r in rows if r["version"] < row["version"] and r["timestamp"] <= ts),
                   default=-1)
    except (TypeError, ValueError):  # not a time, or one with an offset where the history has none
        return -1


def read_lineage(read: Callable[[int | None], Sequence[Any] | None], app: str,
                 limit: int | None = 50) -> tuple[list[Commit], list[Commit]]:
    """A table's lineage (:func:`lineage`) from its newest ``limit`` commits: ``read(n)`` gives
    the newest ``n`` rows of its history (None: all; rows as DESCRIBE HISTORY gives them, newest
    first; None: no table). The whole history when none of those is the app's, or one is a
    RESTORE (whose undoing, and another older one's, may reach further back). A RESTORE with
    ``limit`` or more commits after it is not read: the sink reads a table's lineage again within
    fewer commits of a run (:data:`RECHECK_COMMITS`), so a RESTORE is told before it leaves the window."""
    rows = read(limit)
    if rows is None:
        return [], []
    restores = any(r["operation"] == "RESTORE" for r in rows)
    if limit and len(rows) >= limit and (restores or all(
            parse_metadata(r["userMetadata"], app) is None for r in rows)):
        return read_lineage(read, app, None)
    commits = [Commit(r["version"], r["userMetadata"], restored_version(r, rows) if restores else None)
               for r in rows]
    return lineage(commits)


class Loss(NamedTuple):
    """What RESTOREs took from a table of the app's changes (:func:`restore_loss`): it holds them
    without a break up to ``held`` (None: none of them), and the undone commits had covered up to
    ``lost``; ``written``: the ``(since, covers]`` ranges of commits made after a RESTORE, which
    it holds too (a changelog written again from ``held`` skips them: :func:`held_in`; a merged
    table is written them again, after what it lacks)."""

    held: Position | None
    lost: Position
    written: tuple[tuple[Position, Position], ...] = ()


def restore_loss(kept: list[Commit], undone: list[Commit], app: str) -> Loss | None:
    """What RESTOREs took from a table of the app's changes and no commit has given back; None
    when nothing is missing. ``kept``, ``undone``: :func:`lineage`'s.

    Per RESTORE in the lineage that undid commits of the app covering past the newest kept one
    before it (``held``): lost, unless a commit after it says the sink wrote the table from
    ``held`` or before (its ``since``: after a rewind, or an operator's choice to go on without
    them) and the commits since then reach what was undone. A commit after it written from
    further on (a RESTORE between two sub-batches of one run, whose next commit knew nothing of
    it) gives nothing back. Commits of the sink's form before ``since`` count as written from
    ``held``. Positions that cannot be ordered (an accepted gap since) tell no loss: told, it
    would be told at every run."""
    losses = []
    for i, r in enumerate(kept):
        if r.restored is None:
            continue
        lost = _latest(_covers(c, app) for c in undone if r.restored < c.version < r.version)
        held = next((p for c in kept[i + 1:] if (p := _covers(c, app)) is not None), None)
        if lost is None or (held is not None and _order(lost, held) != 1):
            continue
        newer = [m for c in kept[:i] if (m := parse_metadata(c.meta, app)) and m.get("covers") is not None]
        loss = _after_restore(held, lost, newer)
        if loss is not None:
            losses.append(loss)
    if not losses:
        return None
    held = None if any(x.held is None for x in losses) else _earliest(x.held for x in losses)
    return Loss(held, _latest(x.lost for x in losses), tuple(r for x in losses for r in x.written))


def _after_restore(held: Position | None, lost: Position, newer: list[dict[str, Any]]) -> Loss | None:
    """The loss of a RESTORE that undid changes up to ``lost`` past ``held``, given the app's
    commits after it (``newer``: their metadata, newest first)."""
    written = tuple((position_from_json(m["since"]), position_from_json(m["covers"]))
                    for m in newer if m.get("since") is not None)
    if not newer:
        return Loss(held, lost)
    if any("since" not in m or _at_or_before(m["since"], held) for m in newer):
        now = position_from_json(newer[0]["covers"])  # written from held on: it holds up to here
        return Loss(now, lost, written) if _order(lost, now) == 1 else None
    return Loss(held, lost, written)


def held_in(tx_end: Position, partial: bool, written: Iterable[tuple[Position, Position]]) -> bool:
    """Whether a transaction ending at ``tx_end`` lies in one of the ``(since, covers]`` ranges a
    table holds (:class:`Loss`)."""
    return any(needs(tx_end, partial, since) and not needs(tx_end, partial, covers)
               for since, covers in written)


def _covers(c: Commit, app: str) -> Position | None:
    mine = parse_metadata(c.meta, app)
    return position_from_json(mine["covers"]) if mine is not None and mine.get("covers") is not None else None


def _at_or_before(since: Any, held: Position | None) -> bool:
    """Whether a commit's ``since`` (JSON; None: from nothing) lies at or before ``held``."""
    if since is None:
        return True
    return held is not None and _order(position_from_json(since), held) in (-1, 0)


def _latest(positions: Iterable[Position | None]) -> Position | None:
    out = None
    for p in positions:
        if p is not None and (out is None or _order(p, out) == 1):
            out = p
    return out


def _earliest(positions: Iterable[Position]) -> Position:
    out = None
    for p in positions:
        if out is None or _order(p, out) == -1:
            out = p
    return out


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


__all__ = ["EPOCH_BITS", "UNSAID", "Commit", "Loss", "commit_metadata", "covered_position", "held_in",
           "held_snapshot", "lineage", "needs", "needs_chunk", "newest_txn", "parse_metadata", "record_after",
           "restore_loss", "restored_version", "table_covers", "txn_epoch", "txn_version"]
