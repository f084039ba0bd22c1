"""PostgreSQL preflight: settings, the CDC role, the slot's health and WAL headroom, replica identity.

What the guard checks before a run reads the slot (see ``sources/preflight.py`` for the
:class:`Problem` form): ``wal_level=logical``, slots and WAL senders available (the read
streams the slot through a WAL sender), the REPLICATION attribute, the slot there, on a plugin
the source reads (and the one ``source.plugin`` names) and not invalidated, the oldest
checkpoint not before the slot's start, how much WAL the server keeps for the slot before invalidating it
(``safe_wal_size``), how much WAL the slot holds now (reported, not a problem), and tables
whose updates and deletes cannot be captured whole.
"""

from __future__ import annotations

import psycopg2

from ...errors import SourceError
from ..preflight import ERROR, INFO, WARNING, Problem, human_bytes, human_seconds, setting_problem
from .connection import PgServer
from .position import Lsn, PgPosition
from .slot import Slot, holder_epoch
from .values import UNAVAILABLE

DEFAULT_HEADROOM_WARN_BYTES = 1 << 30


def check_server(server: PgServer, slot: Slot, tables: frozenset[tuple[str, str]],
                 checkpoint: PgPosition | None = None,
                 headroom_warn_bytes: int = DEFAULT_HEADROOM_WARN_BYTES,
                 replay_retention_s: int = 0) -> list[Problem]:
    """Settings, privileges, slot health and retention headroom (the slot's safe_wal_size),
    the WAL the slot holds, replica identity; one :class:`Problem` per problem."""
    try:
        settings = dict(server.query("SELECT name, setting FROM pg_settings WHERE name IN "
                                     "('wal_level', 'max_replication_slots', 'max_wal_senders', "
                                     "'max_slot_wal_keep_size')"))
    except (SourceError, psycopg2.Error) as exc:
        return [Problem("connection", str(server.conn), f"cannot query {server.conn}: {exc}")]
    probs: list[Problem] = []
    if settings.get("wal_level") != "logical":
        probs.append(setting_problem("wal_level", settings.get("wal_level"), "logical",
                                     "ALTER SYSTEM SET wal_level = logical, then restart the server"))
    if int(settings.get("max_replication_slots") or 0) < 1:
        probs.append(setting_problem("max_replication_slots", settings.get("max_replication_slots"),
                                     "at least 1", "ALTER SYSTEM SET max_replication_slots = 10, "
                                     "then restart the server"))
    if int(settings.get("max_wal_senders") or 0) < 1:
        probs.append(setting_problem("max_wal_senders", settings.get("max_wal_senders"), "at least 1",
                                     "the read streams the slot through a WAL sender: ALTER SYSTEM "
                                     "SET max_wal_senders = 10, then restart the server"))
    (repl, superuser, role) = server.query("SELECT rolreplication, rolsuper, rolname FROM pg_roles "
                                           "WHERE rolname = current_user")[0]
    if not (repl or superuser):
        probs.append(Problem("privilege", "REPLICATION",
                             f"the CDC role {role!r} lacks the REPLICATION attribute: "
                             f"ALTER ROLE {role} REPLICATION"))
    info = slot.info()
    if info is None:
        if checkpoint is not None:
            probs.append(Problem("slot", slot.name,
                                 f"replication slot {slot.name!r} does not exist but the pipeline "
                                 f"has a checkpoint at {checkpoint}: the slot was dropped, changes "
                                 f"after the checkpoint may be lost"))
        else:
            probs.append(Problem("slot", slot.name,
                                 f"replication slot {slot.name!r} does not exist yet: it is created "
                                 f"on the pipeline's first run", WARNING))
    else:
        if info["wal_status"] == "lost":
            probs.append(Problem("slot", slot.name,
                                 f"replication slot {slot.name!r} is invalidated (wal_status=lost): "
                                 f"WAL it needed was removed (max_slot_wal_keep_size)"))
        elif wrong_plugin := slot.plugin_problem(info):
            probs.append(Problem("slot", slot.name, wrong_plugin))
        if checkpoint is not None and info["confirmed_flush_lsn"] and \
                checkpoint.lsn < Lsn.parse(info["confirmed_flush_lsn"]):
            probs.append(Problem("retention", slot.name,
                                 f"checkpoint {checkpoint} is before slot {slot.name!r}'s start "
                                 f"{info['confirmed_flush_lsn']}: the changes in between are gone "
                                 f"(a rewind past the slot? rewind to a later version; "
                                 f"source.replay_retention keeps a window for rewinds)"))
        safe = info["safe_wal_size"]
        detail = {"safe_wal_size": safe, "lag_bytes": info["lag_bytes"], "wal_status": info["wal_status"]}
        if safe is not None and info["wal_status"] != "lost":
            if safe <= 0:
                probs.append(Problem("retention", "max_slot_wal_keep_size",
                                     f"slot {slot.name!r} has no WAL headroom left (safe_wal_size "
                                     f"{human_bytes(safe)}): it will be invalidated at the next "
                                     f"checkpoint; run the pipeline or raise max_slot_wal_keep_size",
                                     ERROR, detail))
            else:  # a warning when it runs low; the figure goes out either way (a metric)
                probs.append(Problem("retention", "max_slot_wal_keep_size",
                                     f"slot {slot.name!r} has {human_bytes(safe)} of WAL headroom "
                                     f"(safe_wal_size) before the server invalidates it; it is "
                                     f"{human_bytes(info['lag_bytes'])} behind",
                                     WARNING if safe < headroom_warn_bytes else INFO, detail))
        if info["held_bytes"] is not None:
            probs.append(held_report(slot.name, info, replay_retention_s))
        if info["active_pid"] is not None:
            probs += takeover_problems(server, slot, role, bool(superuser))
    probs += replica_identity_problems(server, tables)
    return probs


def held_report(name: str, info: dict, replay_retention_s: int) -> Problem:
    """The WAL the slot holds (the server cannot recycle it): what a replay window costs."""
    window = (f"; source.replay_retention keeps the slot up to {human_seconds(replay_retention_s)} "
              f"behind the checkpoints" if replay_retention_s else "")
    return Problem("wal_held", name,
                   f"replication slot {name!r} holds {human_bytes(info['held_bytes'])} of WAL (from its "
                   f"restart_lsn {info['restart_lsn']} to the current WAL LSN){window}", INFO,
                   {"held_bytes": info["held_bytes"], "restart_lsn": info["restart_lsn"],
                    "replay_retention_s": replay_retention_s})

def takeover_problems(server: PgServer, slot: Slot, role: str, superuser: bool) -> list[Problem]:
    """A run of the pipeline holds the slot now (a stalled one, if no run is going on): the next
    run terminates it (``Slot.take_over``), which PostgreSQL allows for backends of the same
    role, and of another role only with the privileges of pg_signal_backend (a superuser's
    backend only to a superuser)."""
    held = slot.active_holder()
    if held is None or superuser or holder_epoch(held[1], slot.pipeline) is None:
        return []
    pid, app, holder_role = held
    if holder_role == role:
        return []
    (signal,) = server.query("SELECT pg_has_role(current_user, 'pg_signal_backend', 'USAGE')")[0]
    if signal:
        return []
    return [Problem("privilege", "pg_signal_backend",
                    f"replication slot {slot.name!r} is held by PID {pid} ({app!r}), a run of this "
                    f"pipeline as role {holder_role!r}; if it is stalled, the run takes the slot over "
                    f"by terminating that backend, which the CDC role {role!r} may not do for another "
                    f"role's backend without the pg_signal_backend privilege: GRANT pg_signal_backend "
                    f"TO {role} (or run every run of the pipeline as one role)")]


def replica_identity_problems(server: PgServer, tables: frozenset[tuple[str, str]]) -> list[Problem]:
    sql = ("SELECT n.nspname, c.relname, c.relreplident, "
           "EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary) "
           "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
           "WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
           "AND n.nspname NOT LIKE 'pg_toast%%' AND n.nspname NOT LIKE 'pg_temp%%'")
    rows = server.query(sql + " ORDER BY 1, 2")
    if tables:
        rows = [r for r in rows if (r[0], r[1]) in tables]
    not_full = [f"{s}.{t}" for s, t, ident, _ in rows if ident != "f"]
    no_key = [f"{s}.{t}" for s, t, ident, pk in rows
              if ident == "n" or (ident == "d" and not pk)]
    out = []
    if not_full:
        out.append(Problem("replica_identity", ",".join(not_full),
                           f"{len(not_full)} table(s) without REPLICA IDENTITY FULL: updates and "
                           f"deletes carry only the key columns as before-image, and unchanged "
                           f"TOAST values come as {UNAVAILABLE!r}: {', '.join(not_full)} "
                           f"(ALTER TABLE ... REPLICA IDENTITY FULL)", WARNING,
                           {"tables": not_full}))
    if no_key:
        out.append(Problem("replica_identity", ",".join(no_key),
                           f"{len(no_key)} table(s) have no replica identity (no primary key and "
                           f"not FULL): their updates and deletes cannot be captured: "
                           f"{', '.join(no_key)} (add a primary key or ALTER TABLE ... REPLICA "
                           f"IDENTITY FULL)", ERROR, {"tables": no_key}))
    return out
