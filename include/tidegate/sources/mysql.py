"""MySQL/MariaDB binlog source (python-mysql-replication).

Positions, ids and boundaries (the contract other code relies on):

* A transaction is one binlog event group: GTID event (MariaDB: its flags say whether it is a
  standalone DDL group) or ``BEGIN`` query, then table maps and row events, then the ``XID``
  event or a ``COMMIT``/``ROLLBACK`` query; a standalone DDL group ends with its query.
* ``tx_id`` is the GTID (MariaDB ``0-1-42``, MySQL ``uuid:42``); without GTIDs it is
  ``"{file}:{pos}"`` of the transaction's first event (GTID/BEGIN). Stable on every replay.
* ``event_id`` is ``"{file}:{pos}:{i}"``: the start position of the row event and the row's
  0-based index in it.
* The last row of a transaction carries ``end_position`` = the position just after the
  commit event (``XID``'s end), with ``gtid_set`` = the server's executed GTID set after this
  transaction (MariaDB: last GTID per domain), ``server_id`` / ``server_uuid`` of the server
  read. That is where the next read starts, and what a checkpoint stores.
* ``read(start, upto)`` yields exactly the transactions whose commit ends in
  ``(start, upto]``: it starts reading at ``start`` (a transaction boundary) and stops at the
  first event that starts at or after ``upto``. ``upto`` must be a transaction boundary
  (:meth:`MySqlSource.head` always is: the server writes event groups whole); a transaction
  straddling ``upto`` is an error, never a silent cut.
* Column names come from the binlog's row metadata only (``binlog_row_metadata=FULL``); a row
  event without them raises :class:`SourceSettingError` naming the setting and the table.
  Statement-logged DML (``binlog_format``) and partial row images (``binlog_row_image``) are
  detected in the stream and raise the same way.
* DDL inside the range is recorded in :attr:`MySqlSource.schema_changes` (reset at the start
  of every read) as :class:`SchemaChange` records with their positions, and passed to the
  optional :attr:`MySqlSource.on_schema_change` callback as it is read. Rows before and after
  the DDL carry the columns their own table map described.

Values (JSON-faithful, see ``events.encode_value``): integers of every width as numbers
(unsigned included), DECIMAL as string, FLOAT as the shortest decimal that round-trips the
32-bit value, DOUBLE as number, text as string (utf8mb4), BLOB/BINARY/VARBINARY as base64,
DATE/DATETIME as ISO-8601 (``2024-01-02T03:04:05.123456``), TIMESTAMP as ISO-8601 in UTC
(``...+00:00``), TIME as ``[-]HH:MM:SS[.ffffff]``, YEAR as number, ENUM as string, SET as a
sorted list (empty set → ``[]``), BIT(n) as a string of n ``0``/``1`` characters, JSON as its
JSON text (MariaDB stores JSON as text; MySQL's binary JSON is re-serialized), zero dates as
null.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.constants import FIELD_TYPE, NONE_SOURCE
from pymysqlreplication.event import (
    GtidEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from ..connections import Connection
from ..errors import CannotTranslateError, PositionPurgedError, SourceError, SourceSettingError
from ..events import ChangeEvent, PositionMark
from ..positions import BinlogPosition, GtidSet, Position, check_comparable
from ..spec import PipelineSpec
from ..store.records import CheckpointRecord
from .base import Source, SourceItem
from .preflight import ERROR, WARNING, Problem, human_seconds, setting_problem
from .snapshot_mysql import MySqlSnapshot

log = logging.getLogger(__name__)

ER_MASTER_FATAL_ERROR_READING_BINLOG = 1236
MARIADB_FL_STANDALONE = 0x01
REQUIRED_SETTINGS = (
    ("binlog_format", "ROW", "SET GLOBAL binlog_format=ROW and binlog_format=ROW in the server config"),
    ("binlog_row_image", "FULL",
     "SET GLOBAL binlog_row_image=FULL and binlog_row_image=FULL in the server config"),
    ("binlog_row_metadata", "FULL",
     "SET GLOBAL binlog_row_metadata=FULL and binlog_row_metadata=FULL in the server config "
     "(column names come only from the binlog's row metadata)"),
)
_DML_PREFIXES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "LOAD DATA")
_SLICE_ID_STRIDE = 7919  # server ids of parallel slice readers: base + k * stride (mod 2^32)
DECODERS = ("fast", "library")


class GtidsNotOnServerError(SourceError):
    """The server lacks transactions of the checkpoint's GTID set (it is behind, or it is not a
    member of the same replication topology): resuming there would lose them. ``missing`` is
    the checkpoint's set, ``available`` the server's executed set."""

    def __init__(self, message: str, *, requested: GtidSet, available: GtidSet | None):
        super().__init__(message)
        self.requested = requested
        self.available = available


@dataclass(frozen=True)
class SchemaChange:
    """A DDL statement read from the binlog, at ``position`` (the query event's start) and
    ending at ``end_position`` (a transaction boundary)."""

    position: BinlogPosition
    end_position: BinlogPosition
    tx_id: str
    db: str
    query: str
    ts_ms: int

    def to_json(self) -> dict[str, Any]:
        return {"position": self.position.to_json(), "end_position": self.end_position.to_json(),
                "tx_id": self.tx_id, "db": self.db, "query": self.query, "ts_ms": self.ts_ms}


def _file_seq(name: str) -> int:
    return int(name.rsplit(".", 1)[1])


def float32_shortest(x: float) -> float:
    """The shortest decimal that reads back as the same 32-bit float (3.14, not 3.1400001)."""
    if x != x or x in (float("inf"), float("-inf")):
        return x
    packed = struct.pack("<f", x)
    for digits in range(6, 10):
        cand = float(f"{x:.{digits}g}")
        if struct.pack("<f", cand) == packed:
            return cand
    return x


def _json_text(v: Any) -> str | None:
    """MySQL binary JSON (decoded by the library with bytes keys/strings) → JSON text."""
    if v is None:
        return None
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8")
    if isinstance(v, str):
        return v

    def norm(o: Any) -> Any:
        if isinstance(o, (bytes, bytearray)):
            return bytes(o).decode("utf-8", "replace")
        if isinstance(o, dict):
            return {norm(k): norm(x) for k, x in o.items()}
        if isinstance(o, (list, tuple)):
            return [norm(x) for x in o]
        return o

    return json.dumps(norm(v), ensure_ascii=False, separators=(",", ":"))


def _utc(v: Any) -> Any:
    return v.replace(tzinfo=dt.UTC) if isinstance(v, dt.datetime) else v


class MySqlSource(MySqlSnapshot, Source):  # snapshots: snapshot_mysql.py
    """Bounded reads of a MySQL/MariaDB binlog. See the module docstring for the contract."""

    kind = "mysql"
    translates_positions = True

    def __init__(self, spec: PipelineSpec, conn: Connection, *, server_id: int | None = None,
                 connect_timeout: float = 10.0, decoder: str | None = None):
        self.spec = spec
        self.conn = conn
        self.connect_timeout = connect_timeout
        # --- decoder choice (the fast reader lives in mysql_reader.py) -------------------
        # "fast" (default): our own protocol client and row plans; "library": _Reader over
        # python-mysql-replication, the reference. TIDEGATE_MYSQL_DECODER sets the default.
        self.decoder = decoder or os.environ.get("TIDEGATE_MYSQL_DECODER") or "fast"
        if self.decoder not in DECODERS:
            raise ValueError(f"MySQL decoder {self.decoder!r} (decoder= or TIDEGATE_MYSQL_DECODER) "
                             f"is not one of {', '.join(DECODERS)}")
        # ----------------------------------------------------------------------------------
        sid = server_id or spec.source.server_id
        # A replication client id must be unique among the server's replicas: derive a stable
        # one from the pipeline name when the spec sets none.
        self.client_server_id = int(sid) if sid else 40000 + zlib.crc32(spec.pipeline.encode()) % 1_000_000
        tables = tuple(spec.source.tables or ())
        self.tables: frozenset[tuple[str, str]] = frozenset(tuple(t.split(".", 1)) for t in tables)
        self.dbs: frozenset[str] = frozenset(d for d, _ in self.tables)
        self.schema_changes: list[SchemaChange] = []
        self.on_schema_change: Callable[[SchemaChange], None] | None = None
        self._ctl: pymysql.connections.Connection | None = None
        self._info: dict[str, Any] | None = None

    # ------------------------------------------------------------------ control connection

    def _settings(self, **kw: Any) -> dict[str, Any]:
        c = self.conn
        return dict(host=c.host or "127.0.0.1", port=int(c.port or 3306), user=c.login or "",
                    password=c.password or "", connect_timeout=int(self.connect_timeout), **kw)

    def _cursor(self):
        if self._ctl is None or not self._ctl.open:
            s = self._settings()
            try:
                self._ctl = pymysql.connect(autocommit=True, charset="utf8mb4", **s)
            except pymysql.err.OperationalError as exc:
                raise SourceError(f"cannot connect to {self.conn}: {exc.args[-1]}") from None
        else:
            self._ctl.ping(reconnect=True)
        return self._ctl.cursor()

    def _q(self, sql: str, args: Any = None) -> list[tuple]:
        with self._cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall()) if cur.description else []

    def _server(self) -> dict[str, Any]:
        if self._info is None:
            (version,) = self._q("SELECT VERSION()")[0]
            mariadb = "mariadb" in version.lower()
            row = self._q("SELECT @@server_id, @@log_bin_basename" +
                          (", @@gtid_domain_id" if mariadb else ", @@server_uuid"))[0]
            self._info = {
                "flavor": "mariadb" if mariadb else "mysql",
                "version": version,
                "server_id": int(row[0]),
                "binlog_basename": os.path.basename(row[1]) if row[1] else None,
                "gtid_domain_id": int(row[2]) if mariadb else None,
                "server_uuid": None if mariadb else row[2],
            }
        return self._info

    @property
    def is_mariadb(self) -> bool:
        return self._server()["flavor"] == "mariadb"

    def close(self) -> None:
        try:
            if self._ctl is not None:
                self._ctl.close()
        except Exception:  # noqa: BLE001 - close must not raise
            pass
        self._ctl = None

    # ------------------------------------------------------------------ positions

    def _pos(self, file: str, pos: int, gtid_set: GtidSet | None) -> BinlogPosition:
        info = self._server()
        return BinlogPosition(file, int(pos), gtid_set=gtid_set, server_id=info["server_id"],
                              server_uuid=info["server_uuid"])

    def head(self) -> BinlogPosition:
        """The current end of the binlog: (file, pos) and the executed GTID set at it."""
        try:
            rows = self._q("SHOW MASTER STATUS")
        except pymysql.err.ProgrammingError:
            rows = self._q("SHOW BINARY LOG STATUS")  # MySQL 8.4
        except pymysql.err.OperationalError as exc:
            raise SourceError(f"cannot read the binlog head of {self.conn}: {exc.args[-1]} "
                              f"(the CDC user needs BINLOG MONITOR / REPLICATION CLIENT)") from None
        if not rows:
            raise SourceSettingError(f"binary logging is off on {self.conn}: set log_bin "
                                     f"(log-bin=<basename>) in the server config and restart")
        file, pos = rows[0][0], int(rows[0][1])
        if self.is_mariadb:
            gtid = self.gtid_at(file, pos)
        else:
            gtid = GtidSet.parse(rows[0][4]) if len(rows[0]) > 4 else None
        return self._pos(file, pos, gtid)

    def gtid_at(self, file: str, pos: int) -> GtidSet | None:
        """MariaDB: the GTID position (last GTID per domain) at a binlog coordinate."""
        if not self.is_mariadb:
            return None
        (text,) = self._q("SELECT BINLOG_GTID_POS(%s, %s)", (file, int(pos)))[0]
        return GtidSet.parse(text)

    def identity(self) -> dict[str, Any]:
        info = self._server()
        return {"kind": "mysql", "flavor": info["flavor"], "server_id": info["server_id"],
                "gtid_domain_id": info["gtid_domain_id"], "server_uuid": info["server_uuid"],
                "binlog_basename": info["binlog_basename"], "version": info["version"]}

    def binlog_files(self) -> list[tuple[str, int]]:
        """The binlog files still on the server, oldest first, with their sizes."""
        return [(r[0], int(r[1])) for r in self._q("SHOW BINARY LOGS")]

    def log_sizes(self) -> dict[str, int]:
        return dict(self.binlog_files())

    def earliest(self) -> BinlogPosition:
        """The earliest position still available (the start of the oldest binlog file)."""
        first = self.binlog_files()[0][0]
        return self._pos(first, 4, self.gtid_at(first, 4))

    def _check_available(self, start: BinlogPosition) -> None:
        files = self.binlog_files()
        names = {f for f, _ in files}
        if start.file not in names:
            earliest = self._pos(files[0][0], 4, self.gtid_at(files[0][0], 4)) if files else None
            if files and start.file_seq > _file_seq(files[-1][0]):
                raise SourceError(f"binlog file {start.file} of position {start} is not on "
                                  f"{self.conn} and is newer than its newest file {files[-1][0]}: "
                                  f"the position belongs to another server (failover?)")
            raise PositionPurgedError(
                f"binlog position {start} is no longer on {self.conn}: the file was purged; the "
                f"earliest available position is {earliest}", requested=start,
                earliest_available=earliest)

    # ------------------------------------------------------------------ settings

    def settings(self) -> dict[str, Any]:
        rows = self._q("SHOW GLOBAL VARIABLES WHERE Variable_name IN ('log_bin', 'binlog_format', "
                       "'binlog_row_image', 'binlog_row_metadata', 'expire_logs_days', "
                       "'binlog_expire_logs_seconds', 'gtid_mode', 'gtid_strict_mode')")
        return {k.lower(): v for k, v in rows}

    def check_settings(self) -> None:
        """Raise :class:`SourceSettingError` naming every wrong binlog setting."""
        probs = settings_problems(self.settings())
        if probs:
            raise SourceSettingError("\n".join(p.message for p in probs))

    # ------------------------------------------------------------------ continuity

    def check_retention(self, checkpoint: BinlogPosition | None, *, first_run: bool) -> dict[str, Any]:
        """The checkpoint's binlog file is still on the server."""
        earliest = self.earliest()
        if checkpoint is not None:
            check_comparable(checkpoint, earliest)  # another server: the failover guard's business
            if checkpoint.file_seq < earliest.file_seq:
                raise PositionPurgedError(
                    f"binlog {checkpoint.file} was purged; the earliest binlog on {self.conn} is "
                    f"{earliest.file}", requested=checkpoint, earliest_available=earliest)
        return {"status": "ok", "earliest": earliest.to_json(),
                "checkpoint": checkpoint.to_json() if checkpoint is not None else None}

    def restart_stream(self) -> BinlogPosition:
        """A binlog needs nothing re-created: changes are delivered from the head on."""
        return self.head()

    def preflight(self, checkpoint: CheckpointRecord | None = None) -> list[Problem]:
        """Settings, privileges and retention headroom (binlog expiry against the age of the
        oldest checkpoint)."""
        if checkpoint is None:
            return self.check_server(None)
        written = dt.datetime.fromisoformat(checkpoint.written_at)
        if written.tzinfo is None:
            written = written.replace(tzinfo=dt.UTC)
        age = (dt.datetime.now(dt.UTC) - written).total_seconds()
        return self.check_server(checkpoint.position, age)

    def check_server(self, checkpoint: BinlogPosition | None = None,
                     checkpoint_age_s: float | None = None,
                     headroom_warn_fraction: float = 0.5) -> list[Problem]:
        """Settings, privileges and retention headroom, one :class:`Problem` per problem.

        ``checkpoint_age_s`` is how old the oldest sink checkpoint is (now minus its write
        time); with a binlog expiry set, the headroom is ``expiry - age`` and a warning is
        raised once less than ``headroom_warn_fraction`` of the expiry is left.
        """
        try:
            values = self.settings()
        except (SourceError, pymysql.err.MySQLError) as exc:
            return [Problem("connection", str(self.conn), f"cannot query {self.conn}: {exc}")]
        probs = settings_problems(values)
        probs += self._privilege_problems()
        if checkpoint is not None:
            try:
                self._check_available(checkpoint)
            except PositionPurgedError as exc:
                probs.append(Problem("retention", "binlog", str(exc),
                                     detail={"requested": checkpoint.to_json(),
                                             "earliest": exc.earliest_available.to_json()
                                             if exc.earliest_available else None}))
            except SourceError as exc:
                probs.append(Problem("retention", "binlog", str(exc)))
        expiry = _expiry_seconds(values)
        if expiry is not None and checkpoint_age_s is not None:
            headroom = expiry - checkpoint_age_s
            detail = {"expiry_s": expiry, "checkpoint_age_s": checkpoint_age_s, "headroom_s": headroom}
            if headroom <= 0:
                probs.append(Problem("retention", "binlog_expire_logs_seconds",
                                     f"the oldest checkpoint is {human_seconds(checkpoint_age_s)} old, "
                                     f"past the binlog expiry ({human_seconds(expiry)}): its binlog "
                                     f"may be purged; raise binlog_expire_logs_seconds or run the "
                                     f"pipeline more often", ERROR, detail))
            elif headroom < expiry * headroom_warn_fraction:
                probs.append(Problem("retention", "binlog_expire_logs_seconds",
                                     f"retention headroom is {human_seconds(headroom)}: the oldest "
                                     f"checkpoint is {human_seconds(checkpoint_age_s)} old and binlogs "
                                     f"expire after {human_seconds(expiry)}", WARNING, detail))
        return probs

    def _privilege_problems(self) -> list[Problem]:
        try:
            grants = " ".join(r[0] for r in self._q("SHOW GRANTS")).upper()
        except pymysql.err.MySQLError as exc:
            return [Problem("privilege", "SHOW GRANTS", f"cannot list the CDC user's grants: {exc}",
                            WARNING)]
        if "ALL PRIVILEGES ON *.*" in grants:
            return []
        out = []
        needed = [("REPLICATION SLAVE", ("REPLICATION SLAVE", "REPLICATION REPLICA"))]
        if self.is_mariadb:
            needed.append(("BINLOG MONITOR", ("BINLOG MONITOR", "REPLICATION CLIENT", "SUPER")))
        else:
            needed.append(("REPLICATION CLIENT", ("REPLICATION CLIENT", "SUPER")))
        for name, accepted in needed:
            if not any(a in grants for a in accepted):
                out.append(Problem("privilege", name,
                                   f"the CDC user {self.conn.login!r} lacks the {name} privilege: "
                                   f"GRANT {name} ON *.* TO the CDC user"))
        return out

    # ------------------------------------------------------------------ reading

    def read(self, start: BinlogPosition | None, upto: BinlogPosition) -> Iterator[SourceItem]:
        """Rows of the transactions committed in (start, upto], in binlog order."""
        return self._read(start, upto, self.client_server_id)

    def slices(self, start: BinlogPosition | None,
               upto: BinlogPosition) -> list[tuple[BinlogPosition, BinlogPosition]]:
        """(start, upto] cut into one range per binlog file, each starting at the file's start or
        at ``start`` and ending at the file's end or at ``upto``. Reading each with
        :meth:`read_slice` (in any order, in parallel) and concatenating the rows in slice order
        equals :meth:`read` over the whole range."""
        if start is None:
            start = self.earliest()
        if start >= upto:
            return []
        self._check_available(start)
        out = []
        for name, size in self.binlog_files():
            seq = _file_seq(name)
            if seq < start.file_seq or seq > upto.file_seq:
                continue
            frm = start if name == start.file else self._pos(name, 4, None)
            to = upto if name == upto.file else self._pos(name, size, None)
            if frm < to:
                out.append((frm, to))
        return out

    def read_slice(self, frm: BinlogPosition, to: BinlogPosition, reader: int = 0) -> Iterator[SourceItem]:
        """Read one slice of :meth:`slices`. ``reader`` picks a distinct replication client id,
        so slices can be read at the same time (the server drops a second connection that uses
        the same id)."""
        sid = (self.client_server_id + (reader + 1) * _SLICE_ID_STRIDE) % (1 << 32) or 1
        return self._read(frm, to, sid)

    def _stream(self, server_id: int, **kw: Any) -> BinLogStreamReader:
        return BinLogStreamReader(
            connection_settings=self._settings(),
            server_id=server_id,
            blocking=False,
            only_events=[RotateEvent, MariadbGtidEvent, GtidEvent, QueryEvent, XidEvent,
                         XAPrepareEvent, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
            enable_logging=False,
            **kw,
        )

    def _read(self, start: BinlogPosition | None, upto: BinlogPosition,
              server_id: int) -> Iterator[SourceItem]:
        if upto is None:
            raise ValueError("read needs an upper bound (head() at the start of the run)")
        if start is None:
            start = self.earliest()
        self.schema_changes = []
        if start >= upto:
            return
        self._check_available(start)
        info = self._server()
        mariadb = info["flavor"] == "mariadb"
        seed = start.gtid_set if start.gtid_set is not None else self.gtid_at(start.file, start.pos)
        gtids = _GtidState(seed, "mariadb" if mariadb else "mysql")
        if self.decoder == "fast":  # --- decoder choice ---
            from .mysql_reader import FastReader, binlog_stream

            stream = binlog_stream(self, start, server_id)
            reader = FastReader(self, stream, start, upto, gtids)
        else:
            stream = self._stream(server_id, resume_stream=True, log_file=start.file,
                                  log_pos=start.pos, only_schemas=sorted(self.dbs) if self.dbs else None)
            reader = _Reader(self, stream, start, upto, gtids)
        try:
            yield from reader.run()
        except pymysql.err.OperationalError as exc:
            if exc.args and exc.args[0] == ER_MASTER_FATAL_ERROR_READING_BINLOG:
                earliest = self.earliest()
                if start < earliest:
                    raise PositionPurgedError(
                        f"binlog position {start} is no longer on {self.conn} ({exc.args[1]}); "
                        f"the earliest available position is {earliest}",
                        requested=start, earliest_available=earliest) from None
                raise SourceError(f"reading the binlog of {self.conn} from {start} failed: "
                                  f"{exc.args[1]}") from None
            raise
        finally:
            stream.close()

    def _record_schema_change(self, change: SchemaChange) -> None:
        if self.dbs and change.db not in self.dbs and not any(d in change.query for d in self.dbs):
            return
        log.info("schema change at %s (%s): %s", change.position, change.tx_id, change.query)
        self.schema_changes.append(change)
        if self.on_schema_change is not None:
            self.on_schema_change(change)

    # ------------------------------------------------------------------ failover

    def translate(self, checkpoint: Position) -> BinlogPosition:
        """A checkpoint of another server of the topology, placed here by its GTID set."""
        if not isinstance(checkpoint, BinlogPosition) or checkpoint.gtid_set is None:
            raise CannotTranslateError(f"checkpoint {checkpoint} carries no GTID set (GTIDs off on the "
                                       f"old server?), so it has no meaning on another server")
        return self.resume_point_for_gtids(checkpoint.gtid_set)

    def describe_change(self, old_identity: dict[str, Any]) -> str:
        new = self.identity()
        what = [f"server_id {old_identity.get('server_id')} -> {new.get('server_id')}"]
        if old_identity.get("server_uuid") != new.get("server_uuid"):
            what.append(f"server_uuid {old_identity.get('server_uuid')} -> {new.get('server_uuid')}")
        return f"the connection now reaches another MySQL/MariaDB server ({', '.join(what)})"

    def resume_point_for_gtids(self, gtid_set: GtidSet | str) -> BinlogPosition:
        """Where to resume on this server after a checkpoint whose executed GTID set is
        ``gtid_set`` (taken on another server of the same topology): the position of the first
        transaction not in the set, or the head when there is none yet.

        Raises :class:`GtidsNotOnServerError` when this server lacks some of the set's
        transactions, and :class:`PositionPurgedError` when the transactions after the set are
        no longer in this server's binlogs.
        """
        gs = GtidSet.parse(gtid_set) if isinstance(gtid_set, str) else gtid_set
        if gs is None:
            raise ValueError("resume_point_for_gtids needs a non-empty GTID set")
        h = self.head()
        if h.gtid_set is None or not h.gtid_set.contains(gs):
            raise GtidsNotOnServerError(
                f"{self.conn} has not executed every transaction of the checkpoint's GTID set "
                f"{gs} (server: {h.gtid_set}): resuming there would lose them",
                requested=gs, available=h.gtid_set)
        sid = (self.client_server_id + 104729) % (1 << 32) or 1
        stream = self._stream(sid, auto_position=str(gs), is_mariadb=self.is_mariadb)
        file = None
        try:
            for ev in stream:
                if isinstance(ev, RotateEvent):
                    file = ev.next_binlog
                elif isinstance(ev, (MariadbGtidEvent, GtidEvent)) and file is not None:
                    p = ev.packet
                    pos = p.log_pos - p.event_size
                    at = self.gtid_at(file, pos) if self.is_mariadb else gs
                    return self._pos(file, pos, at)
        except pymysql.err.OperationalError as exc:
            if exc.args and exc.args[0] == ER_MASTER_FATAL_ERROR_READING_BINLOG:
                raise PositionPurgedError(
                    f"the transactions after GTID set {gs} are no longer in the binlogs of "
                    f"{self.conn} ({exc.args[1]}); the earliest available position is "
                    f"{self.earliest()}", requested=gs, earliest_available=self.earliest()) from None
            raise
        finally:
            stream.close()
        return h


# ---------------------------------------------------------------------- helpers


def settings_problems(values: dict[str, Any]) -> list[Problem]:
    """One problem per binlog setting CDC needs that is wrong (values from SHOW VARIABLES)."""
    out = []
    if str(values.get("log_bin", "ON")).upper() not in ("ON", "1"):
        out.append(setting_problem("log_bin", values.get("log_bin"), "ON",
                                   "enable binary logging (log-bin=<basename>) and restart"))
    for name, wanted, fix in REQUIRED_SETTINGS:
        actual = values.get(name)
        if actual is None or str(actual).upper() != wanted:
            out.append(setting_problem(name, actual, wanted, fix))
    return out


def _expiry_seconds(values: dict[str, Any]) -> float | None:
    secs = float(values.get("binlog_expire_logs_seconds") or 0)
    if secs > 0:
        return secs
    days = float(values.get("expire_logs_days") or 0)
    return days * 86400 if days > 0 else None


def _is_binary(col) -> bool:
    cs = (getattr(col, "character_set_name", None) or "").lower()
    coll = (getattr(col, "collation_name", None) or "").lower()
    return cs == "binary" or coll == "binary"


def _fix_negative_time2(v: Any) -> Any:
    """python-mysql-replication decodes a negative TIME(fsp>0) with fraction f as -(s + (1 - f))
    (it negates the integer and fractional parts separately): undo that."""
    if not isinstance(v, dt.timedelta) or v >= dt.timedelta(0):
        return v
    mag = -v
    frac = mag.microseconds
    if not frac:
        return v
    whole = mag.days * 86400 + mag.seconds
    return -dt.timedelta(seconds=whole, microseconds=1_000_000 - frac)


class _GtidState:
    """The executed GTID set while reading forward (updated per GTID event)."""

    def __init__(self, seed: GtidSet | None, flavor: str):
        self.flavor = flavor
        self.mariadb: dict[int, tuple[int, int]] = {}
        self.mysql: dict[str, list[tuple[int, int]]] = {}
        self.known = seed is not None or flavor == "mariadb"
        if seed is not None:
            for d, s, n in seed.mariadb:
                self.mariadb[d] = (s, n)
            for u, iv in seed.mysql:
                self.mysql[u] = list(iv)
        self._cache: GtidSet | None = seed

    def add_mariadb(self, domain: int, server: int, seq: int) -> None:
        self.mariadb[domain] = (server, seq)
        self._cache = None

    def add_mysql(self, gtid: str) -> None:
        uuid, _, n = gtid.rpartition(":")
        k = int(n)
        self.mysql.setdefault(uuid.lower(), []).append((k, k))
        self._cache = None

    def current(self) -> GtidSet | None:
        if self._cache is None:
            if self.flavor == "mariadb":
                if not self.mariadb:
                    return None
                self._cache = GtidSet("mariadb", mariadb=tuple(sorted((d, s, n) for d, (s, n)
                                                                      in self.mariadb.items())))
            else:
                if not self.known:
                    return None
                text = ",".join(u + ":" + ":".join(f"{a}-{b}" for a, b in iv)
                                for u, iv in sorted(self.mysql.items()))
                self._cache = GtidSet.parse(text)
                if self._cache is not None:
                    self.mysql = {u: list(iv) for u, iv in self._cache.mysql}
        return self._cache


class _Reader:
    """One bounded pass over the binlog (state of :meth:`MySqlSource._read`)."""

    def __init__(self, src: MySqlSource, stream: BinLogStreamReader, start: BinlogPosition,
                 upto: BinlogPosition, gtids: _GtidState):
        self.src = src
        self.stream = stream
        self.start = start
        self.upto = upto
        self.upto_key = (upto.file_seq, upto.pos)
        self.gtids = gtids
        self.spec = src.spec
        self.tables = src.tables
        self.file = start.file
        self.converters: dict[int, tuple[Any, list]] = {}
        # transaction state
        self.in_tx = False
        self.standalone = False
        self.tx_id: str | None = None
        self.tx_gtid: str | None = None
        self.total = 0
        self.per_table: dict[tuple[str, str], int] = {}
        self.pending: dict[str, Any] | None = None
        self.last_end: BinlogPosition | None = None  # end of the last transaction yielded

    def _begin(self, pos: int, gtid: str | None, standalone: bool) -> None:
        if self.in_tx:
            raise SourceError(f"binlog event group at {self.file}:{pos} starts inside transaction "
                              f"{self.tx_id}: the binlog is not in the expected form")
        self.in_tx = True
        self.standalone = standalone
        self.tx_gtid = gtid
        self.tx_id = gtid or f"{self.file}:{pos}"
        self.total = 0
        self.per_table = {}
        self.pending = None

    def _end(self, end_pos: int) -> Iterator[SourceItem]:
        end = self.src._pos(self.file, end_pos, self.gtids.current())
        self.in_tx = False
        if self.pending is not None:  # a transaction with nothing to deliver yields nothing
            kw = self.pending
            self.pending = None
            self.last_end = end
            yield ChangeEvent.build(**kw, tx_end=True, end_position=end)

    def run(self) -> Iterator[SourceItem]:
        src = self.src
        for ev in self.stream:
            p = ev.packet
            if isinstance(ev, RotateEvent):
                if p.log_pos == 0:  # artificial rotate at the start of a file / of the stream
                    self.file = ev.next_binlog
                    if (_file_seq(self.file), ev.position) >= self.upto_key and \
                            (_file_seq(self.file), ev.position) > (self.start.file_seq, self.start.pos):
                        break
                    continue
                pos = p.log_pos - p.event_size
                if (_file_seq(self.file), pos) >= self.upto_key:
                    break
                self.file = ev.next_binlog
                continue
            pos = p.log_pos - p.event_size
            if (_file_seq(self.file), pos) >= self.upto_key:
                if self.in_tx:
                    raise SourceError(f"the upper bound {self.upto} is inside transaction {self.tx_id}: "
                                      f"bounds must be transaction boundaries (use head())")
                break
            if isinstance(ev, MariadbGtidEvent):
                self.gtids.add_mariadb(ev.domain_id, ev.server_id, ev.gtid_seq_no)
                self._begin(pos, ev.gtid, bool(ev.flags & MARIADB_FL_STANDALONE))
            elif isinstance(ev, GtidEvent):
                self.gtids.add_mysql(ev.gtid)
                self._begin(pos, ev.gtid, False)
            elif isinstance(ev, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                yield from self._rows(ev, pos)
            elif isinstance(ev, XidEvent):
                if not self.in_tx:
                    raise SourceError(f"XID event at {self.file}:{pos} outside a transaction")
                yield from self._end(p.log_pos)
            elif isinstance(ev, QueryEvent):
                yield from self._query(ev, pos, p.log_pos)
            elif isinstance(ev, XAPrepareEvent):
                raise SourceError(f"XA transaction at {self.file}:{pos}: XA transactions are not "
                                  f"supported by the binlog source")
        if self.in_tx:
            raise SourceError(f"the binlog of {src.conn} ended inside transaction {self.tx_id} "
                              f"before {self.upto}")
        if self.last_end is None or self.last_end < self.upto:
            mark = self.upto
            if self.gtids.current() is not None and self.upto.gtid_set is None:
                mark = src._pos(self.upto.file, self.upto.pos, self.gtids.current())
            yield PositionMark(mark)

    def _may_touch_captured(self, ev: QueryEvent, q: str) -> bool:
        """Whether a statement-logged DML may change a captured table: always without a table
        filter; otherwise when its default database or the text names a captured database."""
        dbs = self.src.dbs
        if not dbs:
            return True
        db = ev.schema.decode("utf-8", "replace") if isinstance(ev.schema, bytes) else str(ev.schema or "")
        return db in dbs or any(d.lower() in q.lower() for d in dbs)

    def _query(self, ev: QueryEvent, pos: int, end_pos: int) -> Iterator[SourceItem]:
        q = ev.query.strip()
        head = q[:16].upper()
        if head == "BEGIN" or head.startswith("BEGIN "):
            if not self.in_tx:
                self._begin(pos, None, False)
            return
        if head.startswith(("COMMIT", "ROLLBACK")) and not head.startswith("ROLLBACK TO"):
            if self.in_tx:
                yield from self._end(end_pos)
            return
        if head.startswith(("SAVEPOINT", "ROLLBACK TO", "RELEASE SAVEPOINT")):
            return
        if head.startswith("XA "):
            raise SourceError(f"XA transaction at {self.file}:{pos} ({q[:40]}): XA transactions are "
                              f"not supported by the binlog source")
        if head.startswith(_DML_PREFIXES):
            if not self._may_touch_captured(ev, q):
                return  # statement DML of databases this pipeline does not capture
            raise SourceSettingError(
                f"statement-logged DML at {self.file}:{pos} ({q[:60]!r}): CDC needs "
                f"binlog_format=ROW (SET GLOBAL binlog_format=ROW, and in the server config; "
                f"sessions must not override it)")
        # DDL (or another statement that is its own event group)
        if not self.in_tx:
            self._begin(pos, None, True)
        db = ev.schema.decode("utf-8", "replace") if isinstance(ev.schema, bytes) else str(ev.schema or "")
        ends = self.standalone or self.tx_gtid is None or not self.src.is_mariadb
        end = self.src._pos(self.file, end_pos, self.gtids.current())
        self.src._record_schema_change(SchemaChange(
            position=self.src._pos(self.file, pos, None), end_position=end, tx_id=self.tx_id or "",
            db=db, query=q, ts_ms=int(ev.timestamp) * 1000))
        if ends:
            yield from self._end(end_pos)

    def _converters(self, ev) -> list:
        """Per table map: [(name, kind)] for columns whose library value needs fixing, after
        checking that the binlog carried the column names."""
        cached = self.converters.get(ev.table_id)
        if cached is not None and cached[0] is ev.columns:
            return cached[1]
        conv = []
        for i, col in enumerate(ev.columns):
            if not col.name:
                raise SourceSettingError(
                    f"the binlog has no column names for {ev.schema}.{ev.table} (column {i + 1}): "
                    f"CDC needs binlog_row_metadata=FULL when the rows are written (SET GLOBAL "
                    f"binlog_row_metadata=FULL, and in the server config); column names are never "
                    f"guessed from the current schema")
            t = col.type
            if t == FIELD_TYPE.FLOAT:
                conv.append((col.name, "float32"))
            elif t in (FIELD_TYPE.TIMESTAMP, FIELD_TYPE.TIMESTAMP2):
                conv.append((col.name, "utc"))
            elif t == FIELD_TYPE.SET:
                conv.append((col.name, "set"))
            elif t == FIELD_TYPE.JSON:
                conv.append((col.name, "json"))
            elif t == FIELD_TYPE.TIME2 and getattr(col, "fsp", 0):
                conv.append((col.name, "time2"))
            elif t == FIELD_TYPE.STRING and _is_binary(col) and getattr(col, "max_length", 0):
                conv.append((col.name, ("binary", col.max_length)))
        self.converters[ev.table_id] = (ev.columns, conv)
        return conv

    def _check_image(self, ev, bitmap: bytes) -> None:
        n = len(ev.columns)
        full = bytes([0xFF] * (n // 8)) + (bytes([(1 << (n % 8)) - 1]) if n % 8 else b"")
        if bytes(bitmap)[: len(full)] != full:
            raise SourceSettingError(
                f"partial row image for {ev.schema}.{ev.table} at {self.file}:"
                f"{ev.packet.log_pos - ev.packet.event_size}: CDC needs binlog_row_image=FULL "
                f"(SET GLOBAL binlog_row_image=FULL, and in the server config; sessions must not "
                f"override it)")

    @staticmethod
    def _fix(values: dict[str, Any], nones: dict[str, str], conv: list) -> dict[str, Any]:
        for name, kind in conv:
            v = values.get(name)
            if kind == "float32":
                if v is not None:
                    values[name] = float32_shortest(v)
            elif kind == "utc":
                values[name] = _utc(v)
            elif kind == "set":
                if v is None and nones.get(name) == NONE_SOURCE.EMPTY_SET:
                    values[name] = []
            elif kind == "json":
                values[name] = _json_text(v)
            elif kind == "time2":
                values[name] = _fix_negative_time2(v)
            elif isinstance(v, bytes):  # ("binary", n): BINARY(n) is zero-padded to n bytes
                values[name] = v.ljust(kind[1], b"\x00")
        return values

    def _rows(self, ev, pos: int) -> Iterator[SourceItem]:
        if self.tables and (ev.schema, ev.table) not in self.tables:
            return
        if not self.in_tx:
            raise SourceError(f"row event at {self.file}:{pos} outside a transaction")
        conv = self._converters(ev)
        if isinstance(ev, UpdateRowsEvent):
            op = "u"
            self._check_image(ev, ev.columns_present_bitmap)
            self._check_image(ev, ev.columns_present_bitmap2)
        else:
            op = "c" if isinstance(ev, WriteRowsEvent) else "d"
            self._check_image(ev, ev.columns_present_bitmap)
        pk = ev.primary_key
        pk_cols = (pk,) if isinstance(pk, str) and pk else tuple(pk or ())
        tkey = (ev.schema, ev.table)
        ts_ms = int(ev.timestamp) * 1000
        spec = self.spec
        for i, row in enumerate(ev.rows):
            if op == "u":
                before = self._fix(row["before_values"], row["before_none_sources"], conv) if conv \
                    else row["before_values"]
                after = self._fix(row["after_values"], row["after_none_sources"], conv) if conv \
                    else row["after_values"]
            elif op == "c":
                before, after = None, (self._fix(row["values"], row["none_sources"], conv) if conv
                                       else row["values"])
            else:
                before, after = (self._fix(row["values"], row["none_sources"], conv) if conv
                                 else row["values"]), None
            image = after if after is not None else before
            key = {c: image[c] for c in pk_cols} if pk_cols else None
            self.total += 1
            n = self.per_table.get(tkey, 0) + 1
            self.per_table[tkey] = n
            kw = dict(
                tenant=spec.tenant, pipeline=spec.pipeline, connector="mysql", db=ev.schema,
                schema=ev.schema, table=ev.table, op=op, before=before, after=after, key=key,
                tx_id=self.tx_id, event_id=f"{self.file}:{pos}:{i}",
                position={"file": self.file, "pos": pos, "row": i, "gtid": self.tx_gtid},
                ts_ms=ts_ms, total_order=self.total, data_collection_order=n,
            )
            if self.pending is not None:
                yield ChangeEvent.build(**self.pending)
            self.pending = kw
