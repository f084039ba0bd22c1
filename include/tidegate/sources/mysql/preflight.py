"""MySQL/MariaDB preflight: binlog settings, the CDC user's privileges, retention headroom.

What the guard checks before a run reads the binlog (see ``sources/preflight.py`` for the
:class:`Problem` form): ``log_bin`` on and ``binlog_format``/``binlog_row_image``/
``binlog_row_metadata`` as CDC needs them, on MariaDB ``gtid_strict_mode`` on, the replication
privileges, the oldest checkpoint's binlog file still on the server, and how much of the binlog
expiry the oldest checkpoint has left.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pymysql

from ...errors import PositionPurgedError, SourceError, SourceSettingError
from ...store.records import CheckpointRecord
from ..preflight import ERROR, INFO, WARNING, Problem, human_seconds, setting_problem
from .position import BinlogPosition
from .server import MySqlServer

REQUIRED_SETTINGS = (
    ("binlog_format", "ROW", "SET GLOBAL binlog_format=ROW and binlog_format=ROW in the server config"),
    ("binlog_row_image", "FULL",
     "SET GLOBAL binlog_row_image=FULL and binlog_row_image=FULL in the server config"),
    ("binlog_row_metadata", "FULL",
     "SET GLOBAL binlog_row_metadata=FULL and binlog_row_metadata=FULL in the server config "
     "(column names come only from the binlog's row metadata)"),
)


# MariaDB checkpoints carry the GTID position (the last GTID of each domain). A failover places
# them on the new server by containment (failover.py: the new server's position holds every
# domain's seq_no), which is sound only if a domain's seq_nos grow in one history on every server
# of the topology. gtid_strict_mode=ON makes a server refuse a GTID out of order or from another
# history; without it a server can hold a higher seq_no yet lack earlier transactions, and a
# failover would resume past changes it never saw. Every MariaDB pipeline relies on it: the
# failover guard translates whenever the server behind the connection changes.
STRICT_GTID_FIX = ("SET GLOBAL gtid_strict_mode=ON, and gtid_strict_mode=ON in the [mariadb] section of "
                   "my.cnf, on the primary and every replica a failover may promote (a failover places "
                   "checkpoints by GTID containment, which is only sound in strict mode)")


def settings_problems(values: dict[str, Any], *, mariadb: bool = False) -> list[Problem]:
    """One problem per binlog setting CDC needs that is wrong (values from SHOW VARIABLES);
    ``mariadb``: also ``gtid_strict_mode``."""
    out = []
    if str(values.get("log_bin", "ON")).upper() not in ("ON", "1"):
        out.append(setting_problem("log_bin", values.get("log_bin"), "ON",
                                   "enable binary logging (log-bin=<basename>) and restart"))
    required = REQUIRED_SETTINGS + ((("gtid_strict_mode", "ON", STRICT_GTID_FIX),) if mariadb else ())
    for name, wanted, fix in required:
        actual = values.get(name)
        if actual is None or str(actual).upper() != wanted:
            out.append(setting_problem(name, actual, wanted, fix))
    return out


def check_settings(server: MySqlServer) -> None:
    """Raise :class:`SourceSettingError` naming every wrong binlog setting."""
    probs = settings_problems(server.settings(), mariadb=server.is_mariadb)
    if probs:
        raise SourceSettingError("\n".join(p.message for p in probs))


def checkpoint_age_s(checkpoint: CheckpointRecord) -> float:
    """How long ago the checkpoint was written, in seconds."""
    written = dt.datetime.fromisoformat(checkpoint.written_at)
    if written.tzinfo is None:
        written = written.replace(tzinfo=dt.UTC)
    return (dt.datetime.now(dt.UTC) - written).total_seconds()


def check_server(server: MySqlServer, checkpoint: BinlogPosition | None = None,
                 checkpoint_age: float | None = None,
                 headroom_warn_fraction: float = 0.5) -> list[Problem]:
    """Settings, privileges and retention headroom, one :class:`Problem` per problem.

    ``checkpoint_age`` is how old the oldest sink checkpoint is (now minus its write time, in
    seconds); with a binlog expiry set, the headroom is ``expiry - age`` and a warning is
    raised once less than ``headroom_warn_fraction`` of the expiry is left.
    """
    try:
        values = server.settings()
    except (SourceError, pymysql.err.MySQLError) as exc:
        return [Problem("connection", str(server.conn), f"cannot query {server.conn}: {exc}")]
    probs = settings_problems(values, mariadb=server.is_mariadb)
    probs += privilege_problems(server)
    if checkpoint is not None:
        try:
            server.check_available(checkpoint)
        except PositionPurgedError as exc:
            probs.append(Problem("retention", "binlog", str(exc),
                                 detail={"requested": checkpoint.to_json(),
                                         "earliest": exc.earliest_available.to_json()
                                         if exc.earliest_available else None}))
        except SourceError as exc:
            probs.append(Problem("retention", "binlog", str(exc)))
    expiry = _expiry_seconds(values)
    if expiry is not None and checkpoint_age is not None:
        headroom = expiry - checkpoint_age
        detail = {"expiry_s": expiry, "checkpoint_age_s": checkpoint_age, "headroom_s": headroom}
        if headroom <= 0:
            probs.append(Problem("retention", "binlog_expire_logs_seconds",
                                 f"the oldest checkpoint is {human_seconds(checkpoint_age)} old, "
                                 f"past the binlog expiry ({human_seconds(expiry)}): its binlog "
                                 f"may be purged; raise binlog_expire_logs_seconds or run the "
                                 f"pipeline more often", ERROR, detail))
        elif headroom < expiry * headroom_warn_fraction:
            probs.append(Problem("retention", "binlog_expire_logs_seconds",
                                 f"retention headroom is {human_seconds(headroom)}: the oldest "
                                 f"checkpoint is {human_seconds(checkpoint_age)} old and binlogs "
                                 f"expire after {human_seconds(expiry)}", WARNING, detail))
        else:  # the figure still goes out (a metric), so an alert can fire before the warning
            probs.append(Problem("retention", "binlog_expire_logs_seconds",
                                 f"retention headroom is {human_seconds(headroom)} (binlogs expire "
                                 f"after {human_seconds(expiry)})", INFO, detail))
    return probs


def privilege_problems(server: MySqlServer) -> list[Problem]:
    try:
        grants = " ".join(r[0] for r in server.query("SHOW GRANTS")).upper()
    except pymysql.err.MySQLError as exc:
        return [Problem("privilege", "SHOW GRANTS", f"cannot list the CDC user's grants: {exc}",
                        WARNING)]
    if "ALL PRIVILEGES ON *.*" in grants:
        return []
    out = []
    needed = [("REPLICATION SLAVE", ("REPLICATION SLAVE", "REPLICATION REPLICA"))]
    if server.is_mariadb:
        needed.append(("BINLOG MONITOR", ("BINLOG MONITOR", "REPLICATION CLIENT", "SUPER")))
    else:
        needed.append(("REPLICATION CLIENT", ("REPLICATION CLIENT", "SUPER")))
    for name, accepted in needed:
        if not any(a in grants for a in accepted):
            out.append(Problem("privilege", name,
                               f"the CDC user {server.conn.login!r} lacks the {name} privilege: "
                               f"GRANT {name} ON *.* TO the CDC user"))
    return out


def _expiry_seconds(values: dict[str, Any]) -> float | None:
    secs = float(values.get("binlog_expire_logs_seconds") or 0)
    if secs > 0:
        return secs
    days = float(values.get("expire_logs_days") or 0)
    return days * 86400 if days > 0 else None
