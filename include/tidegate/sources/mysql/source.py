"""``MySqlSource``: the Source interface over the roles of this package.

It composes the server (``server.py``: control connection, identity, head, binlog files), a
log decoder per read (``decoder.py`` over ``transactions.py``; the constructor takes
another, such as the reference decoder in tests/reference_decoders), the preflight
(``preflight.py``) and failover (``failover.py``), and owns what belongs to a pipeline: the
table filter, the replication client id, and the schema changes met while reading. The
contract it keeps is in ``sources/mysql/__init__.py``."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import pymysql

from ...connections import Connection
from ...errors import PositionPurgedError, SourceError
from ...events import ControlMessage
from ...filters import TableFilter, captured
from ...positions import Position, check_comparable
from ...spec import PipelineSpec
from ...store.records import CheckpointRecord
from ..base import Source, SourceItem
from ..preflight import Problem
from . import failover, slicing
from . import preflight as server_checks
from .binlog_client import BinlogStream
from .columns import columns_after
from .ddl import captured_targets, tables_changed
from .decoder import BinlogDecoder, collation_codecs, native_allowed
from .position import BinlogPosition, GtidSet
from .server import MySqlServer
from .snapshot import MySqlCatalog, MySqlSnapshotReads
from .tls import tls_failure
from .transactions import GtidState, SchemaChange, file_seq

log = logging.getLogger(__name__)

ER_MASTER_FATAL_ERROR_READING_BINLOG = 1236
_SLICE_ID_STRIDE = 7919  # server ids of parallel slice readers: base + k * stride (mod 2^32)
# A read's look-ahead for a table's columns after a DDL (columns.py) runs beside the read, as
# another replication client: its id is the read's plus this (no multiple of the stride).
_LOOKAHEAD_ID_OFFSET = 1_000_003
SLICE_BYTES = 64 * 1024 * 1024  # default size above which a binlog file is cut into slices


def fast_decoder(source: MySqlSource, settings: dict[str, Any], server_id: int, start: BinlogPosition,
                 upto: BinlogPosition, gtids: GtidState) -> BinlogDecoder:
    """The default decoder: our own replication protocol client and row plans. A decoder is
    made per read from the connection settings, the replication client id, the range and the
    GTID state at ``start``; its ``run()`` yields the items and its ``stream`` is closed after."""
    stream = BinlogStream(settings, server_id, start.file, start.pos)
    return BinlogDecoder(source, stream, start, upto, gtids, collation_codecs(source.server.query),
                         native=native_allowed(source))


Decoder = Callable[[Any, dict[str, Any], int, BinlogPosition, BinlogPosition, GtidState], Any]


class MySqlSource(MySqlCatalog, Source):  # the catalog and snapshot reads: snapshot.py
    """Bounded reads of a MySQL/MariaDB binlog. See ``sources/mysql/__init__.py`` for the
    contract."""

    kind = "mysql"
    translates_positions = True

    def __init__(self, spec: PipelineSpec, conn: Connection, *, server_id: int | None = None,
                 connect_timeout: float = 10.0, decoder: Decoder = fast_decoder,
                 slice_bytes: int | None = None, hash_salt: bytes | None = None):
        self.spec = spec
        self.conn = conn
        self.server = MySqlServer(conn, connect_timeout=connect_timeout)
        self.decoder = decoder  # makes the log decoder of each read (fast_decoder)
        # A binlog file larger than this is cut into several slices (slices()).
        # TIDEGATE_MYSQL_SLICE_BYTES sets the default.
        self.slice_bytes = int(slice_bytes or os.environ.get("TIDEGATE_MYSQL_SLICE_BYTES") or SLICE_BYTES)
        if self.slice_bytes < 1:
            raise ValueError(f"MySQL slice size {self.slice_bytes} (slice_bytes= or "
                             f"TIDEGATE_MYSQL_SLICE_BYTES) must be a positive number of bytes")
        # A replication client id must be unique among the server's replicas: the spec's, or a
        # stable one derived from the pipeline name (`tidegate validate` refuses two alike).
        self.client_server_id = int(server_id or spec.replication_client()[1])
        # source.tables: a set of names (empty: all), or a TableFilter for patterns and excludes;
        # the databases a captured table can be in (empty: any), whose other row events are skipped
        self.tables: frozenset[tuple[str, str]] | TableFilter = captured(spec.source.tables)
        self.dbs: frozenset[str] = self.tables.schemas if isinstance(self.tables, TableFilter) \
            else frozenset(d for d, _ in self.tables)
        self.use_filters(hash_salt)
        self.schema_changes: list[SchemaChange] = []
        self._read_server_id = self.client_server_id

    def close(self) -> None:
        self.server.close()

    def snapshots(self) -> MySqlSnapshotReads:
        return MySqlSnapshotReads(self)

    # ------------------------------------------------------------------ server and positions

    @property
    def is_mariadb(self) -> bool:
        return self.server.is_mariadb

    def identity(self) -> dict[str, Any]:
        return self.server.identity()

    def head(self) -> BinlogPosition:
        """The current end of the binlog: (file, pos) and the executed GTID set at it."""
        return self.server.head()

    def earliest(self) -> BinlogPosition:
        """The earliest position still available (the start of the oldest binlog file)."""
        return self.server.earliest()

    def gtid_at(self, file: str, pos: int) -> GtidSet | None:
        """MariaDB: the GTID position (last GTID per domain) at a binlog coordinate."""
        return self.server.gtid_at(file, pos)

    def log_sizes(self) -> dict[str, int]:
        return dict(self.server.binlog_files())

    def position(self, file: str, pos: int, gtid_set: GtidSet | None) -> BinlogPosition:
        """A position on this server (the readers' :class:`~.transactions.ReadHost`)."""
        return self.server.position(file, pos, gtid_set)

    # ------------------------------------------------------------------ settings

    def settings(self) -> dict[str, Any]:
        return self.server.settings()

    def preflight(self, checkpoint: CheckpointRecord | None = None) -> list[Problem]:
        """Settings, privileges and retention headroom (binlog expiry against the age of the
        oldest checkpoint)."""
        if checkpoint is None:
            return self.check_server(None) + self.filter_problems()
        return self.check_server(checkpoint.position, server_checks.checkpoint_age_s(checkpoint)) + \
            self.filter_problems()

    def check_server(self, checkpoint: BinlogPosition | None = None,
                     checkpoint_age_s: float | None = None,
                     headroom_warn_fraction: float = 0.5) -> list[Problem]:
        """:func:`.preflight.check_server` for a checkpoint position and age."""
        return server_checks.check_server(self.server, checkpoint, checkpoint_age_s, headroom_warn_fraction)

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

    def log_gone_before(self, start: BinlogPosition) -> str | None:
        """The binlog file of ``start`` was purged: the server keeps binlogs for its own expiry,
        whatever tidegate releases."""
        earliest = self.earliest()
        if not start < earliest:
            return None
        return (f"the earliest binlog still on {self.conn} is {earliest.file} (older ones were purged). "
                f"The server keeps binlogs for binlog_expire_logs_seconds (or expire_logs_days): raise "
                f"it to replay or rewind further back")

    def translate(self, checkpoint: Position) -> BinlogPosition:
        """A checkpoint of another server of the topology, placed here by its GTID set."""
        return failover.translate(self.server, self.client_server_id, checkpoint)

    def resume_point_for_gtids(self, gtid_set: GtidSet | str) -> BinlogPosition:
        """See :func:`.failover.resume_point_for_gtids`."""
        return failover.resume_point_for_gtids(self.server, self.client_server_id, gtid_set)

    def describe_change(self, old_identity: dict[str, Any]) -> str:
        return failover.describe_change(self.identity(), old_identity)

    # ------------------------------------------------------------------ reading

    def read(self, start: BinlogPosition | None, upto: BinlogPosition) -> Iterator[SourceItem]:
        """Rows of the transactions committed in (start, upto], in binlog order."""
        return self._read(start, upto, self.client_server_id)

    def slices(self, start: BinlogPosition | None, upto: BinlogPosition,
               max_bytes: int | None = None) -> list[tuple[BinlogPosition, BinlogPosition]]:
        """(start, upto] cut into ranges that can be read independently: one per binlog file,
        each starting at the file's start or at ``start`` and ending at the file's end or at
        ``upto``, and a range larger than :attr:`slice_bytes` (or ``max_bytes``, if lower) cut
        further at transaction boundaries inside the file (:func:`.slicing.cut_points`), so
        that one large file is decoded by several readers. Reading each with
        :meth:`read_slice` (in any order, in parallel) and concatenating the items in slice
        order gives the items of :meth:`read` over the whole range (a slice whose last
        transactions deliver nothing ends with a :class:`PositionMark` of its end)."""
        if start is None:
            start = self.earliest()
        if start >= upto:
            return []
        self.server.check_available(start)
        target = min(self.slice_bytes, max_bytes) if max_bytes else self.slice_bytes
        out = []
        for name, size in self.server.binlog_files():
            seq = file_seq(name)
            if seq < start.file_seq or seq > upto.file_seq:
                continue
            frm = start if name == start.file else self.position(name, 4, None)
            to = upto if name == upto.file else self.position(name, size, None)
            if not frm < to:
                continue
            cuts = slicing.cut_points(self.server.query, name, frm.pos, to.pos, target) \
                if to.pos - frm.pos > target else []
            bounds = [frm] + [self.position(name, c, None) for c in cuts] + [to]
            out += list(zip(bounds, bounds[1:], strict=False))
        return out

    def read_slice(self, frm: BinlogPosition, to: BinlogPosition, index: int = 0) -> Iterator[SourceItem]:
        """Read one slice of :meth:`slices`. ``index`` (the slice's) picks a distinct replication client id,
        so slices can be read at the same time (the server drops a second connection that uses
        the same id)."""
        sid = (self.client_server_id + (index + 1) * _SLICE_ID_STRIDE) % (1 << 32) or 1
        return self._read(frm, to, sid)

    def _read(self, start: BinlogPosition | None, upto: BinlogPosition,
              server_id: int) -> Iterator[SourceItem]:
        if upto is None:
            raise ValueError("read needs an upper bound (head() at the start of the run)")
        if start is None:
            start = self.earliest()
        self.schema_changes = []
        self._read_server_id = server_id
        if start >= upto:
            return
        self.server.check_available(start)
        seed = start.gtid_set if start.gtid_set is not None else self.gtid_at(start.file, start.pos)
        gtids = GtidState(seed, "mariadb" if self.is_mariadb else "mysql")
        settings = self.server.connection_settings()
        decoder = self.decoder(self, settings, server_id, start, upto, gtids)
        try:
            yield from self.filtered(decoder.run())
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
            tls = tls_failure(self.conn, exc)  # the stream's own connect (or a look-ahead's)
            if tls is not None:
                raise tls from None
            raise
        finally:
            decoder.stream.close()

    def record_schema_change(self, change: SchemaChange) -> list[ControlMessage]:
        """A DDL statement the decoder met (the decoders' :class:`~.transactions.ReadHost`): one
        ``schema_change`` control message per captured table it changes (see
        ``sources/mysql/__init__.py``, "Schema changes"); none when it changes none."""
        what = tables_changed(change.query, change.db)
        if what is None:
            return []
        targets = captured_targets(what.tables, self.tables)
        if not targets:
            return []
        log.info("schema change at %s (%s): %s", change.position, change.tx_id, change.query)
        self.schema_changes.append(change)
        spec = self.spec
        where, end = change.position, change.end_position
        sid = (self._read_server_id + _LOOKAHEAD_ID_OFFSET) % (1 << 32) or 1  # the look-ahead's own
        messages = []
        for db, table in dict.fromkeys(targets):
            gone = (db, table) in what.gone or (db, None) in what.gone
            columns = [] if gone else None if table is None else columns_after(
                self.server.connection_settings(), sid, end.file, end.pos, db, table, mariadb=self.is_mariadb)
            fields = {"change": what.kind, "ddl": change.query, "db": db, "schema": db, "table": table,
                      "columns": columns}
            messages.append(ControlMessage(
                spec.tenant, spec.pipeline, "schema_change",
                f"{where.file}:{where.pos}:{db}.{table if table is not None else '*'}",
                {"file": where.file, "pos": where.pos, "gtid": change.gtid}, change.ts_ms, fields,
                tx_id=change.tx_id))
        return messages

