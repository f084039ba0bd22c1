"""What the checkpoint store returns: plain, immutable records with a JSON form."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

from ..positions import Position, position_from_json, position_to_json


def checkpoint_key(pipeline: str, sink_id: str) -> str:
    """The checkpoint key: ``{pipeline}::sink::{sink_id}``."""
    return f"{pipeline}::sink::{sink_id}"


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


def ts_text(v: Any) -> str | None:
    """Timestamps leave the store as ISO-8601 UTC text, whatever the backend's type."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, dt.datetime):
        return v.astimezone(dt.UTC).isoformat(timespec="microseconds")
    return str(v)


def pos_text(p: Position | None) -> str | None:
    # sort_keys + compact separators: the same position is always stored as the same bytes.
    return None if p is None else json.dumps(position_to_json(p), sort_keys=True, separators=(",", ":"))


def pos_value(text: str | None) -> Position | None:
    return None if text is None else position_from_json(text)


@dataclass(frozen=True)
class CheckpointRecord:
    pipeline: str
    sink_id: str
    version: int
    position: Position
    run_id: str | None
    epoch: int | None
    written_at: str
    kind: str = "write"  # write | rewind
    reason: str | None = None
    who: str | None = None
    source_version: int | None = None  # rewind: the version whose position was restored
    # A control message (JSON) this version owes its sink: delivered before anything after it
    # (the gap an operator accepted, a failover the guard translated).
    control: dict[str, Any] | None = None

    @property
    def key(self) -> str:
        return checkpoint_key(self.pipeline, self.sink_id)

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "pipeline": self.pipeline, "sink": self.sink_id,
                "version": self.version, "position": position_to_json(self.position),
                "run_id": self.run_id, "epoch": self.epoch, "written_at": self.written_at,
                "kind": self.kind, "reason": self.reason, "who": self.who,
                "source_version": self.source_version, "control": self.control}


@dataclass(frozen=True)
class Incident:
    id: int
    pipeline: str
    kind: str  # failover | slot_dropped | slot_invalidated | binlog_purged | ...
    from_position: Position | None
    to_position: Position | None
    detected_at: str
    detail: str | None = None
    run_id: str | None = None
    resolved: bool = False
    resolution: str | None = None  # resnapshot | accept_gap | auto
    resolved_by: str | None = None
    reason: str | None = None
    resolved_at: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The shape `tidegate status --json` prints (docs/operations.md), plus the resolution."""
        return {"id": self.id, "kind": self.kind, "from": position_to_json(self.from_position),
                "to": position_to_json(self.to_position), "detected_at": self.detected_at,
                "resolved": self.resolved, "resolution": self.resolution,
                "resolved_by": self.resolved_by, "reason": self.reason, "detail": self.detail}


@dataclass(frozen=True)
class JournalSink:
    """The range one sink received in a journaled run: (start, end]."""

    sink_id: str
    start: Position | None
    end: Position | None
    events: int
    bytes: int
    status: str
    error: str | None = None
    dlq: int = 0  # events the sink dead-lettered in that run


@dataclass(frozen=True)
class JournalEntry:
    id: int
    pipeline: str
    run_id: str
    mode: str
    interval_start: str | None
    interval_end: str | None
    status: str  # running | success | failed
    started_at: str
    finished_at: str | None
    sinks: dict[str, JournalSink] = field(default_factory=dict)


@dataclass(frozen=True)
class SnapshotRecord:
    """One snapshot of a pipeline (docs/architecture.md, "Snapshots"): the log takes over at
    ``handoff``; ``tables`` (``SnapshotTable`` JSON) are read as ``chunks``, chunk ``n`` (from 1)
    being ``chunks[n - 1]`` = ``{"table": index into tables, "lo": bound, "hi": bound}``.
    ``ts_ms`` (when it was planned) is the ``ts_ms`` of its rows, the same on every re-read.
    ``kind``: ``start`` (``source.start: snapshot``) or ``resnapshot``; ``status``: ``running``,
    ``completed`` or ``superseded`` (a newer snapshot replaced it before it completed)."""

    pipeline: str
    snapshot_id: str
    kind: str
    handoff: Position
    tables: list[dict[str, Any]]
    chunks: list[dict[str, Any]]
    ts_ms: int
    status: str = "running"
    rows: int | None = None
    reason: str | None = None
    who: str | None = None
    run_id: str | None = None
    started_at: str | None = None
    finished_at: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "snapshot": self.snapshot_id, "kind": self.kind,
                "handoff": position_to_json(self.handoff),
                "tables": [f"{t['schema']}.{t['table']}" for t in self.tables],
                "chunks": len(self.chunks), "status": self.status, "rows": self.rows,
                "reason": self.reason, "who": self.who, "run_id": self.run_id,
                "started_at": self.started_at, "finished_at": self.finished_at}


@dataclass(frozen=True)
class TableColumns:
    """A table's columns (``[{"name", "type"}]`` in order) as of ``position``, a transaction
    boundary of the source log: a fact about the log a source keeps between runs."""

    pipeline: str
    schema: str
    table: str
    position: Position
    columns: list[dict[str, str]]
    seen_at: str
