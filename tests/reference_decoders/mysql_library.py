"""The reference MySQL/MariaDB log reader: python-mysql-replication (a test oracle, not shipped).

:class:`LibraryReader` reads the binlog through the library's ``BinLogStreamReader``: the
library frames and decodes the events into Python objects, this module turns them into events
and leaves the transaction structure to ``transactions.py``, exactly as the fast reader does.
It is kept as the reference the fast reader is compared with, byte for byte
(``tests/integration/test_mysql_decoder.py``): ``MySqlSource(spec, conn, decoder=library_reader)``.

The library's values are put right where it is wrong in ways that matter to every consumer
(FLOAT precision, TIMESTAMP zone, SET emptiness, JSON text, negative fractional TIME, BINARY
padding; see the fixes in ``values.py``); the cases where it stays wrong are listed there too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

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
from tidegate.errors import SourceError, SourceSettingError
from tidegate.events import ChangeEvent, split_key_change
from tidegate.sources.base import SourceItem
from tidegate.sources.mysql.failover import library_stream
from tidegate.sources.mysql.position import BinlogPosition
from tidegate.sources.mysql.transactions import GtidState, ReadHost, TransactionAssembler, file_seq
from tidegate.sources.mysql.values import as_utc, fix_negative_time2, float32_shortest, library_json_text

MARIADB_FL_STANDALONE = 0x01


def library_reader(source: Any, settings: dict[str, Any], server_id: int, start: BinlogPosition,
                   upto: BinlogPosition, gtids: GtidState) -> LibraryReader:
    """The reader of ``MySqlSource(spec, conn, decoder=library_reader)``: python-mysql-replication
    over the same range (the signature of ``tidegate.sources.mysql.source.fast_decoder``)."""
    stream = library_stream(settings, server_id, resume_stream=True, log_file=start.file, log_pos=start.pos,
                            only_schemas=sorted(source.dbs) if source.dbs else None)
    return LibraryReader(source, stream, start, upto, gtids)


def _is_binary(col) -> bool:
    cs = (getattr(col, "character_set_name", None) or "").lower()
    coll = (getattr(col, "collation_name", None) or "").lower()
    return cs == "binary" or coll == "binary"


class LibraryReader:
    """One bounded pass over the binlog through python-mysql-replication."""

    def __init__(self, host: ReadHost, stream: Any, start: BinlogPosition,
                 upto: BinlogPosition, gtids: GtidState):
        self.host = host
        self.stream = stream
        self.start = start
        self.upto = upto
        self.upto_key = (upto.file_seq, upto.pos)
        self.gtids = gtids
        self.tx = TransactionAssembler(host, start, upto, gtids)
        self.converters: dict[int, tuple[Any, list]] = {}

    def run(self) -> Iterator[SourceItem]:
        tx = self.tx
        for ev in self.stream:
            p = ev.packet
            if isinstance(ev, RotateEvent):
                if p.log_pos == 0:  # artificial rotate at the start of a file / of the stream
                    tx.file = ev.next_binlog
                    if (file_seq(tx.file), ev.position) >= self.upto_key and \
                            (file_seq(tx.file), ev.position) > (self.start.file_seq, self.start.pos):
                        break
                    continue
                pos = p.log_pos - p.event_size
                if (file_seq(tx.file), pos) >= self.upto_key:
                    break
                tx.file = ev.next_binlog
                continue
            pos = p.log_pos - p.event_size
            if (file_seq(tx.file), pos) >= self.upto_key:
                tx.past_upto()
                break
            if isinstance(ev, MariadbGtidEvent):
                self.gtids.add_mariadb(ev.domain_id, ev.server_id, ev.gtid_seq_no)
                tx.begin(pos, ev.gtid, bool(ev.flags & MARIADB_FL_STANDALONE))
            elif isinstance(ev, GtidEvent):
                self.gtids.add_mysql(ev.gtid)
                tx.begin(pos, ev.gtid, False)
            elif isinstance(ev, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                yield from self._rows(ev, pos)
            elif isinstance(ev, XidEvent):
                if not tx.in_tx:
                    raise SourceError(f"XID event at {tx.file}:{pos} outside a transaction")
                yield from tx.end(p.log_pos)
            elif isinstance(ev, QueryEvent):
                db = ev.schema.decode("utf-8", "replace") if isinstance(ev.schema, bytes) \
                    else str(ev.schema or "")
                yield from tx.statement(db, ev.query.strip(), pos, p.log_pos, int(ev.timestamp))
            elif isinstance(ev, XAPrepareEvent):
                raise SourceError(f"XA transaction at {tx.file}:{pos}: XA transactions are not "
                                  f"supported by the binlog source")
        yield from tx.finish()

    # ------------------------------------------------------------------ rows

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
                f"partial row image for {ev.schema}.{ev.table} at {self.tx.file}:"
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
                values[name] = as_utc(v)
            elif kind == "set":
                if v is None and nones.get(name) == NONE_SOURCE.EMPTY_SET:
                    values[name] = []
            elif kind == "json":
                values[name] = library_json_text(v)
            elif kind == "time2":
                values[name] = fix_negative_time2(v)
            elif isinstance(v, bytes):  # ("binary", n): BINARY(n) is zero-padded to n bytes
                values[name] = v.ljust(kind[1], b"\x00")
        return values

    def _rows(self, ev, pos: int) -> Iterator[SourceItem]:
        tx = self.tx
        host = self.host
        if host.tables and (ev.schema, ev.table) not in host.tables:
            return
        if not tx.in_tx:
            raise SourceError(f"row event at {tx.file}:{pos} outside a transaction")
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
        spec = host.spec
        fix = self._fix
        for i, row in enumerate(ev.rows):
            if op == "u":
                before = fix(row["before_values"], row["before_none_sources"], conv) if conv \
                    else row["before_values"]
                after = fix(row["after_values"], row["after_none_sources"], conv) if conv \
                    else row["after_values"]
            elif op == "c":
                before, after = None, (fix(row["values"], row["none_sources"], conv) if conv
                                       else row["values"])
            else:
                before, after = (fix(row["values"], row["none_sources"], conv) if conv
                                 else row["values"]), None
            image = after if after is not None else before
            key = {c: image[c] for c in pk_cols} if pk_cols else None
            tx.total += 1
            n = tx.per_table.get(tkey, 0) + 1
            tx.per_table[tkey] = n
            change = ChangeEvent.build(
                tenant=spec.tenant, pipeline=spec.pipeline, connector="mysql", db=ev.schema,
                schema=ev.schema, table=ev.table, op=op, before=before, after=after, key=key,
                tx_id=tx.tx_id, event_id=f"{tx.file}:{pos}:{i}",
                position={"file": tx.file, "pos": pos, "row": i, "gtid": tx.tx_gtid},
                ts_ms=ts_ms, total_order=tx.total, data_collection_order=n)
            changes = [change]
            if op == "u" and key is not None and {c: before[c] for c in pk_cols} != key:
                # the primary key changed: a delete of the old key, then a create of the new one
                changes = list(split_key_change(change, {c: change.before[c] for c in pk_cols}))
                tx.total += 1
                tx.per_table[tkey] = n + 1
            for c in changes:
                ready = tx.hold(c)
                if ready is not None:
                    yield ready
