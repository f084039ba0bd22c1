"""Continuity guards: loss is explicit, never silent (docs/architecture.md, "Continuity").

Before a run reads, the guards compare what the checkpoints assume with what the source
offers, in :data:`~tidegate.plan.GUARD_ORDER`: no incident is open (``halted``), the same
server is behind the connection (``failover``), its log still holds everything after the
lowest checkpoint (``retention``: a purged binlog, a dropped or invalidated Postgres slot),
and its settings are right (``preflight``). When changes may have been lost, a guard records
an incident with the exact missing range and raises :class:`ContinuityHalt`; the Airflow
operator turns that into a failure without retries, and every later run halts at
:func:`check_halted` until an operator resolves the incident with ``accept_gap`` and a reason
that is kept.

Where nothing can be lost (MySQL/MariaDB failover with GTIDs whose checkpoint GTID sets are
all on the new primary) the failover guard moves the checkpoints to the matching positions
on the new server, records the failover as an incident resolved automatically, and the run
goes on.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from . import snapshot
from .errors import ChangesLostError, ContinuityHalt, SourceError, TidegateError, halt_message
from .events import ControlMessage
from .plan import GUARD_ORDER, RESOLUTIONS
from .positions import Position, SnapshotPosition, later, log_position, oldest, position_to_json
from .run import RunContext
from .sink_checkpoints import adopt
from .sinks.base import Sink
from .sources.base import Source
from .sources.preflight import INFO, WARNING, raise_for_problems
from .store.records import Incident

log = logging.getLogger(__name__)

# Identity fields that change when the server behind a connection is another one.
IDENTITY_KEYS = ("kind", "server_id", "server_uuid", "system_id", "timeline")


# --------------------------------------------------------------------------- all guards


def run_guards(run: RunContext, checks: Sequence[str] = GUARD_ORDER) -> dict[str, Any]:
    """Resolve the open incidents when the plan says so, then run ``checks`` in
    :data:`GUARD_ORDER`. Raises :class:`ContinuityHalt` on a loss and SourceSettingError on a
    wrong setting; returns each check's result and the preflight warnings."""
    unknown = [c for c in checks if c not in GUARD_ORDER]
    if unknown:
        raise ValueError(f"unknown guard check(s) {unknown}; allowed: {', '.join(GUARD_ORDER)}")
    plan = run.plan
    with run.opened_store() as store:
        run = run.with_store(store)
        out: dict[str, Any] = {"resolved": [], "checks": {}, "warnings": [], "headroom": {}}
        if plan.resolve:
            out["resolved"] = resolve_incidents(run, resolution=plan.resolve, reason=plan.reason or "",
                                                who=plan.who, tables=plan.tables)
        for check in (c for c in GUARD_ORDER if c in checks):
            out["checks"][check] = _run_check(check, run, out)
        return out


def _run_check(check: str, run: RunContext, out: dict[str, Any]) -> Any:
    if check == "halted":
        check_halted(run)
        return {"status": "ok"}
    if check == "preflight":
        result = preflight(run)
        out["warnings"] += result.warnings
        out["headroom"] = result.headroom
        return {"status": "warnings" if result.warnings else "ok", "warnings": result.warnings,
                "headroom": result.headroom}
    guard = guard_failover if check == "failover" else guard_retention
    result = guard(run)
    log.info("pipeline %s: %s guard: %s", run.pipeline, check, result)
    return result


# --------------------------------------------------------------------------- halted


def check_halted(run: RunContext) -> None:
    with run.opened_store() as st:
        open_incidents = st.incidents.all(run.pipeline, unresolved_only=True)
    if open_incidents:
        raise ContinuityHalt(open_incidents[0])


def _halt(run: RunContext, kind: str, from_pos: Position | None, to_pos: Position | None,
          detail: str) -> None:
    """Record the incident (the missing range) on the run's store and halt."""
    inc = run.store.incidents.record(run.pipeline, kind, from_pos, to_pos, detail=detail, run_id=run.run_id)
    log.error("pipeline %s: %s", run.pipeline, halt_message(inc))
    raise ContinuityHalt(inc)


def _lowest_checkpoint(run: RunContext) -> Position | None:
    stored = run.store.checkpoints.current(run.pipeline)
    return oldest(stored[s.id].position for s in run.spec.sinks if s.id in stored)


# --------------------------------------------------------------------------- failover


def same_server(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in IDENTITY_KEYS)


def guard_failover(run: RunContext) -> dict[str, Any]:
    """Compare the source identity with the one the checkpoints belong to. On a change: a
    MySQL/MariaDB failover whose checkpoints' GTID sets are all on the new server continues
    (each sink's checkpoint, or its adoptable sink-side record, is translated by GTID set);
    anything else halts with the range."""
    spec = run.spec
    with run.opened() as (source, st):
        run = run.with_store(st)
        current = source.identity()
        stored = st.checkpoints.source_identity(spec.pipeline)
        if stored is None or not st.checkpoints.current(spec.pipeline):
            st.checkpoints.set_source_identity(spec.pipeline, current)
            return {"status": "recorded", "identity": current}
        if same_server(stored, current):
            return {"status": "ok", "identity": current}
        change = source.describe_change(stored)
        if not source.translates_positions:
            _halt(run, "failover", _lowest_checkpoint(run), source.head(),
                  change + ". Changes after the checkpoint may be missing.")
        return _gtid_failover(run, source, stored, current, change)


def _gtid_failover(run: RunContext, source: Source, old: Mapping[str, Any], new: Mapping[str, Any],
                   change: str) -> dict[str, Any]:
    spec, store, run_id = run.spec, run.store, run.run_id
    effective = effective_checkpoints(run, run.parts.sinks(spec))
    lowest_old = oldest(effective.values())
    moved, snapshots = {}, {}
    for sid, pos in sorted(effective.items()):
        if pos is None:
            continue  # no checkpoint yet: nothing to translate
        try:  # a sink inside a snapshot keeps its chunks; the snapshot's log positions move
            if isinstance(pos, SnapshotPosition):
                if pos.snapshot_id not in snapshots:
                    snapshots[pos.snapshot_id] = _snapshot_moved(run, source, pos.snapshot_id)
                moved[sid] = pos.with_handoff(snapshots[pos.snapshot_id][0])
            else:
                moved[sid] = source.translate(pos)
        except SourceError as exc:  # no GTIDs, GTIDs missing on the new server, or purged there
            _halt(run, "failover", lowest_old, source.head(),
                  f"{change}; the checkpoints cannot be placed on the new server without loss: "
                  f"sink {sid}: {exc}")
    # Before the checkpoints: a guard that dies in between places them again (a position already
    # on this server translates to itself).
    for snapshot_id, (handoff, uppers) in sorted(snapshots.items()):
        store.snapshots.move(spec.pipeline, snapshot_id, handoff, uppers)
    epoch = store.leases.acquire(spec.pipeline, run_id)
    reason = f"GTID failover: {change}; every checkpoint GTID set is on the new server"
    inc = store.incidents.record(spec.pipeline, "failover", lowest_old, oldest(moved.values()),
                                 run_id=run_id, detail=f"{change}; checkpoints translated by GTID set, "
                                 f"nothing lost", resolved=True, resolution="auto", who="tidegate",
                                 reason=reason)
    message = ControlMessage(spec.tenant, spec.pipeline, "failover", f"incident-{inc.id}",
                             position_to_json(inc.to_position), _now_ms(),
                             {"from_identity": dict(old), "to_identity": dict(new), "incident": inc.id})
    store.checkpoints.write_many(spec.pipeline, moved, run_id=run_id, epoch=epoch, kind="failover",
                                 reason=reason, who="tidegate", control=message.record())
    store.checkpoints.set_source_identity(spec.pipeline, new, epoch=epoch)
    _journal_failover(run, effective, moved)
    log.warning("pipeline %s: failover continued without loss (incident #%d): %s", spec.pipeline, inc.id,
                {k: str(v) for k, v in moved.items()})
    return {"status": "failover_continued", "identity": dict(new), "incident": inc.id,
            "checkpoints": {k: position_to_json(v) for k, v in moved.items()}}


def _snapshot_moved(run: RunContext, source: Source, snapshot_id: str
                    ) -> tuple[Position, dict[int, Position]]:
    """A snapshot some sink is in, placed on the new server: its handoff (the log after it is
    read from there) and its kept chunk reads' upper bounds (the log up to each is scanned for
    the keys it changed). Found by the campaign: a failover during a resnapshot left them on the
    old server, and every run after it failed comparing positions of two servers."""
    store, pipeline = run.store, run.pipeline
    rec = store.snapshots.get(pipeline, snapshot_id)
    kept = store.snapshots.kept_uppers(pipeline, snapshot_id)
    return source.translate(rec.handoff), {chunk: source.translate(upper) for chunk, upper in kept.items()}


def effective_checkpoints(run: RunContext, sinks: Sequence[Sink]) -> dict[str, Position | None]:
    """Where each sink really stands: its store checkpoint, or its sink-side record when the
    adoption rule takes it (a crash between the sink's commit and the store write). A required
    sink that cannot be read fails the guard (Airflow retries it); an optional one keeps its
    store checkpoint, with a warning that it may see a duplicate."""
    spec, stored = run.spec, run.store.checkpoints.current(run.pipeline)
    out: dict[str, Position | None] = {}
    for sink in sinks:
        rec = stored.get(sink.sink_id)
        try:
            side = sink.committed_checkpoint()
        except Exception as exc:
            if sink.required:
                raise
            log.warning("pipeline %s: optional sink %s cannot be read (%s); its store checkpoint is "
                        "used, it may receive a duplicate", spec.pipeline, sink.sink_id, exc)
            side = None
        finally:
            sink.close()
        adoption = adopt(rec, side)
        if adoption.adopted:
            log.warning("pipeline %s: sink %s: %s", spec.pipeline, sink.sink_id, adoption.why)
        out[sink.sink_id] = adoption.position
    return out


def _journal_failover(run: RunContext, old: Mapping[str, Position | None],
                      new: Mapping[str, Position]) -> None:
    store = run.store
    jid = store.runs.begin(run.pipeline, run.run_id, mode="failover")
    for sid, to in new.items():
        store.runs.sink(jid, sid, start=old.get(sid), end=to, events=0, bytes=0, status="translated")
    store.runs.finish(jid, "success")


# --------------------------------------------------------------------------- retention


def guard_retention(run: RunContext) -> dict[str, Any]:
    """The source's log still holds everything after the lowest checkpoint (MySQL/MariaDB: the
    binlog file was not purged; Postgres: the slot exists and lost no WAL, created on the
    pipeline's first run). Otherwise an incident of the loss's kind halts the pipeline."""
    spec = run.spec
    with run.opened() as (source, st):
        run = run.with_store(st)
        lowest = _lowest_checkpoint(run)
        try:
            return source.check_retention(None if lowest is None else log_position(lowest),
                                          first_run=not st.checkpoints.current(spec.pipeline))
        except ChangesLostError as exc:
            to = exc.earliest_available if exc.earliest_available is not None else source.head()
            _halt(run, exc.kind, lowest, to, str(exc))
            raise  # not reached: _halt raises


@dataclasses.dataclass(frozen=True)
class PreflightResult:
    """The preflight's warnings (sentences) and the source's retention headroom, as figures
    (``seconds``: MySQL/MariaDB binlog expiry minus the oldest checkpoint's age; ``bytes``:
    the PostgreSQL slot's safe_wal_size); a figure is absent when the source keeps its log
    without a limit."""

    warnings: list[str]
    headroom: dict[str, float]


def preflight(run: RunContext) -> PreflightResult:
    """Source settings and privileges (raises SourceSettingError on a hard problem) and
    retention headroom against the oldest sink checkpoint: a warning when it runs low, a figure
    on every run; figures worth knowing (the WAL a slot holds) are logged."""
    spec = run.spec
    with run.opened() as (source, st):
        sink_ids = {s.id for s in spec.sinks}
        stored = [r for sid, r in st.checkpoints.current(spec.pipeline).items() if sid in sink_ids]
        oldest_rec = min(stored, key=lambda r: r.position) if stored else None
        if oldest_rec is not None:  # a snapshot holds the log from its handoff
            oldest_rec = dataclasses.replace(oldest_rec, position=log_position(oldest_rec.position))
        problems = source.preflight(oldest_rec)
    raise_for_problems(problems)
    for p in problems:
        if p.severity == INFO:
            log.info("pipeline %s: preflight: %s", spec.pipeline, p.message)
    warnings = [p.message for p in problems if p.severity == WARNING]
    for w in warnings:
        log.warning("pipeline %s: %s", spec.pipeline, w)
    return PreflightResult(warnings, retention_headroom(problems))


def retention_headroom(problems: Sequence[Any]) -> dict[str, float]:
    """The headroom figures the preflight's retention findings carry."""
    out: dict[str, float] = {}
    for p in problems:
        if p.code != "retention":
            continue
        if p.detail.get("headroom_s") is not None:
            out["seconds"] = float(p.detail["headroom_s"])
        if p.detail.get("safe_wal_size") is not None:
            out["bytes"] = float(p.detail["safe_wal_size"])
    return out


# --------------------------------------------------------------------------- resolve


def resolve_incidents(run: RunContext, *, resolution: str, reason: str, who: str,
                      tables: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Resolve every open incident of the pipeline. ``accept_gap`` moves the checkpoints past
    the missing range (on a new server or a lost slot: to where streaming can resume) as new
    store versions, so no older sink-side record pulls a sink back; the range and the reason
    stay on record. ``resnapshot`` plans a snapshot of every table (or of ``tables``, on a
    healthy pipeline) that hands off to the log where it restarts (snapshot.py), also when
    no incident is open."""
    if resolution not in RESOLUTIONS:
        raise TidegateError(f"resolve must be one of {', '.join(RESOLUTIONS)}, not {resolution!r}")
    if not (reason or "").strip():
        raise TidegateError("resolve needs a reason (it is kept with the incident): set the "
                            "`reason` param when triggering the run")
    with run.opened() as (source, st):
        run, done = run.with_store(st), []
        incidents = st.incidents.all(run.pipeline, unresolved_only=True)
        for inc in incidents:  # check them all before resolving any
            _check_resolution(inc, resolution)
        if resolution == "resnapshot":  # plans the snapshot that re-loads what was lost
            _resnapshot(run, source, incidents, who=who, reason=reason, tables=tables)
        for inc in incidents:
            if resolution == "accept_gap":
                _accept_gap(run, source, inc, who, reason)
            done.append(st.incidents.resolve(inc.id, resolution=resolution, who=who, reason=reason).to_json())
        return done


def _resnapshot(run: RunContext, source: Any, incidents: Sequence[Incident], *, who: str, reason: str,
                tables: Sequence[str] | None) -> None:
    """Plan the resnapshot once per run id (a retried guard task does not plan a second one)."""
    spec, store, run_id = run.spec, run.store, run.run_id
    if any(r.kind == "resnapshot" and r.run_id == run_id for r in store.snapshots.all(spec.pipeline)):
        log.info("pipeline %s: run %s already planned its resnapshot", spec.pipeline, run_id)
        return
    snapshot.SnapshotPlanner.for_run(run, source).resnapshot(incidents=incidents, tables=tables, who=who,
                                                              reason=reason)


def _check_resolution(inc: Incident, resolution: str) -> None:
    """``continue`` goes on past a schema change; ``accept_gap`` accepts lost changes,
    ``resnapshot`` re-loads the tables over them."""
    if (inc.kind == "schema_change") != (resolution == "continue"):
        fit = "continue" if inc.kind == "schema_change" else "resnapshot or resolve=accept_gap"
        raise TidegateError(f"incident #{inc.id} is a {inc.kind}: resolve it with resolve={fit}, "
                            f"not resolve={resolution}")


def _accept_gap(run: RunContext, source: Any, inc: Incident, who: str, reason: str) -> None:
    spec, store, run_id = run.spec, run.store, run.run_id
    epoch = store.leases.acquire(spec.pipeline, run_id)
    if inc.kind == "failover":  # the new server's identity is the pipeline's from now on
        store.checkpoints.set_source_identity(spec.pipeline, source.identity(), epoch=epoch)
    if inc.kind == "binlog_purged":  # resume at the earliest position still on the server
        target = inc.to_position or source.earliest()
    else:  # a new server, or a lost slot: stream afresh (Postgres: a new slot)
        target = source.restart_stream()
    stored = store.checkpoints.current(spec.pipeline)
    # Every sink gets a new version owing the gap message: at the target, or where it already is
    # when a purge left it ahead of the gap.
    moves = {s.id: target if s.id not in stored or inc.kind != "binlog_purged"
             else later(stored[s.id].position, target) for s in spec.sinks}
    gap = ControlMessage(spec.tenant, spec.pipeline, "gap", f"incident-{inc.id}", position_to_json(target),
                         _now_ms(), {"from": position_to_json(inc.from_position),
                                     "to": position_to_json(inc.to_position), "reason": reason,
                                     "incident": inc.id, "kind": inc.kind, "resolved_by": who})
    store.checkpoints.write_many(spec.pipeline, moves, run_id=run_id, epoch=epoch, kind="accept_gap",
                                 reason=f"incident #{inc.id} ({inc.kind}): {reason}", who=who,
                                 control=gap.record())
    log.warning("pipeline %s: incident #%d (%s) accepted; checkpoints of %s moved to %s", spec.pipeline,
                inc.id, inc.kind, ", ".join(sorted(moves)) or "no sink", target)


def _now_ms() -> int:
    return int(time.time() * 1000)
