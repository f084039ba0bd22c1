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
from collections.abc import Mapping
from typing import Any

from .errors import SlotInvalidatedError, SlotMissingError, SourceError, TidegateError
from .positions import BinlogPosition, Position, position_to_json
from .runner import Resolver, _opened, find_spec
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


def guard_failover(pipeline: str | PipelineSpec, *, run_id: str, resolve: Resolver | None = None,
                   store: CheckpointStore | None = None) -> dict[str, Any]:
    spec = find_spec(pipeline)
    with _opened(spec, resolve, store) as (source, st):
        current = source.identity()
        stored = st.get_source_identity(spec.pipeline)
        if stored is None or not st.checkpoints(spec.pipeline):
            st.set_source_identity(spec.pipeline, current)
            return {"status": "recorded", "identity": current}
        if same_server(stored, current):
            return {"status": "ok", "identity": current}
        return _failover(spec, st, source, stored, current, run_id)


def _failover(spec: PipelineSpec, store: CheckpointStore, source: Any, old: Mapping[str, Any],
              new: Mapping[str, Any], run_id: str) -> dict[str, Any]:
    detail = f"source identity changed from {dict(old)} to {dict(new)}"
    moved = _gtid_positions(spec, store, source)
    if moved is None:
        _halt(store, spec, "failover", _lowest_checkpoint(store, spec), source.head(),
              detail + "; the checkpoints cannot be placed on the new server without loss", run_id)
    epoch = store.acquire_lease(spec.pipeline, run_id)
    store.write_checkpoints(spec.pipeline, moved, run_id=run_id, epoch=epoch)
    store.set_source_identity(spec.pipeline, new, epoch=epoch)
    store.record_incident(spec.pipeline, "failover", None, None, run_id=run_id,
                          detail=detail + "; every checkpoint GTID set is on the new server",
                          resolved=True, resolution="auto", who="tidegate",
                          reason="GTID failover: no change lost, checkpoints moved to the new server")
    log.warning("pipeline %s: failover continued without loss: %s", spec.pipeline,
                {k: str(v) for k, v in moved.items()})
    return {"status": "failover_continued", "identity": dict(new),
            "checkpoints": {k: position_to_json(v) for k, v in moved.items()}}


def _gtid_positions(spec: PipelineSpec, store: CheckpointStore, source: Any) -> dict[str, Position] | None:
    """Each sink checkpoint translated to the new server by its GTID set, or None when any
    cannot be (no GTIDs, not MySQL/MariaDB, or GTIDs missing on the new server)."""
    finder = getattr(source, "resume_point_for_gtids", None)
    if finder is None:
        return None
    moved: dict[str, Position] = {}
    for sid, rec in store.checkpoints(spec.pipeline).items():
        pos = rec.position
        if not isinstance(pos, BinlogPosition) or pos.gtid_set is None:
            return None
        try:
            moved[sid] = finder(pos.gtid_set)
        except SourceError as exc:  # GTIDs missing on the new server, or already purged there
            log.error("pipeline %s: sink %s cannot resume on the new server: %s", spec.pipeline, sid, exc)
            return None
    return moved


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
    the missing range (and recreates a lost slot); the range and the reason stay on record."""
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
            _accept_gap(spec, st, source, inc, run_id)
            done.append(st.resolve_incident(inc.id, resolution=resolution, who=who, reason=reason).to_json())
        return done


def _accept_gap(spec: PipelineSpec, store: CheckpointStore, source: Any, inc: Incident, run_id: str) -> None:
    if inc.kind in ("slot_dropped", "slot_invalidated"):
        source.drop_slot()  # an invalidated slot cannot be used again
        target = source.ensure_slot() or source.head()
    elif inc.kind == "failover":
        store.set_source_identity(spec.pipeline, source.identity())
        target = source.head()
    else:  # binlog_purged: resume at the earliest position still on the server
        target = inc.to_position or source.earliest()
    epoch = store.acquire_lease(spec.pipeline, run_id)
    stored = store.checkpoints(spec.pipeline)
    moves = {s.id: target for s in spec.sinks
             if s.id not in stored or inc.kind != "binlog_purged" or stored[s.id].position < target}
    if moves:
        store.write_checkpoints(spec.pipeline, moves, run_id=run_id, epoch=epoch)
    log.warning("pipeline %s: incident #%d (%s) accepted; checkpoints of %s moved to %s", spec.pipeline,
                inc.id, inc.kind, ", ".join(sorted(moves)) or "no sink", target)
