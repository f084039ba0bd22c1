"""The MySQL/MariaDB server behind a connection: control connection, identity and binlog files.

:class:`MySqlServer` makes the pymysql settings of every connection the source opens (TLS
from the connection's extra, ``tls.py``), owns the one control connection (autocommit) it uses for
queries, and answers what the server is (flavor, version, ``server_id``, GTID domain or
``server_uuid``, binlog base name), where its binlog ends (:meth:`MySqlServer.head`), which
files it still holds (:meth:`MySqlServer.binlog_files`, :meth:`MySqlServer.earliest`) and the
GTID position at a binlog coordinate (MariaDB). Every position it makes carries the server's
lineage (``server_id``, ``server_uuid``), so positions of two servers never compare.
"""

from __future__ import annotations

import os
from typing import Any

import pymysql

from ...connections import Connection
from ...errors import ForeignPositionError, PositionPurgedError, SourceError, SourceSettingError
from ...positions import describe_lineage, same_lineage
from ..dbapi import close_quietly
from ..timeouts import read_timeout_s
from .position import BinlogPosition, GtidSet
from .tls import PyMySqlConnection, pymysql_tls, tls_failure
from .transactions import file_seq

HEAD_TRIES = 3  # MariaDB: reads of the GTID state around the head before scanning the binlog for it


class MySqlServer:
    def __init__(self, conn: Connection, *, connect_timeout: float = 10.0):
        self.conn = conn
        self.connect_timeout = connect_timeout
        self._ctl: pymysql.connections.Connection | None = None
        self._info: dict[str, Any] | None = None

    # ------------------------------------------------------------------ control connection

    def connection_settings(self, **kw: Any) -> dict[str, Any]:
        """pymysql keyword arguments for a new connection to the server, TLS included (the one
        place they are made: the control connection, snapshot readers and replication streams
        all connect with them)."""
        c = self.conn
        return dict(host=c.host or "127.0.0.1", port=int(c.port or 3306), user=c.login or "",
                    password=c.password or "", connect_timeout=int(self.connect_timeout),
                    **pymysql_tls(c), **kw)

    def connect(self, what: str = "", **kw: Any) -> pymysql.connections.Connection:
        """A new connection (``kw`` adds pymysql arguments). A certificate that does not verify
        raises :class:`~tidegate.errors.TlsVerificationError`; any other failure a
        :class:`SourceError` (``what`` says what the connection was for)."""
        try:
            return PyMySqlConnection(**self.connection_settings(**kw))
        except pymysql.err.OperationalError as exc:
            raise self.connect_error(exc, what) from None

    def connect_error(self, exc: pymysql.err.OperationalError, what: str = "") -> Exception:
        """What a failed connect of ours stands for: a TLS verification failure, or a
        :class:`SourceError` naming the connection."""
        return tls_failure(self.conn, exc) or SourceError(f"cannot connect to {self.conn}{what}: "
                                                          f"{exc.args[-1]}")

    def _cursor(self):
        if self._ctl is None or not self._ctl.open:
            # Bounded reads and writes: a server that hangs must not hold the run forever.
            timeout = read_timeout_s()
            self._ctl = self.connect(autocommit=True, charset="utf8mb4", read_timeout=timeout,
                                     write_timeout=timeout)
        else:
            self._ctl.ping(reconnect=True)
        return self._ctl.cursor()

    def query(self, sql: str, args: Any = None) -> list[tuple]:
        """Rows of one statement on the control connection."""
        with self._cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall()) if cur.description else []

    def close(self) -> None:
        close_quietly(self._ctl)
        self._ctl = None

    # ------------------------------------------------------------------ identity

    def info(self) -> dict[str, Any]:
        """Flavor, version, server_id, binlog base name, GTID domain (MariaDB) or server_uuid
        (MySQL); read once per connection's lifetime."""
        if self._info is None:
            (version,) = self.query("SELECT VERSION()")[0]
            mariadb = "mariadb" in version.lower()
            row = self.query("SELECT @@server_id, @@log_bin_basename" +
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
        return self.info()["flavor"] == "mariadb"

    def identity(self) -> dict[str, Any]:
        info = self.info()
        return {"kind": "mysql", "flavor": info["flavor"], "server_id": info["server_id"],
                "gtid_domain_id": info["gtid_domain_id"], "server_uuid": info["server_uuid"],
                "binlog_basename": info["binlog_basename"], "version": info["version"]}

    # ------------------------------------------------------------------ positions

    def position(self, file: str, pos: int, gtid_set: GtidSet | None) -> BinlogPosition:
        """A position on this server (it carries the server's lineage)."""
        info = self.info()
        return BinlogPosition(file, int(pos), gtid_set=gtid_set, server_id=info["server_id"],
                              server_uuid=info["server_uuid"])

    def head(self) -> BinlogPosition:
        """The current end of the binlog: (file, pos) and the executed GTID set at it."""
        if not self.is_mariadb:
            row = self._binlog_status()
            return self.position(row[0], int(row[1]), GtidSet.parse(row[4]) if len(row) > 4 else None)
        # MariaDB's BINLOG_GTID_POS(file, pos) reads the file from its start up to pos: at the head
        # of a large file, a second or more. @@gtid_binlog_pos is the GTID state at the end of the
        # binlog. A transaction's GTID is logged under the binlog's lock, which SHOW MASTER STATUS
        # takes too; equal values read before and after it mean no transaction was logged in
        # between, so the value is the state at that position. A busy server falls back to the scan.
        for _ in range(HEAD_TRIES):
            (before,), = self.query("SELECT @@GLOBAL.gtid_binlog_pos")
            row = self._binlog_status()
            (after,), = self.query("SELECT @@GLOBAL.gtid_binlog_pos")
            if before == after:
                return self.position(row[0], int(row[1]), GtidSet.parse(after))
        return self.position(row[0], int(row[1]), self.gtid_at(row[0], int(row[1])))

    def _binlog_status(self) -> tuple:
        try:
            rows = self.query("SHOW MASTER STATUS")
        except pymysql.err.ProgrammingError:
            rows = self.query("SHOW BINARY LOG STATUS")  # MySQL 8.4
        except pymysql.err.OperationalError as exc:
            raise SourceError(f"cannot read the binlog head of {self.conn}: {exc.args[-1]} "
                              f"(the CDC user needs BINLOG MONITOR / REPLICATION CLIENT)") from None
        if not rows:
            raise SourceSettingError(f"binary logging is off on {self.conn}: set log_bin "
                                     f"(log-bin=<basename>) in the server config and restart")
        return rows[0]

    def gtid_at(self, file: str, pos: int) -> GtidSet | None:
        """MariaDB: the GTID position (last GTID per domain) at a binlog coordinate."""
        if not self.is_mariadb:
            return None
        (text,) = self.query("SELECT BINLOG_GTID_POS(%s, %s)", (file, int(pos)))[0]
        return GtidSet.parse(text)

    def binlog_files(self) -> list[tuple[str, int]]:
        """The binlog files still on the server, oldest first, with their sizes."""
        return [(r[0], int(r[1])) for r in self.query("SHOW BINARY LOGS")]

    def earliest(self) -> BinlogPosition:
        """The earliest position still available (the start of the oldest binlog file)."""
        first = self.binlog_files()[0][0]
        return self.position(first, 4, self.gtid_at(first, 4))

    def check_available(self, start: BinlogPosition) -> None:
        """Raise :class:`PositionPurgedError` when ``start``'s binlog file was purged, and a
        :class:`ForeignPositionError` when it is another server's (its lineage, or a file newer
        than every file here); both fatal: a retry of the run reads the same position again."""
        files = self.binlog_files()
        names = {f for f, _ in files}
        here = self.position(start.file, start.pos, None)
        if not same_lineage(start, here):
            # Checked first: a file of the same name here, or purged here, says nothing of it.
            raise ForeignPositionError(
                f"binlog position {start} ({describe_lineage(start.lineage)}) is not on {self.conn} "
                f"({describe_lineage(here.lineage)}): the position belongs to another server "
                f"(failover?); run the pipeline with its guards")
        if start.file not in names:
            earliest = self.position(files[0][0], 4, self.gtid_at(files[0][0], 4)) if files else None
            if files and start.file_seq > file_seq(files[-1][0]):
                raise ForeignPositionError(
                    f"binlog file {start.file} of position {start} is not on {self.conn} and is newer "
                    f"than its newest file {files[-1][0]}: the position belongs to another server "
                    f"(failover?)")
            raise PositionPurgedError(
                f"binlog position {start} is no longer on {self.conn}: the file was purged; the "
                f"earliest available position is {earliest}", requested=start,
                earliest_available=earliest)

    def settings(self) -> dict[str, Any]:
        """The server variables CDC depends on (lower-case names)."""
        rows = self.query("SHOW GLOBAL VARIABLES WHERE Variable_name IN ('log_bin', 'binlog_format', "
                          "'binlog_row_image', 'binlog_row_metadata', 'expire_logs_days', "
                          "'binlog_expire_logs_seconds', 'gtid_mode', 'gtid_strict_mode')")
        return {k.lower(): v for k, v in rows}
