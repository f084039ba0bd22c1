"""The MySQL/MariaDB replication protocol, as far as a bounded binlog read needs it.

:class:`BinlogStream` logs in with pymysql (authentication plugins; TLS as the settings it is
given say: :meth:`.server.MySqlServer.connection_settings` adds the connection's, ``tls.py``),
announces what the client understands (CRC32 checksums through ``@master_binlog_checksum``,
MariaDB GTID events through ``@mariadb_slave_capability``), sends ``COM_BINLOG_DUMP`` from a
file/position with the non-blocking flag, so the server stops at its current end of binlog
instead of waiting for new events, and then frames the event stream itself:

* one MySQL packet per event (events of 16 MiB and more span several packets, joined here);
  the first payload byte is ``0x00`` for an event, ``0xFE`` for the end of the stream and
  ``0xFF`` for an error, which is raised as ``pymysql.err.OperationalError(errno, message)``
  just as pymysql would (error 1236 is how the server reports a purged position);
* the 19-byte event header is unpacked with one precompiled ``struct``; the event body is not
  copied: readers parse it in place from the packet with ``unpack_from`` and offsets;
* the CRC32 checksum the server appends to every event is verified (``zlib.crc32``, far below
  one percent of the read time) and excluded from the body.

The stream's first packet may wait longer than the read timeout: the server starts a dump
for a replication client id only once the dump it already has for that id is gone, and a dump
blocked writing to a stopped reader (a stalled run that a newer run took over) goes only when
the server's ``net_write_timeout`` gives up on it (60 s by default; measured on MariaDB 10.11:
a dump of the same id got its first event after 58 s, one of another id at once). So the first
packet waits that long plus :data:`TAKEOVER_MARGIN_S`, when that is more than the read
timeout; every later packet waits the read timeout. A server that hangs is still caught by the
statements sent before the dump, on the read timeout.

The stream knows nothing about event semantics; :mod:`.decoder` interprets the events.
"""

from __future__ import annotations

import logging
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pymysql

from ...errors import SourceError
from ..timeouts import READ_TIMEOUT_ENV, read_timeout_s
from .tls import PyMySqlConnection

COM_BINLOG_DUMP = 0x12
BINLOG_DUMP_NON_BLOCK = 0x01
MARIA_SLAVE_CAPABILITY_GTID = 4  # we understand GTID events (MariaDB sends dummies otherwise)
MAX_PACKET_LEN = 0xFFFFFF
ER_LOST_CONNECTION = 2013
TAKEOVER_MARGIN_S = 30.0  # beyond the server's net_write_timeout, for the stalled dump to go
SLOW_START_S = 2.0  # a first packet later than this is logged (a stalled dump held the id)

log = logging.getLogger(__name__)

# event types (the binlog's own numbering, shared by MySQL and MariaDB below 0xA0)
QUERY_EVENT = 0x02
STOP_EVENT = 0x03
ROTATE_EVENT = 0x04
FORMAT_DESCRIPTION_EVENT = 0x0F
XID_EVENT = 0x10
TABLE_MAP_EVENT = 0x13
WRITE_ROWS_EVENT_V1 = 0x17
UPDATE_ROWS_EVENT_V1 = 0x18
DELETE_ROWS_EVENT_V1 = 0x19
WRITE_ROWS_EVENT_V2 = 0x1E
UPDATE_ROWS_EVENT_V2 = 0x1F
DELETE_ROWS_EVENT_V2 = 0x20
GTID_LOG_EVENT = 0x21
ANONYMOUS_GTID_LOG_EVENT = 0x22
XA_PREPARE_LOG_EVENT = 0x26
PARTIAL_UPDATE_ROWS_EVENT = 0x27
MARIADB_GTID_EVENT = 0xA2
MARIADB_QUERY_COMPRESSED_EVENT = 0xA5
MARIADB_WRITE_ROWS_COMPRESSED_EVENT_V1 = 0xA9
MARIADB_UPDATE_ROWS_COMPRESSED_EVENT_V1 = 0xAA
MARIADB_DELETE_ROWS_COMPRESSED_EVENT_V1 = 0xAB
MARIADB_WRITE_ROWS_COMPRESSED_EVENT = 0xA6
MARIADB_UPDATE_ROWS_COMPRESSED_EVENT = 0xA7
MARIADB_DELETE_ROWS_COMPRESSED_EVENT = 0xA8
MARIADB_COMPRESSED_EVENTS = frozenset({
    MARIADB_QUERY_COMPRESSED_EVENT, MARIADB_WRITE_ROWS_COMPRESSED_EVENT,
    MARIADB_UPDATE_ROWS_COMPRESSED_EVENT, MARIADB_DELETE_ROWS_COMPRESSED_EVENT,
    MARIADB_WRITE_ROWS_COMPRESSED_EVENT_V1, MARIADB_UPDATE_ROWS_COMPRESSED_EVENT_V1,
    MARIADB_DELETE_ROWS_COMPRESSED_EVENT_V1})

# packet payload: 1 status byte (0x00), then the event header
HEADER = struct.Struct("<IBIIIH")  # timestamp, type, server_id, event_size, log_pos, flags
CRC32_RESIDUE = 0x2144DF1C  # the CRC32 of any bytes followed by their own CRC32, little-endian
BODY_OFFSET = 1 + 19


class BinlogStream:
    """One ``COM_BINLOG_DUMP`` from ``file``/``pos`` to the server's current end of binlog.

    Iterating yields ``(type, timestamp, server_id, log_pos, event_size, packet, end)`` per
    event: ``packet`` is the raw payload (the header sits at ``packet[1:20]``, the body at
    ``packet[20:end]``; ``end`` excludes the checksum), ``log_pos`` is the position just after
    the event (0 for the artificial events the server makes up at the start of a file).
    """

    def __init__(self, settings: dict[str, Any], server_id: int, file: str, pos: int, *,
                 read_timeout: float | None = None):
        self.settings = settings
        self.server_id = server_id
        self.file = file
        self.pos = pos
        self.read_timeout = read_timeout_s() if read_timeout is None else read_timeout
        self.checksum = False
        self._conn: pymysql.connections.Connection | None = None
        self._first_wait = self.read_timeout  # the first packet's (see the module docstring)

    def open(self) -> None:
        conn = PyMySqlConnection(**self.settings)
        self._conn = conn
        with conn.cursor() as cur:
            cur.execute("SELECT @@global.binlog_checksum, @@global.net_write_timeout")
            alg, net_write_timeout = cur.fetchone()
            self._first_wait = max(self.read_timeout, float(net_write_timeout or 0) + TAKEOVER_MARGIN_S)
            self.checksum = str(alg or "NONE").upper() != "NONE"
            # Telling the server that we can read checksums makes it send them (and verify
            # nothing on our behalf); a client that says nothing gets its events stripped of
            # them by MySQL but refused by servers that insist. MySQL 8.0.26+ reads the
            # source_* name, older servers and MariaDB the master_* one.
            cur.execute("SET @master_binlog_checksum = @@global.binlog_checksum, "
                        "@source_binlog_checksum = @@global.binlog_checksum, "
                        f"@mariadb_slave_capability = {MARIA_SLAVE_CAPABILITY_GTID}")
        name = self.file.encode("utf-8")
        if self.pos > 0xFFFFFFFF:
            raise SourceError(f"binlog position {self.file}:{self.pos} is beyond 4 GiB, which "
                              f"COM_BINLOG_DUMP cannot address")
        payload = struct.pack("<IHI", self.pos, BINLOG_DUMP_NON_BLOCK, self.server_id) + name
        conn._execute_command(COM_BINLOG_DUMP, payload)
        conn._sock.settimeout(self._first_wait)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            # Not conn.close(): COM_QUIT would wait behind the rest of the stream the server
            # is still sending when a read stops before the end of the binlog.
            conn._force_close()
        except Exception:  # noqa: BLE001 - closing must not raise
            pass

    def __iter__(self) -> Iterator[tuple[int, int, int, int, int, bytes, int]]:
        if self._conn is None:
            self.open()
        read = self._conn._rfile.read
        unpack_header = HEADER.unpack_from
        crc32 = zlib.crc32
        trailer = 4 if self.checksum else 0
        pkt = self._first_packet(read)
        while True:
            status = pkt[0]
            if status:
                if status == 0xFE and len(pkt) < 9:
                    return  # end of the binlog (non-blocking dump)
                if status == 0xFF:
                    raise _server_error(pkt)
                raise SourceError(f"unexpected packet (status byte 0x{status:02x}) in the binlog "
                                  f"stream after {self.file}:{self.pos}")
            ts, etype, sid, size, log_pos, _flags = unpack_header(pkt, 1)
            n = len(pkt)
            if size != n - 1:
                raise SourceError(f"malformed binlog event of type {etype} ending at {log_pos}: "
                                  f"the header says {size} bytes, the packet holds {n - 1}")
            end = n - trailer
            # An event followed by its own CRC32 (little-endian) has the CRC32 residue as its
            # CRC32: one call checks it, with no slice of the checksum to read.
            if trailer and crc32(memoryview(pkt)[1:]) != CRC32_RESIDUE:
                raise SourceError(f"binlog event of type {etype} ending at {log_pos} failed its "
                                  f"CRC32 check: the stream is corrupt")
            yield etype, ts, sid, log_pos, size, pkt, end
            pkt = self._packet(read)

    def _first_packet(self, read) -> bytes:
        """The dump's first packet, waited for up to ``_first_wait``; then the read timeout."""
        if self._first_wait == self.read_timeout:
            return self._packet(read)
        began = time.monotonic()
        try:
            pkt = _one_packet(read)
        except TimeoutError:
            raise SourceError(
                f"the server did not start the binlog dump from {self.file}:{self.pos} within "
                f"{self._first_wait:g}s: it hangs, or a dump of replication client id {self.server_id} "
                f"(the pipeline's server_id) it still serves outlives its net_write_timeout") from None
        except OSError as exc:
            raise _lost(exc) from None
        waited = time.monotonic() - began
        if waited > SLOW_START_S:
            log.info("the server started the binlog dump for replication client id %s after %.1fs: it "
                     "was still serving an earlier dump of that id (a stalled run's) until its "
                     "net_write_timeout dropped it", self.server_id, waited)
        self._conn._sock.settimeout(self.read_timeout)
        return pkt if len(pkt) < MAX_PACKET_LEN else self._packet(read, pkt)

    def _packet(self, read, first: bytes | None = None) -> bytes:
        """The next event's packet (``first``: its first part, already read)."""
        try:
            pkt = _one_packet(read) if first is None else first
            if len(pkt) < MAX_PACKET_LEN:
                return pkt
            parts = [pkt]  # an event of 16 MiB or more continues in the next packets
            while len(parts[-1]) == MAX_PACKET_LEN:
                parts.append(_one_packet(read))
            return b"".join(parts)
        except TimeoutError:
            raise SourceError(f"the server sent nothing for {self.read_timeout:g}s "
                              f"({READ_TIMEOUT_ENV}) while streaming its binlog from "
                              f"{self.file}:{self.pos}: it hangs, or the network drops packets. "
                              f"Raise {READ_TIMEOUT_ENV} if the server is only slow") from None
        except OSError as exc:
            raise _lost(exc) from None


def _one_packet(read: Callable[[int], bytes]) -> bytes:
    """One protocol packet: a 3-byte length, a sequence byte, the payload."""
    head = read(4)
    if len(head) < 4:
        raise _lost()
    n = head[0] | head[1] << 8 | head[2] << 16
    pkt = read(n)
    if len(pkt) < n:
        raise _lost()
    return pkt


def _lost(exc: OSError | None = None) -> pymysql.err.OperationalError:
    return pymysql.err.OperationalError(ER_LOST_CONNECTION, "Lost connection to server during binlog read"
                                        + (f": {exc}" if exc is not None else ""))


def _server_error(pkt: bytes) -> pymysql.err.OperationalError:
    errno = int.from_bytes(pkt[1:3], "little")
    msg = pkt[3:]
    if msg[:1] == b"#":  # SQL state marker and 5-character state
        msg = msg[6:]
    return pymysql.err.OperationalError(errno, msg.decode("utf-8", "replace"))
