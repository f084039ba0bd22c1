"""Checkpoints: the versioned position of every sink, the pipelines the store knows, and the
identity of the source server the checkpoints belong to.

Every move of a checkpoint appends a version (history is kept). Moves are fenced: they check
the lease epoch (:meth:`Leases.check_epoch`) in the same transaction as the write.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..positions import Position
from .leases import Leases
from .records import CheckpointRecord, checkpoint_key, now_iso, pos_text, pos_value, ts_text
from .runs import Runs
from .tx import Backend, Role, StoreError, Tx

CKPT_COLS = ("pipeline, sink_id, version, position, run_id, epoch, written_at, kind, reason, who, "
             "source_version, control")


class Checkpoints(Role):
    def __init__(self, backend: Backend, leases: Leases) -> None:
        super().__init__(backend)
        self._leases = leases

    def write(self, pipeline: str, sink_id: str, position: Position, *,
              run_id: str | None, epoch: int) -> CheckpointRecord:
        """Record a new version of one sink's checkpoint (refused under a stale epoch)."""
        return self.write_many(pipeline, {sink_id: position}, run_id=run_id, epoch=epoch)[sink_id]

    def write_many(self, pipeline: str, positions: Mapping[str, Position], *,
                   run_id: str | None, epoch: int, kind: str = "write",
                   reason: str | None = None, who: str | None = None,
                   control: Mapping[str, Any] | None = None,
                   journal: tuple[int, Mapping[str, tuple[Position | None, Position]]] | None = None
                   ) -> dict[str, CheckpointRecord]:
        """Record new versions of several sinks' checkpoints in one transaction. ``kind`` says
        what moved them: ``write`` (a delivery), ``adopt`` (a sink-side record), ``head``
        (placed at the head), ``skip`` (a range with nothing to deliver), or a move that is not
        a delivery (``failover``, ``accept_gap``, ``rewind``, ``resnapshot``). ``control``: a
        control message (JSON) each of these versions owes its sink (delivered by the next run
        before anything after the position). ``journal``: (journal id, per sink the range the
        run has given it so far), journaled in the same transaction (:meth:`Runs.progress`)."""
        if any(p is None for p in positions.values()):
            raise ValueError("a checkpoint position cannot be None")
        with self._tx(write=True) as tx:
            self._leases.check_epoch(tx, pipeline, epoch)
            written = {sid: self.append(tx, pipeline, sid, pos, run_id=run_id, epoch=epoch, kind=kind,
                                        reason=reason, who=who, control=control)
                       for sid, pos in positions.items()}
            if journal is not None:
                journal_id, ranges = journal
                for sid, (start, end) in ranges.items():
                    Runs.progress(tx, journal_id, sid, start, end)
            return written

    @staticmethod
    def append(tx: Tx, pipeline: str, sink_id: str, position: Position, **kw: Any) -> CheckpointRecord:
        """Append a version inside the caller's transaction ``tx`` (which has checked the epoch)."""
        key = checkpoint_key(pipeline, sink_id)
        version = tx.one("SELECT COALESCE(MAX(version), 0) FROM tidegate_checkpoints WHERE ckpt_key = ?",
                         (key,))[0] + 1
        control = kw.get("control")
        rec = CheckpointRecord(pipeline, sink_id, version, position, kw.get("run_id"), kw.get("epoch"),
                               now_iso(), kw.get("kind", "write"), kw.get("reason"), kw.get("who"),
                               kw.get("source_version"), dict(control) if control else None)
        tx.exec(f"INSERT INTO tidegate_checkpoints (ckpt_key, {CKPT_COLS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (key, pipeline, sink_id, version, pos_text(position), rec.run_id, rec.epoch,
                 rec.written_at, rec.kind, rec.reason, rec.who, rec.source_version,
                 json.dumps(rec.control, sort_keys=True) if rec.control else None))
        return rec

    def get(self, pipeline: str, sink_id: str) -> CheckpointRecord | None:
        """The current (highest) version of a sink's checkpoint; None when it has none."""
        with self._tx() as tx:
            row = tx.one(f"SELECT {CKPT_COLS} FROM tidegate_checkpoints WHERE ckpt_key = ? "
                         "ORDER BY version DESC LIMIT 1", (checkpoint_key(pipeline, sink_id),))
        return None if row is None else _ckpt(row)

    def current(self, pipeline: str) -> dict[str, CheckpointRecord]:
        """The current checkpoint of every sink of a pipeline that has one."""
        with self._tx() as tx:
            rows = tx.all(
                f"SELECT {CKPT_COLS} FROM tidegate_checkpoints c WHERE pipeline = ? AND version = "
                "(SELECT MAX(version) FROM tidegate_checkpoints m WHERE m.ckpt_key = c.ckpt_key) "
                "ORDER BY sink_id", (pipeline,))
        return {r[1]: _ckpt(r) for r in rows}

    def history(self, pipeline: str, sink_id: str, *, since: str | None = None) -> list[CheckpointRecord]:
        """Every version of a sink's checkpoint, oldest first; with ``since`` (an ISO-8601 UTC
        time as :func:`now_iso` writes it) only the versions the checkpoint had from then on:
        the one current at ``since`` and every later one."""
        key = checkpoint_key(pipeline, sink_id)
        sql = f"SELECT {CKPT_COLS} FROM tidegate_checkpoints WHERE ckpt_key = ?"
        params: tuple = (key,)
        if since is not None:
            sql += (" AND version >= COALESCE((SELECT MAX(version) FROM tidegate_checkpoints WHERE "
                    "ckpt_key = ? AND written_at <= ?), 0)")
            params = (key, key, since)
        with self._tx() as tx:
            rows = tx.all(sql + " ORDER BY version", params)
        return [_ckpt(r) for r in rows]

    def version(self, pipeline: str, sink_id: str, version: int) -> CheckpointRecord | None:
        with self._tx() as tx:
            row = tx.one(f"SELECT {CKPT_COLS} FROM tidegate_checkpoints WHERE ckpt_key = ? AND version = ?",
                         (checkpoint_key(pipeline, sink_id), version))
        return None if row is None else _ckpt(row)

    def rewind(self, pipeline: str, sink_id: str, to_version: int, *, reason: str,
               who: str | None = None, position: Position | None = None) -> CheckpointRecord:
        """Restore the position of an earlier version as a new version (history is kept), or
        ``position`` where the caller restores another one for that version
        (``sink_checkpoints.rewind``: the start of a snapshot the sink entered after it).

        A rewind also takes the lease (bumps the epoch): a run in flight would otherwise
        overwrite the rewind with its next write; now that write is refused as stale."""
        if not (reason or "").strip():
            raise ValueError("a rewind needs a reason")
        with self._tx(write=True) as tx:
            row = tx.one(f"SELECT {CKPT_COLS} FROM tidegate_checkpoints WHERE ckpt_key = ? AND version = ?",
                         (checkpoint_key(pipeline, sink_id), to_version))
            if row is None:
                raise StoreError(f"{checkpoint_key(pipeline, sink_id)} has no version {to_version}")
            epoch = self._leases.bump_epoch(tx, pipeline, f"rewind:{who or 'operator'}")
            restored = position if position is not None else _ckpt(row).position
            return self.append(tx, pipeline, sink_id, restored, run_id=None, epoch=epoch,
                               kind="rewind", reason=reason, who=who, source_version=to_version)

    def pipelines(self) -> list[str]:
        """Every pipeline the store knows (checkpoints, leases or incidents)."""
        with self._tx() as tx:
            rows = tx.all("SELECT pipeline FROM tidegate_checkpoints UNION SELECT pipeline FROM "
                          "tidegate_leases UNION SELECT pipeline FROM tidegate_incidents")
        return sorted({r[0] for r in rows})

    # ------------------------------------------------------------------ source identity

    def source_identity(self, pipeline: str) -> dict[str, Any] | None:
        with self._tx() as tx:
            row = tx.one("SELECT identity FROM tidegate_source_identity WHERE pipeline = ?", (pipeline,))
        return None if row is None else json.loads(row[0])

    def set_source_identity(self, pipeline: str, identity: Mapping[str, Any], *,
                            epoch: int | None = None) -> None:
        """Store the identity of the server the checkpoints belong to (fenced when ``epoch``)."""
        with self._tx(write=True) as tx:
            if epoch is not None:
                self._leases.check_epoch(tx, pipeline, epoch)
            tx.exec("INSERT INTO tidegate_source_identity (pipeline, identity, updated_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (pipeline) DO UPDATE SET identity = excluded.identity, "
                    "updated_at = excluded.updated_at",
                    (pipeline, json.dumps(dict(identity), sort_keys=True, default=str), now_iso()))


def _ckpt(r: tuple) -> CheckpointRecord:
    return CheckpointRecord(r[0], r[1], r[2], pos_value(r[3]), r[4], r[5], ts_text(r[6]), r[7], r[8], r[9],
                            r[10], json.loads(r[11]) if r[11] else None)
