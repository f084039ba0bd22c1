"""Continuity guards: loss is explicit, never silent (DESIGN.md, "Continuity").

Before a run reads, the guards compare what the checkpoints assume with what the source
offers: the same server (failover), the Postgres slot still there and whole (slot drop or
invalidation), the checkpoint's binlog still on the server (purge). When changes may have
been lost, a guard records an incident with the exact missing range and raises
:class:`ContinuityHalt`; the Airflow operator turns that into a failure without retries, and
every later run halts at :func:`check_halted` until an operator resolves the incident with
``accept_gap`` (or ``resnapshot``) and a reason that is kept.

Where nothing can be lost (MySQL/MariaDB failover with GTIDs whose checkpoint GTID sets are
all on the new primary) the failover guard moves the checkpoints to the matching positions
on the new server, records the failover as an incident resolved automatically, and the run
goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from .checkpoints import adopt
from .errors import SlotInvalidatedError, SlotMissingError, SourceError, TidegateError
from .positions import BinlogPosition, Position, check_comparable, position_to_json
from .runner import Resolver, _opened, build_sinks, find_spec
from .sinks.base import Sink
from .sources.base import Source
from .spec import PipelineSpec
from .store import CheckpointStore
from .store.records import Incident

log = logging.getLogger(__name__)

RESOLUTIONS = ("accept_gap", "resnapshot")
# Identity fields that change when the server behind a connection is another one.
IDENTITY_KEYS = ("kind", "server_id", "server_uuid", "system_id", "timeline")


class ContinuityHalt(TidegateError):
    """The pipeline must not run: changes may have been lost (an incident records the range)."""

    def __init__(self, incident: Incident, message: str | None = None):
        self.incident = incident
        super().__init__(message or halt_message(incident))


def halt_message(inc: Incident) -> str:
    return (f"pipeline {inc.pipeline!r} is halted by incident #{inc.id} ({inc.kind}, detected "
            f"{inc.detected_at}): changes from {_pos(inc.from_position)} to {_pos(inc.to_position)} "
            f"may be missing{': ' + inc.detail if inc.detail else ''}. Resolve it by triggering "
            f"the DAG with resolve=accept_gap (or resnapshot) and a reason.")


def _pos(p: Position | None) -> str:
    return "the beginning" if p is None else str(p)


# --------------------------------------------------------------------------- halted


def check_halted(pipeline: str | PipelineSpec, *, store: CheckpointStore | None = None) -> None:
    spec = find_spec(pipeline)
    from .store import open_store

    st = store or open_store()
    try:
        open_incidents = st.incidents(spec.pipeline, unresolved_only=True)
    finally:
        if store is None:
            st.close()
    if open_incidents:
        raise ContinuityHalt(open_incidents[0])


def _halt(store: CheckpointStore, spec: PipelineSpec, kind: str, from_pos: Position | None,
          to_pos: Position | None, detail: str, run_id: str) -> None:
    inc = store.record_incident(spec.pipeline, kind, from_pos, to_pos, detail=detail, run_id=run_id)
    log.error("pipeline %s: %s", spec.pipeline, halt_message(inc))
    raise ContinuityHalt(inc)


def _lowest_checkpoint(store: CheckpointStore, spec: PipelineSpec) -> Position | None:
    stored = store.checkpoints(spec.pipeline)
    positions = [stored[s.id].position for s in spec.sinks if s.id in stored]
    return min(positions) if positions else None


# --------------------------------------------------------------------------- failover


def same_server(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in IDENTITY_KEYS)


def describe_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """What changed behind the source connection, in words an operator can act on."""
    if new.get("kind") == "postgres":
        if old.get("system_id") != new.get("system_id"):
            return (f"the connection now reaches another PostgreSQL cluster (system identifier "
                    f"{old.get('system_id')} -> {new.get('system_id')}); its WAL is not the one the "
                    f"checkpoints point into and the replication slot is not there")
        return (f"the server moved from timeline {old.get('timeline')} to {new.get('timeline')}: a "
                f"standby was promoted, and a logical replication slot does not survive a promotion")
    what = [f"server_id {old.get('server_id')} -> {new.get('server_id')}"]
    if old.get("server_uuid") != new.get("server_uuid"):
        what.append(f"server_uuid {old.get('server_uuid')} -> {new.get('server_uuid')}")
    return f"the connection now reaches another MySQL/MariaDB server ({', '.join(what)})"


def guard_failover(pipeline: str | PipelineSpec, *, run_id: str, resolve: Resolver | None = None,
                   store: CheckpointStore | None = None, sinks: Sequence[Sink] | None = None
                   ) -> dict[str, Any]:
    """Compare the source identity with the one the checkpoints belong to. On a change: a
    MySQL/MariaDB failover whose checkpoints' GTID sets are all on the new server continues
    (each sink's checkpoint, or its adoptable sink-side record, is translated by GTID set);
    anything else halts with the range. ``sinks`` (tests): the sinks whose records to read."""
    spec = find_spec(pipeline)
    with _opened(spec, resolve, store) as (source, st):
        current = source.identity()
        stored = st.get_source_identity(spec.pipeline)
        if stored is None or not st.checkpoints(spec.pipeline):
            st.set_source_identity(spec.pipeline, current)
            return {"status": "recorded", "identity": current}
        if same_server(stored, current):
            return {"status": "ok", "identity": current}
        change = describe_change(stored, current)
        if spec.source.kind != "mysql":
            _halt(st, spec, "failover", _lowest_checkpoint(st, spec), source.head(),
                  change + ". Changes after the checkpoint may be missing.", run_id)
        return _gtid_failover(spec, st, source, stored, current, change, run_id,
                              sinks if sinks is not None else build_sinks(spec, resolve=resolve))


def _gtid_failover(spec: PipelineSpec, store: CheckpointStore, source: Source, old: Mapping[str, Any],
                   new: Mapping[str, Any], change: str, run_id: str, sinks: Sequence[Sink]
                   ) -> dict[str, Any]:
    effective = effective_checkpoints(spec, store, sinks)
    lowest_old = min((p for p in effective.values() if p is not None), default=None)
    moved = {}
    for sid, pos in sorted(effective.items()):
        if pos is None:
            continue  # no checkpoint yet: nothing to translate
        problem = _untranslatable(pos)
        if problem is None:
            try:
                moved[sid] = source.resume_point_for_gtids(pos.gtid_set)
            except SourceError as exc:  # GTIDs missing on the new server, or purged there
                problem = f"sink {sid}: {exc}"
        if problem is not None:
            _halt(store, spec, "failover", lowest_old, source.head(),
                  f"{change}; the checkpoints cannot be placed on the new server without loss: "
                  f"{problem}", run_id)
    epoch = store.acquire_lease(spec.pipeline, run_id)
    reason = f"GTID failover: {change}; every checkpoint GTID set is on the new server"
    store.write_checkpoints(spec.pipeline, moved, run_id=run_id, epoch=epoch, kind="failover",
                            reason=reason, who="tidegate")
    store.set_source_identity(spec.pipeline, new, epoch=epoch)
    lowest_new = min(moved.values(), default=None)
    inc = store.record_incident(spec.pipeline, "failover", lowest_old, lowest_new, run_id=run_id,
                                detail=f"{change}; checkpoints translated by GTID set, nothing lost",
                                resolved=True, resolution="auto", who="tidegate", reason=reason)
    _journal_failover(store, spec, run_id, effective, moved)
    log.warning("pipeline %s: failover continued without loss (incident #%d): %s", spec.pipeline, inc.id,
                {k: str(v) for k, v in moved.items()})
    return {"status": "failover_continued", "identity": dict(new), "incident": inc.id,
            "checkpoints": {k: position_to_json(v) for k, v in moved.items()}}


def _untranslatable(pos: Position) -> str | None:
    if not isinstance(pos, BinlogPosition) or pos.gtid_set is None:
        return (f"checkpoint {pos} carries no GTID set (GTIDs off on the old server?), so it has no "
                f"meaning on another server")
    return None


def effective_checkpoints(spec: PipelineSpec, store: CheckpointStore, sinks: Sequence[Sink]
                          ) -> dict[str, Position | None]:
    """Where each sink really stands: its store checkpoint, or its sink-side record when the
    adoption rule takes it (a crash between the sink's commit and the store write). A required
    sink that cannot be read fails the guard (Airflow retries it); an optional one keeps its
    store checkpoint, with a warning that it may see a duplicate."""
    stored = store.checkpoints(spec.pipeline)
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


def _journal_failover(store: CheckpointStore, spec: PipelineSpec, run_id: str,
                      old: Mapping[str, Position | None], new: Mapping[str, Position]) -> None:
    jid = store.journal_begin(spec.pipeline, run_id, mode="failover")
    for sid, to in new.items():
        store.journal_sink(jid, sid, from_position=old.get(sid), to_position=to, events=0, bytes=0,
                           status="translated")
    store.journal_finish(jid, "success")


# --------------------------------------------------------------------------- slot / purge


def guard_slot(pipeline: str | PipelineSpec, *, run_id: str, resolve: Resolver | None = None,
               store: CheckpointStore | None = None) -> dict[str, Any]:
    """Postgres: the slot exists and has not lost WAL. A pipeline with no checkpoint yet gets
    its slot created here (logged); afterwards a missing slot is an incident."""
    spec = find_spec(pipeline)
    if spec.source.kind != "postgres":
        return {"status": "not_applicable"}
    with _opened(spec, resolve, store) as (source, st):
        lowest = _lowest_checkpoint(st, spec)
        try:
            health = source.check_slot(lowest)
        except SlotMissingError as exc:
            if not st.checkpoints(spec.pipeline):  # the pipeline's first run: create it
                created = source.ensure_slot()
                return {"status": "created", "slot": source.slot, "at": position_to_json(created)}
            _halt(st, spec, "slot_dropped", lowest, source.head(), str(exc), run_id)
        except SlotInvalidatedError as exc:
            _halt(st, spec, "slot_invalidated", lowest, source.head(), str(exc), run_id)
        return {"status": "ok", **health}


def guard_binlog_purge(pipeline: str | PipelineSpec, *, run_id: str, resolve: Resolver | None = None,
                       store: CheckpointStore | None = None) -> dict[str, Any]:
    """MySQL/MariaDB: every sink's checkpoint file is still on the server."""
    spec = find_spec(pipeline)
    if spec.source.kind != "mysql":
        return {"status": "not_applicable"}
    with _opened(spec, resolve, store) as (source, st):
        lowest = _lowest_checkpoint(st, spec)
        earliest = source.earliest()
        if lowest is not None:
            check_comparable(lowest, earliest)  # another server: the failover guard's business
        if lowest is not None and lowest.file_seq < earliest.file_seq:
            _halt(st, spec, "binlog_purged", lowest, earliest,
                  f"binlog {lowest.file} was purged; the earliest binlog on the server is {earliest.file}",
                  run_id)
        return {"status": "ok", "earliest": position_to_json(earliest),
                "lowest_checkpoint": position_to_json(lowest)}


def preflight(pipeline: str | PipelineSpec, *, resolve: Resolver | None = None,
              store: CheckpointStore | None = None) -> list[str]:
    """Source settings and privileges (raises SourceSettingError on a hard problem) and
    retention headroom warnings."""
    from .sources.preflight import raise_for_problems

    spec = find_spec(pipeline)
    with _opened(spec, resolve, store) as (source, st):
        problems = source.preflight(**_checkpoint_facts(st, spec))
    raise_for_problems(problems)
    warnings = [p.message for p in problems if p.severity != "error"]
    for w in warnings:
        log.warning("pipeline %s: %s", spec.pipeline, w)
    return warnings


def _checkpoint_facts(store: CheckpointStore, spec: PipelineSpec) -> dict[str, Any]:
    """The oldest sink checkpoint and its age: what retention headroom is measured against."""
    import datetime as dt

    stored = [r for sid, r in store.checkpoints(spec.pipeline).items() if sid in {s.id for s in spec.sinks}]
    if not stored:
        return {"checkpoint": None}
    if spec.source.kind != "mysql":  # Postgres measures headroom by the slot's safe_wal_size
        return {"checkpoint": min(r.position for r in stored)}
    oldest = min(stored, key=lambda r: r.position)
    written = dt.datetime.fromisoformat(oldest.written_at)
    if written.tzinfo is None:
        written = written.replace(tzinfo=dt.UTC)
    age = (dt.datetime.now(dt.UTC) - written).total_seconds()
    return {"checkpoint": oldest.position, "checkpoint_age_s": age}


# --------------------------------------------------------------------------- resolve


def resolve_incidents(pipeline: str | PipelineSpec, *, resolution: str, reason: str, who: str,
                      run_id: str, resolve: Resolver | None = None,
                      store: CheckpointStore | None = None) -> list[dict[str, Any]]:
    """Resolve every open incident of the pipeline. ``accept_gap`` moves the checkpoints past
    the missing range (on a new server or a lost slot: to where streaming can resume) as new
    store versions, so no older sink-side record pulls a sink back; the range and the reason
    stay on record."""
    if resolution not in RESOLUTIONS:
        raise TidegateError(f"resolve must be one of {', '.join(RESOLUTIONS)}, not {resolution!r}")
    if not (reason or "").strip():
        raise TidegateError("resolve needs a reason (it is kept with the incident): set the "
                            "`reason` param when triggering the run")
    if resolution == "resnapshot":
        raise TidegateError("resolve=resnapshot needs snapshots, which are not built yet; "
                            "use resolve=accept_gap and re-load the affected tables by hand")
    spec = find_spec(pipeline)
    with _opened(spec, resolve, store) as (source, st):
        done = []
        for inc in st.incidents(spec.pipeline, unresolved_only=True):
            _accept_gap(spec, st, source, inc, run_id, who, reason)
            done.append(st.resolve_incident(inc.id, resolution=resolution, who=who, reason=reason).to_json())
        return done


def _accept_gap(spec: PipelineSpec, store: CheckpointStore, source: Any, inc: Incident, run_id: str,
                who: str, reason: str) -> None:
    epoch = store.acquire_lease(spec.pipeline, run_id)
    if inc.kind == "failover":
        target = _resume_on_new_server(spec, store, source, epoch)
    elif inc.kind in ("slot_dropped", "slot_invalidated"):
        source.drop_slot()  # an invalidated slot cannot be used again
        target = source.ensure_slot() or source.head()
    else:  # binlog_purged: resume at the earliest position still on the server
        target = inc.to_position or source.earliest()
    stored = store.checkpoints(spec.pipeline)
    moves = {s.id: target for s in spec.sinks
             if s.id not in stored or inc.kind != "binlog_purged" or stored[s.id].position < target}
    if moves:
        store.write_checkpoints(spec.pipeline, moves, run_id=run_id, epoch=epoch, kind="accept_gap",
                                reason=f"incident #{inc.id} ({inc.kind}): {reason}", who=who)
    log.warning("pipeline %s: incident #%d (%s) accepted; checkpoints of %s moved to %s", spec.pipeline,
                inc.id, inc.kind, ", ".join(sorted(moves)) or "no sink", target)


def _resume_on_new_server(spec: PipelineSpec, store: CheckpointStore, source: Any, epoch: int) -> Position:
    """After a failover that lost changes: adopt the new server's identity and resume at its
    head (Postgres: at a fresh slot's start on the new server, replacing any slot of that name
    there, whose position would mean nothing to the checkpoints)."""
    store.set_source_identity(spec.pipeline, source.identity(), epoch=epoch)
    if spec.source.kind == "postgres":
        source.drop_slot()
        return source.ensure_slot() or source.head()
    return source.head()
