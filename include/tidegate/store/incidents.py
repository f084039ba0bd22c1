"""Incidents: breaks in a pipeline's continuity (a failover, a dropped slot, a purged binlog).

An unresolved incident halts its pipeline until an operator resolves it.
"""

from __future__ import annotations

from ..positions import Position
from .records import Incident, now_iso, pos_text, pos_value, ts_text
from .tx import Role, StoreError

INCIDENT_COLS = ("id, pipeline, kind, from_position, to_position, detected_at, detail, run_id, "
                 "resolved, resolution, resolved_by, reason, resolved_at")


class Incidents(Role):
    def record(self, pipeline: str, kind: str, from_position: Position | None,
               to_position: Position | None, *, detail: str | None = None,
               run_id: str | None = None, resolved: bool = False,
               resolution: str | None = None, who: str | None = None,
               reason: str | None = None) -> Incident:
        """Record a continuity incident. Unresolved incidents halt the pipeline; an incident
        that needed no operator (GTID failover) is recorded already resolved."""
        now = now_iso()
        with self._tx(write=True) as tx:
            iid = tx.one(
                "INSERT INTO tidegate_incidents (pipeline, kind, from_position, to_position, detail, "
                "run_id, detected_at, resolved, resolution, resolved_by, reason, resolved_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (pipeline, kind, pos_text(from_position), pos_text(to_position), detail, run_id, now,
                 bool(resolved), resolution, who, reason, now if resolved else None))[0]
        return self.get(iid)

    def get(self, incident_id: int) -> Incident:
        with self._tx() as tx:
            row = tx.one(f"SELECT {INCIDENT_COLS} FROM tidegate_incidents WHERE id = ?", (incident_id,))
        if row is None:
            raise StoreError(f"no incident {incident_id}")
        return _incident(row)

    def all(self, pipeline: str | None = None, *, unresolved_only: bool = False) -> list[Incident]:
        where, params = [], []
        if pipeline is not None:
            where.append("pipeline = ?")
            params.append(pipeline)
        if unresolved_only:
            where.append("resolved = ?")
            params.append(False)
        sql = f"SELECT {INCIDENT_COLS} FROM tidegate_incidents"
        sql += (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
        with self._tx() as tx:
            return [_incident(r) for r in tx.all(sql, tuple(params))]

    def resolve(self, incident_id: int, *, resolution: str, who: str, reason: str) -> Incident:
        if not (reason or "").strip():
            raise ValueError("resolving an incident needs a reason")
        with self._tx(write=True) as tx:
            n = tx.exec("UPDATE tidegate_incidents SET resolved = ?, resolution = ?, resolved_by = ?, "
                        "reason = ?, resolved_at = ? WHERE id = ? AND resolved = ?",
                        (True, resolution, who, reason, now_iso(), incident_id, False)).rowcount
        if n != 1:
            raise StoreError(f"incident {incident_id} does not exist or is already resolved")
        return self.get(incident_id)

    def is_halted(self, pipeline: str) -> bool:
        """A pipeline is halted while it has an unresolved incident."""
        return bool(self.all(pipeline, unresolved_only=True))


def _incident(r: tuple) -> Incident:
    return Incident(r[0], r[1], r[2], pos_value(r[3]), pos_value(r[4]), ts_text(r[5]), r[6], r[7],
                    bool(r[8]), r[9], r[10], r[11], ts_text(r[12]))
