"""Sink-side checkpoint records and the rule that decides whether one is adopted.

The checkpoint store is the authority over where each sink stands. Some sinks also record a
position next to their data, atomically with it (Kafka exactly-once: a record in the
compacted checkpoint topic inside the same transaction; Redis: a key set in the same
MULTI/EXEC; NATS: headers on the last message of a sub-batch). Those records exist for a
crash after the sink committed and before the store write: without them the next run would
deliver that sub-batch again. They also tell a sink that lost what it had acknowledged
(:func:`lost_by_sink`: its record missing, or behind the store's delivered version).

A sink-side record therefore names the store version it *extends*: the version of the sink's
checkpoint in the store when the delivery began (0 when the sink had none). On open, a record
is adopted only when it extends the store's current version for that sink and lies ahead of
it in the same lineage. Every store move that is not a delivery (failover translation,
rewind, accept_gap, resnapshot) writes a new version, so no older record extends it: an
operator's decision always binds the sinks, and a record from another server is never read
as a coordinate of the new one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import TidegateError
from .positions import (
    Position,
    SnapshotPosition,
    describe_lineage,
    lineage_of_identity,
    position_from_json,
    position_to_json,
    same_lineage,
)
from .store.records import CheckpointRecord


class RewindRefused(TidegateError):
    """A rewind that cannot be made as asked (no such version, a version from before a
    failover): asking again gives the same answer."""

    fatal = True


@dataclass(frozen=True)
class SinkCheckpoint:
    """What a sink records beside its data: the position after the last sub-batch it committed
    and the store version of its checkpoint that this delivery extends (None: a record written
    before versions existed, never adopted)."""

    position: Position
    extends: int | None

    def to_json(self) -> dict[str, Any]:
        return {"position": position_to_json(self.position), "extends": self.extends}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def loads(cls, text: str | bytes) -> SinkCheckpoint:
        """Parse a record; a bare position (the format before versions) has ``extends=None``."""
        d = json.loads(text)
        if "position" in d:
            return cls(position_from_json(d["position"]), d.get("extends"))
        return cls(position_from_json(d), None)


@dataclass(frozen=True)
class Adoption:
    """Where a sink starts and why: ``position`` is the store's checkpoint, or the sink-side
    record's position when ``adopted``."""

    position: Position | None
    adopted: bool
    why: str


def adopt(stored: CheckpointRecord | None, side: SinkCheckpoint | None) -> Adoption:
    """The adoption rule (see the module docstring)."""
    base = stored.position if stored is not None else None
    version = stored.version if stored is not None else 0
    if side is None:
        return Adoption(base, False, "no sink-side record")
    if side.extends is None:
        return Adoption(base, False, "sink-side record without a store version (ignored)")
    if side.extends != version:
        return Adoption(base, False, f"sink-side record extends version {side.extends}, the store "
                                     f"is at version {version} (ignored)")
    if base is not None and not same_lineage(base, side.position):
        return Adoption(base, False, f"sink-side record at {side.position} is from another source "
                                     f"identity than the store's {base} (ignored)")
    if base is not None and stored.control and side.position == base:
        return Adoption(base, True, f"sink-side record extends version {version} at its own position: "
                                    f"the sink has the control message that version owed it")
    if base is not None and not side.position > base:
        return Adoption(base, False, f"sink-side record at {side.position} is not ahead of the "
                                     f"store's {base}")
    return Adoption(side.position, True, f"sink-side record at {side.position} extends version "
                                         f"{version}: the sink committed it after the last store write")


def lost_by_sink(stored: CheckpointRecord | None, side: SinkCheckpoint | None,
                 history: Sequence[CheckpointRecord], *, exact: bool) -> tuple[str, int | None] | None:
    """What a sink that keeps a record with its data has lost: a sentence saying so, and the
    version whose rewind delivers it again (the record gone: the version before the sink's first
    delivery, as if it lost all it was sent; None when there is none); None when its record
    agrees with the store.

    A record missing where the store's current version was written by a delivery (or an
    adoption of the sink's record) means the sink's data may be gone: a server that restarted
    empty, a stream deleted. ``exact``: the sink's record follows every version a delivery
    writes (the coordinator calls the sink even for a sub-batch of positions only), each
    overwriting the last; then a record extending a version older than the one before the
    current one means the sink lost writes it had acknowledged (a server restored from an
    older snapshot or backup), and so does one before what a rewind restored
    (:func:`_lost_before_rewind`). Other sinks get no call for positions only, so their record
    lags legitimately and only its absence is told. What the record says the sink holds is
    delivered again by a rewind to the newest version at or before it. ``history``: the
    sink's versions in the store, oldest first."""
    if stored is None:
        return None
    if stored.kind == "rewind":
        return _lost_before_rewind(stored, side, history) if exact else None
    if stored.kind not in ("write", "adopt"):
        return None  # the guard's or a snapshot's move: no delivery wrote a record for it
    if side is not None and (not exact or side.extends is None or side.extends >= stored.version - 1):
        return None
    return _lost(stored, side, history)


def _lost_before_rewind(stored: CheckpointRecord, side: SinkCheckpoint | None,
                        history: Sequence[CheckpointRecord]) -> tuple[str, int | None] | None:
    """After a rewind the sink must still hold at least what the rewind restored (its record was
    at the checkpoint it replaced, which is not before): one that holds less lost changes the
    rewind does not deliver again (an operator who rewound before a run told the loss). Not
    after a rewind to the version it replaced, which moves nothing: the way an operator goes on
    without what a sink lost."""
    if stored.source_version == stored.version - 1:
        return None
    if side is None:  # lost only if the version restored had been delivered to it (campaign seed 9704)
        restored = stored.source_version or 0
        return _lost(stored, side, history) if any(
            r.kind in ("write", "adopt") and r.version <= restored for r in history) else None
    if not same_lineage(side.position, stored.position) or _at_or_before(stored.position, side.position):
        return None
    return _lost(stored, side, history)


def _lost(stored: CheckpointRecord, side: SinkCheckpoint | None,
          history: Sequence[CheckpointRecord]) -> tuple[str, int | None]:
    target = version_holding(history, stored.version, side.position if side is not None else None)
    if side is None:  # what it still holds is unknown: the rewind named assumes nothing
        return (f"sink {stored.sink_id} keeps no checkpoint record of its own, yet the store says it "
                f"{_holds(stored)} {stored.position} (version {stored.version}): the sink's data may "
                f"have been lost (a server restarted empty, a stream deleted?); the rewind that delivers "
                f"the missing changes again assumes it lost all it was sent"
                f"{_snapshots_in(history, target, stored)}"), target
    return (f"sink {stored.sink_id}'s own checkpoint record is at {side.position} (extending version "
            f"{side.extends}), behind the store, which says it {_holds(stored)} {stored.position} "
            f"(version {stored.version}): the sink lost changes it had acknowledged (a server restored "
            f"from an older snapshot or backup?){_snapshots_in(history, target, stored)}"), target


def version_holding(history: Sequence[CheckpointRecord], current: int, held: Position | None) -> int | None:
    """The version whose rewind delivers again what a sink holding changes up to ``held`` lacks:
    the newest before ``current`` at or before it; with ``held`` None (it holds nothing, or it
    cannot say), the one before the sink's first delivery, as if it lost all it was sent. None
    when there is none (rewind to a version the operator picks). ``history``: oldest first."""
    if held is None:
        first = next((r.version for r in history if r.kind in ("write", "adopt")), None)
        before = [r.version for r in history if first is not None and r.version < first]
        return before[-1] if before else None
    return next((r.version for r in reversed(history)
                 if r.version < current and _at_or_before(r.position, held)), None)


@dataclass(frozen=True)
class RunStart:
    """Where a run delivers a sink from, as the coordinator found it once the sink was open: the
    start of the sink's range, the store's current version of its checkpoint and that
    checkpoint's history (oldest first). For a sink that finds on its own, while it delivers,
    that it lost what it was given (a Delta table restored behind it): whether this run's range
    delivers it again, whether an operator chose to go on without it, and which rewinds to name."""

    position: Position | None
    current: CheckpointRecord | None
    history: tuple[CheckpointRecord, ...] = ()

    @property
    def going_on(self) -> bool:
        """Whether the current version is a rewind to the version it replaced: it moves nothing,
        and is how an operator goes on without what a sink lost (as for :func:`lost_by_sink`)."""
        c = self.current
        return c is not None and c.kind == "rewind" and c.source_version == c.version - 1

    def delivers_after(self, held: Position | None) -> bool:
        """Whether the range starts at or before ``held`` (None: from nothing), so that a part of
        the sink holding changes up to ``held`` gets every change it lacks in this run."""
        if self.position is None:
            return True
        return held is not None and _at_or_before(self.position, held)

    def rewinds(self, pipeline: str, sink_id: str, held: Position | None) -> tuple[str, str]:
        """The two commands an operator chooses between: the rewind that delivers again what a
        part of the sink holding changes up to ``held`` lacks, and the one that goes on without."""
        current = self.current.version if self.current is not None else None
        again = version_holding(self.history, current, held) if current is not None else None
        return rewind_command(pipeline, sink_id, again), rewind_command(pipeline, sink_id, current)


def _snapshots_in(history: Sequence[CheckpointRecord], after: int | None, stored: CheckpointRecord) -> str:
    """What the lost range holds of snapshots: a rewind delivers the rows of one that still runs
    again (from its start), not of one that has completed since (operations.md, "Rewinding a
    sink")."""
    ids = sorted({r.position.snapshot_id for r in history
                  if (after or 0) < r.version <= stored.version and isinstance(r.position, SnapshotPosition)})
    if not ids:
        return ""
    return (f"; the lost range holds rows of snapshot {', '.join(ids)}: if it has completed, no rewind "
            f"delivers them again, so resolve with resnapshot of its tables after the rewind")


def _holds(stored: CheckpointRecord) -> str:
    if stored.kind == "rewind":
        return f"holds what a rewind to version {stored.source_version} restored, up to"
    return "received changes up to"


def rewind_command(pipeline: str, sink_id: str, version: int | None) -> str:
    return (f"tidegate checkpoints rewind {pipeline} {sink_id} --to-version "
            f"{'N' if version is None else version} --reason ...")


def _at_or_before(pos: Position, held: Position) -> bool:
    """Whether a store version's position lies at or before what the sink holds (False when the
    two are not positions of one log)."""
    if not same_lineage(pos, held):
        return False
    try:
        return not held < pos
    except TypeError:
        return False


def delivering_attempt(store: Any, pipeline: str, sink_id: str, was: Position | None, *,
                       before: int | None) -> int | None:
    """The journal entry to credit with an adopted stretch that starts at ``was``: the newest
    journaled attempt of a run (not a replay; older than journal ``before``) that journaled this
    sink, when it left the sink at ``was``; the attempt that delivered the stretch. Its entry then
    ends where the record does, so a clear of that run re-sends the stretch with the rest of what
    it delivered. None when no attempt fits (one killed before its first checkpoint write
    journaled nothing): the adopting run takes the stretch."""
    last = store.runs.last_attempt(pipeline, sink_id, before=before)
    return last[0] if last is not None and last[2] == was else None


def rewind(store: Any, pipeline: str, sink_id: str, to_version: int, *, reason: str,
           who: str | None, check_held: Callable[[Position], None] | None = None
           ) -> tuple[CheckpointRecord, CheckpointRecord]:
    """Restore the position of an earlier version as a new version; returns (the version that
    was current, the new one). The new version extends nothing any sink recorded, so the next
    run delivers everything after the restored position again, to every sink kind. A version
    from before a failover is refused: its position belongs to the old server. ``check_held``
    raises when the source no longer holds the log after the restored position (asked last,
    before the version is written)."""
    current = store.checkpoints.get(pipeline, sink_id)
    target = store.checkpoints.version(pipeline, sink_id, to_version)
    if current is None or target is None:
        raise RewindRefused(f"{pipeline}::sink::{sink_id} has no version {to_version} "
                            f"(`tidegate checkpoints history {pipeline} {sink_id}` lists them)")
    now = lineage_of_identity(store.checkpoints.source_identity(pipeline))
    was = target.position.lineage
    if now is not None and was is not None and was != now:
        raise RewindRefused(
            f"version {to_version} of {pipeline}::sink::{sink_id} is a position on "
            f"{describe_lineage(was)}, but the pipeline now reads {describe_lineage(now)} (a "
            f"failover happened since): rewind to a version written after the failover")
    restored = restored_position(store, pipeline, sink_id, target)
    if check_held is not None:
        check_held(restored)
    return current, store.checkpoints.rewind(pipeline, sink_id, to_version, reason=reason, who=who,
                                             position=restored)


def restored_position(store: Any, pipeline: str, sink_id: str, target: CheckpointRecord) -> Position:
    """What a rewind to ``target`` restores: the version's position, unless the sink entered a
    snapshot after that version and the snapshot still runs. A log position at or before the
    snapshot's handoff would then place the sink outside it, and a sink at the handoff counts as
    having completed it: the chunks it had not got yet would never reach it (campaign seed 5998:
    Kafka, rewound to the version just before a resnapshot while the snapshot ran, lacked 7 of
    its rows). So a version at the handoff restores the snapshot's start (its chunks again, then
    the log after the handoff: what the sink got after that version), and a version before it
    is refused: what followed it (the log up to the handoff, then the snapshot) is not one
    position. A completed snapshot is not read again (docs/operations.md, "Rewinding a sink")."""
    pos = target.position
    if isinstance(pos, SnapshotPosition):
        return pos
    entered = next((r for r in store.checkpoints.history(pipeline, sink_id)
                    if r.version > target.version and isinstance(r.position, SnapshotPosition)), None)
    snap = entered and store.snapshots.get(pipeline, entered.position.snapshot_id)
    if not snap or snap.status != "running" or not same_lineage(pos, snap.handoff) or pos > snap.handoff:
        return pos
    if pos == snap.handoff:
        return SnapshotPosition(snap.snapshot_id, 0, snap.handoff)
    raise RewindRefused(
        f"version {target.version} of {pipeline}::sink::{sink_id} is at {pos}, before the handoff "
        f"{snap.handoff} of snapshot {snap.snapshot_id}, which the sink entered at version "
        f"{entered.version} and which is still running: restoring it would leave the rest of the "
        f"snapshot out. Rewind to version {entered.version} (the snapshot's chunks again, then every "
        f"change after its handoff) or, once the snapshot has completed, to version {target.version} "
        f"(the log after it again, without the snapshot's rows)")


__all__ = ["Adoption", "RunStart", "SinkCheckpoint", "adopt", "delivering_attempt", "lost_by_sink",
           "restored_position", "rewind", "rewind_command", "version_holding"]
