"""MySQL/MariaDB failover: placing a checkpoint of another server of the topology on this one.

A binlog position (file, offset) means nothing on another server, but the executed GTID set
it carries does: :func:`resume_point_for_gtids` asks this server to stream from that set
(``auto_position``) and takes the position of the first transaction it sends, which is the
first one the checkpoint does not hold. When this server lacks some of the set's transactions
(:class:`GtidsNotOnServerError`) or has purged what follows it (``PositionPurgedError``),
resuming would lose changes, and the failover guard halts instead.
"""

from __future__ import annotations

from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    GtidEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from ...errors import CannotTranslateError, PositionPurgedError, SourceError
from ...positions import Position
from .position import BinlogPosition, GtidSet
from .server import MySqlServer
from .tls import tls_failure

ER_MASTER_FATAL_ERROR_READING_BINLOG = 1236
_RESUME_ID_OFFSET = 104729  # the GTID look-up's replication client id: base + offset (mod 2^32)


# the events a read needs; the library skips the others without decoding them
EVENTS = [RotateEvent, MariadbGtidEvent, GtidEvent, QueryEvent, XidEvent, XAPrepareEvent,
          WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent]


def library_stream(connection_settings: dict[str, Any], server_id: int, **kw: Any) -> BinLogStreamReader:
    """A non-blocking python-mysql-replication ``BinLogStreamReader`` over :data:`EVENTS`: the
    GTID look-up's, and the reference reader's (tests/reference_decoders/mysql_library.py)."""
    return BinLogStreamReader(connection_settings=connection_settings, server_id=server_id,
                              blocking=False, only_events=EVENTS, enable_logging=False, **kw)


class GtidsNotOnServerError(SourceError):
    """The server lacks transactions of the checkpoint's GTID set (it is behind, or it is not a
    member of the same replication topology): resuming there would lose them. ``missing`` is
    the checkpoint's set, ``available`` the server's executed set."""

    def __init__(self, message: str, *, requested: GtidSet, available: GtidSet | None):
        super().__init__(message)
        self.requested = requested
        self.available = available


def translate(server: MySqlServer, client_server_id: int, checkpoint: Position) -> BinlogPosition:
    """A checkpoint of another server of the topology, placed here by its GTID set."""
    if not isinstance(checkpoint, BinlogPosition) or checkpoint.gtid_set is None:
        raise CannotTranslateError(f"checkpoint {checkpoint} carries no GTID set (GTIDs off on the "
                                   f"old server?), so it has no meaning on another server")
    return resume_point_for_gtids(server, client_server_id, checkpoint.gtid_set)


def describe_change(new: dict[str, Any], old: dict[str, Any]) -> str:
    """What changed between two identities of :meth:`MySqlServer.identity`, for an operator."""
    what = [f"server_id {old.get('server_id')} -> {new.get('server_id')}"]
    if old.get("server_uuid") != new.get("server_uuid"):
        what.append(f"server_uuid {old.get('server_uuid')} -> {new.get('server_uuid')}")
    return f"the connection now reaches another MySQL/MariaDB server ({', '.join(what)})"


def resume_point_for_gtids(server: MySqlServer, client_server_id: int,
                           gtid_set: GtidSet | str) -> BinlogPosition:
    """Where to resume on this server after a checkpoint whose executed GTID set is
    ``gtid_set`` (taken on another server of the same topology): the position of the first
    transaction not in the set, or the head when there is none yet.

    Raises :class:`GtidsNotOnServerError` when this server lacks some of the set's
    transactions, and :class:`PositionPurgedError` when the transactions after the set are no
    longer in this server's binlogs.
    """
    gs = GtidSet.parse(gtid_set) if isinstance(gtid_set, str) else gtid_set
    if gs is None:
        raise ValueError("resume_point_for_gtids needs a non-empty GTID set")
    h = server.head()
    if h.gtid_set is None or not h.gtid_set.contains(gs):
        raise GtidsNotOnServerError(
            f"{server.conn} has not executed every transaction of the checkpoint's GTID set "
            f"{gs} (server: {h.gtid_set}): resuming there would lose them",
            requested=gs, available=h.gtid_set)
    sid = (client_server_id + _RESUME_ID_OFFSET) % (1 << 32) or 1
    stream = library_stream(server.connection_settings(), sid, auto_position=str(gs),
                            is_mariadb=server.is_mariadb)
    file = None
    try:
        for ev in stream:
            if isinstance(ev, RotateEvent):
                file = ev.next_binlog
            elif isinstance(ev, (MariadbGtidEvent, GtidEvent)) and file is not None:
                p = ev.packet
                pos = p.log_pos - p.event_size
                at = server.gtid_at(file, pos) if server.is_mariadb else gs
                return server.position(file, pos, at)
    except pymysql.err.OperationalError as exc:
        if exc.args and exc.args[0] == ER_MASTER_FATAL_ERROR_READING_BINLOG:
            raise PositionPurgedError(
                f"the transactions after GTID set {gs} are no longer in the binlogs of "
                f"{server.conn} ({exc.args[1]}); the earliest available position is "
                f"{server.earliest()}", requested=gs, earliest_available=server.earliest()) from None
        tls = tls_failure(server.conn, exc)
        if tls is not None:
            raise tls from None
        raise
    finally:
        stream.close()
    return h
