"""The PostgreSQL server behind a connection: sessions, identity, timeline and head.

:class:`PgServer` opens every session of the source, with the connection's TLS settings and
the settings value conversion relies on (UTC, ISO dates, the shortest exact floats), keeps one
autocommit control connection for queries, and answers what the cluster is
(``system_identifier``), which timeline it is on and where its flushed WAL ends
(:meth:`PgServer.head`). Every position it makes carries the system identifier and timeline, so
positions of two clusters (or of a promoted standby) never compare.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg2
import psycopg2.extras

from ...connections import Connection
from ...errors import SourceError
from ...watchdog import Watchdog
from ..dbapi import close_quietly
from ..timeouts import READ_TIMEOUT_ENV, read_timeout_s
from .position import Lsn, PgPosition
from .tls import libpq_tls, tls_failure

# Value conversion relies on these output formats (they also apply to a walsender session,
# where the output plugin formats the values).
SESSION_OPTIONS = "-c TimeZone=UTC -c DateStyle=ISO,YMD -c IntervalStyle=postgres -c extra_float_digits=1"
# A replication session that never confirms anything: with wal_sender_timeout off the server
# never asks for a status reply (see reader.stream_messages).
REPLICATION_OPTIONS = SESSION_OPTIONS + " -c wal_sender_timeout=0"
SETTLE_MAX_S = 5.0  # head(): how long a flush position that keeps moving page by page is watched


class PgServer:
    def __init__(self, conn: Connection, *, connect_timeout: float = 10.0):
        self.conn = conn
        self.connect_timeout = connect_timeout
        self._ctl = None
        self._ident: tuple[str, int] | None = None
        self._wal: dict[str, int] | None = None

    # ------------------------------------------------------------------ sessions

    def connect(self, what: str = "", **kw: Any):
        """A new session (the reader and the snapshot open their own, so the control connection
        stays free), with the TLS of the connection's extra (``tls.py``): every session of the
        source is opened here. A certificate that does not verify raises
        :class:`~tidegate.errors.TlsVerificationError`; any other failure a :class:`SourceError`
        (``what`` says what the session was for)."""
        c = self.conn
        kw.setdefault("options", SESSION_OPTIONS)
        kw.setdefault("application_name", "tidegate")
        try:
            return psycopg2.connect(host=c.host or "127.0.0.1", port=int(c.port or 5432),
                                    dbname=c.schema or "postgres", user=c.login, password=c.password,
                                    connect_timeout=int(self.connect_timeout), **libpq_tls(c), **kw)
        except psycopg2.OperationalError as exc:
            tls = tls_failure(c, exc)
            if tls is not None:
                raise tls from None
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SourceError(f"cannot connect to {self.conn}{what}: {msg}") from None

    def connect_replication(self, options: str = REPLICATION_OPTIONS, application_name: str = "tidegate"):
        """A logical replication session (``replication=database``) with the settings
        ``options``: it needs the REPLICATION attribute and a free WAL sender
        (``max_wal_senders``), nothing in pg_hba.conf beyond what a normal session to the
        database needs. ``application_name`` names the run holding the slot (slot.holder_name)."""
        return self.connect(connection_factory=psycopg2.extras.LogicalReplicationConnection,
                            options=options, application_name=application_name)

    def query(self, sql: str, args: Any = None, *, bounded: bool = True) -> list[tuple]:
        """Rows of one statement on the control connection (autocommit), within
        ``TIDEGATE_SOURCE_READ_TIMEOUT_S`` unless ``bounded`` is false (statements that wait
        on the server's own work: creating or advancing a slot can take long on a busy or
        far-behind server)."""
        if self._ctl is None or self._ctl.closed:
            self._ctl = self.connect()
            self._ctl.autocommit = True
        ctl = self._ctl
        if not bounded:
            with ctl.cursor() as cur:
                cur.execute(sql, args)
                return cur.fetchall() if cur.description else []
        timeout = read_timeout_s()
        try:
            with Watchdog(ctl, timeout) as dog, ctl.cursor() as cur:
                cur.execute(sql, args)
                return cur.fetchall() if cur.description else []
        except psycopg2.Error:
            if dog.fired:
                raise SourceError(f"{self.conn} did not answer within {READ_TIMEOUT_ENV}={timeout:g}s: "
                                  f"the server hangs, or the network drops packets. Raise "
                                  f"{READ_TIMEOUT_ENV} if it is only slow") from None
            raise

    def close(self) -> None:
        close_quietly(self._ctl)
        self._ctl = None

    # ------------------------------------------------------------------ identity / head

    def system_and_timeline(self) -> tuple[str, int]:
        """(system identifier, timeline), read once and remembered until :meth:`identity`."""
        if self._ident is None:
            (sysid,) = self.query("SELECT system_identifier::text FROM pg_control_system()")[0]
            self._ident = (sysid, self.timeline())
        return self._ident

    def timeline(self) -> int:
        # On a primary the current WAL file name carries the timeline at once; the control
        # file's checkpoint timeline only changes at the next checkpoint after a promotion.
        (tl,) = self.query("SELECT CASE WHEN pg_is_in_recovery() "
                           "THEN (SELECT timeline_id FROM pg_control_checkpoint()) "
                           "ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int "
                           "END")[0]
        return int(tl)

    def position(self, lsn: Lsn | str) -> PgPosition:
        """A position in this cluster's WAL, on its current timeline."""
        sysid, tl = self.system_and_timeline()
        return PgPosition(Lsn.parse(lsn), sysid, tl)

    def head(self) -> PgPosition:
        """The end of the flushed WAL, never inside a commit record: a run's upper bound.

        Flushed, because logical decoding reads only flushed WAL (a bound beyond it would let
        a read end before transactions that commit at or before the bound, e.g. asynchronous
        commits still in the WAL buffers). The flush position is the end of a record, except
        when the server flushed whole pages and a record continues on the next one: then it
        is a page boundary, possibly inside a commit record, and a bound there would let the
        server skip that transaction once a slot is released to it (it skips every
        transaction whose commit record starts before the slot's position). So a page
        boundary is taken only once it has held for two WAL writer rounds (a commit record
        is always flushed whole within one); any other position at once.
        """
        lsn = self._flush_lsn()
        if lsn.value % self._wal_setting("wal_block_size"):
            return self.position(lsn)
        return self.position(self._settled(lsn))

    def _flush_lsn(self) -> Lsn:
        (lsn,) = self.query("SELECT pg_current_wal_flush_lsn()::text")[0]
        return Lsn.parse(lsn)

    def _settled(self, lsn: Lsn) -> Lsn:
        """The flush position once it is off a page boundary, or has stayed on one for two
        WAL writer rounds (``wal_writer_delay``), or after :data:`SETTLE_MAX_S`."""
        block = self._wal_setting("wal_block_size")
        settle = 2 * self._wal_setting("wal_writer_delay") / 1000 + 0.05
        start = since = time.monotonic()
        while True:
            now = time.monotonic()
            if now - since >= settle or now - start >= SETTLE_MAX_S:
                return lsn
            time.sleep(0.01)
            nxt = self._flush_lsn()
            if nxt.value % block:
                return nxt
            if nxt != lsn:
                lsn, since = nxt, time.monotonic()

    def _wal_setting(self, name: str) -> int:
        """``wal_block_size`` (bytes) or ``wal_writer_delay`` (ms), read once."""
        if self._wal is None:
            rows = self.query("SELECT name, setting::int FROM pg_settings "
                              "WHERE name IN ('wal_block_size', 'wal_writer_delay')")
            self._wal = dict(rows)
        return self._wal[name]

    def identity(self) -> dict[str, Any]:
        self._ident = None  # re-read: the failover guard wants the current timeline
        sysid, tl = self.system_and_timeline()
        (version,) = self.query("SHOW server_version")[0]
        return {"kind": "postgres", "system_id": sysid, "timeline": tl, "version": version}

    def table_columns(self, schema: str, table: str) -> list[str]:
        """The table's columns now, in order (from the catalog), as the log has them: without
        generated columns."""
        rows = self.query("SELECT a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
                          "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND "
                          "c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' "
                          "ORDER BY a.attnum",
                          (schema, table))
        return [r[0] for r in rows]
