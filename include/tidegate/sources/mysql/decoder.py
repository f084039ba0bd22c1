"""The fast binlog reader: transactions and change events straight from the event bytes.

:class:`BinlogDecoder` is the default read path of :class:`~.source.MySqlSource`
(``source.fast_decoder``). It has exactly the semantics of the reference ``LibraryReader``
(python-mysql-replication, in tests/reference_decoders): both hand the transaction structure
to the same :class:`~.transactions.TransactionAssembler` (so the same transactions, tx ids,
end positions and GTID sets, schema-change records, statement checks and final
``PositionMark``), and this reader gives the same event ids and positions, the same errors for
partial row images and missing column names and the same stop at ``upto``.
``tests/integration/test_mysql_decoder.py`` reads one binlog with both and compares every item
byte for byte.

What makes it fast (``benchmarks/source_read.py``: 200k changes of an 11-column table in
transactions of 10 rows, 60/30/10 % inserts/updates/deletes): 80-85k events per second of
the reader's CPU against about 9k for the library path (8-9x less CPU); on the two cores of
the reference machine, shared with the server and other work (load average 4-7), 41-50k
events/s wall-clock against 6-7k:

* no event objects: :mod:`.binlog_client` frames packets and the loop below dispatches on the
  event type byte; events a read does not need (and row events of tables it does not
  capture, after reading only their table id) are skipped without parsing;
* one :class:`~.row_plans.TablePlan` per table definition, cached by the TABLE_MAP bytes, so
  the table map MariaDB writes before every row event costs one dictionary lookup;
* rows decoded by the plan's generated function straight into JSON-native values, and events
  built with ``ChangeEvent.native`` (no second encoding pass, no re-validation); the envelope
  is serialized by orjson (``events.py``).

Why there is no compiled extension: pure Python reaches the target of 50k events/s whenever
the reader has a core (its CPU cost is 12 us an event); only a machine loaded past its cores
brings the wall-clock figure below it. Of those 12 us, about 5 are row decoding (the
generated code, 3 us for an 11-column row), 3 building the event and 4 serializing the
envelope (uuid5, dicts, orjson). A compiled row decoder would remove most of the first part
only, as long as events carry Python dicts for ``before`` and ``after``; it pays off once the
envelope bytes are produced natively too.

Beyond the library path, it refuses what the library silently drops: MySQL partial JSON
updates (``binlog_row_value_options=PARTIAL_JSON``) and MariaDB compressed events
(``log_bin_compress=ON``) raise :class:`SourceSettingError` naming the setting.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import orjson

from ...errors import SourceError, SourceSettingError
from ...events import ChangeEvent, split_key_change
from ...native import rowcodec
from ...shipped import ShippedEvent
from ..base import SourceItem
from .binlog_client import (
    DELETE_ROWS_EVENT_V1,
    DELETE_ROWS_EVENT_V2,
    FORMAT_DESCRIPTION_EVENT,
    GTID_LOG_EVENT,
    MARIADB_COMPRESSED_EVENTS,
    MARIADB_GTID_EVENT,
    MARIADB_QUERY_COMPRESSED_EVENT,
    PARTIAL_UPDATE_ROWS_EVENT,
    QUERY_EVENT,
    ROTATE_EVENT,
    TABLE_MAP_EVENT,
    UPDATE_ROWS_EVENT_V1,
    UPDATE_ROWS_EVENT_V2,
    WRITE_ROWS_EVENT_V1,
    WRITE_ROWS_EVENT_V2,
    XA_PREPARE_LOG_EVENT,
    XID_EVENT,
    BinlogStream,
)
from .columns import query_text
from .position import BinlogPosition
from .row_plans import TablePlan, build_plan, lenenc, parse_table_map, table_names
from .transactions import GtidState, ReadHost, TransactionAssembler, file_seq
from .values import python_codec

BODY = 20  # payload offset of an event body: status byte + 19-byte header
MARIADB_FL_STANDALONE = 0x01
_OPS = {WRITE_ROWS_EVENT_V1: "c", WRITE_ROWS_EVENT_V2: "c", UPDATE_ROWS_EVENT_V1: "u",
        UPDATE_ROWS_EVENT_V2: "u", DELETE_ROWS_EVENT_V1: "d", DELETE_ROWS_EVENT_V2: "d"}
_V2 = frozenset({WRITE_ROWS_EVENT_V2, UPDATE_ROWS_EVENT_V2, DELETE_ROWS_EVENT_V2})
_SKIP = object()  # table id of a table map whose schema a filtered read does not capture
native_rows = rowcodec.encode_rows if rowcodec is not None else None
_PLAN_CACHE_MAX = 10_000


def collation_codecs(query: Callable[[str], list[tuple]]) -> Callable[[int | None], str | None]:
    """Collation id → Python codec, from the server's own collation table (it knows ids that
    no table shipped with a client library knows, e.g. MariaDB's UCA 14 collations).
    ``query(sql)`` runs a query on the server's control connection."""
    rows = query("SELECT ID, CHARACTER_SET_NAME FROM information_schema.COLLATIONS")
    charset = {int(i): name for i, name in rows if i is not None}
    cache: dict[int | None, str | None] = {}

    def codec_for(collation: int | None) -> str | None:
        if collation not in cache:
            if collation is None:
                cache[collation] = "utf-8"
            elif collation == 63:
                cache[collation] = None
            elif collation not in charset:
                raise SourceError(f"collation id {collation} in the binlog is unknown to the "
                                  f"server's information_schema.COLLATIONS")
            else:
                cache[collation] = python_codec(charset[collation])
        return cache[collation]

    return codec_for


def native_allowed(source: Any) -> bool:
    """Whether a read may take the compiled path: it writes the events as they leave the log,
    in the default envelope, so a source whose column rules rewrite values takes the Python
    path, and so does a pipeline whose spec asks for another envelope (a spec ``envelope``
    other than ``tidegate``; sinks that build their own message from the fields still get
    them, parsed from the envelope on first use: shipped.ShippedEvent)."""
    if getattr(source, "column_filters", None) is not None:
        return False
    return getattr(source.spec, "envelope", "tidegate") in (None, "tidegate")


class BinlogDecoder:
    """One bounded pass over the binlog, from the raw events of a :class:`BinlogStream`."""

    def __init__(self, host: ReadHost, stream: BinlogStream, start: BinlogPosition,
                 upto: BinlogPosition, gtids: GtidState,
                 codec_for: Callable[[int | None], str | None], native: bool = True):
        self.host = host
        self.stream = stream
        self.start = start
        self.upto = upto
        self.upto_key = (upto.file_seq, upto.pos)
        self.gtids = gtids
        self.tx = TransactionAssembler(host, start, upto, gtids)
        self.tables = host.tables
        self.dbs = host.dbs
        self.mariadb = host.is_mariadb
        self.codec_for = codec_for
        self.file_seq = start.file_seq
        self.post_header = bytes(256)  # per event type, from the format description event
        self.plans: dict[bytes, TablePlan] = {}  # by table map bytes
        self.by_id: dict[int, Any] = {}  # table id → TablePlan or _SKIP
        # Rows through the compiled path where it is built and allowed (native_allowed)
        self.native = native and native_rows is not None
        # The envelope text rows events share: per table, and per transaction (_table_parts,
        # _tx_parts), built once rather than for every rows event.
        self.table_parts: dict[tuple[str, str], tuple[bytes, bytes, bytes]] = {}
        self.tx_parts: tuple = (None,)

    # ------------------------------------------------------------------ the event loop

    def run(self) -> Iterator[SourceItem]:
        tx = self.tx
        upto_key = self.upto_key
        start_key = (self.start.file_seq, self.start.pos)
        by_id = self.by_id
        ops = _OPS
        for etype, ts, sid, log_pos, size, pkt, end in self.stream:
            if etype == TABLE_MAP_EVENT:
                self._table_map(pkt, end)
                continue
            op = ops.get(etype)
            if op is not None:
                plan = by_id.get(self._table_id(pkt, etype))
                if plan is _SKIP:
                    continue  # a schema this read does not capture: not even a bound check
                pos = log_pos - size
                if (self.file_seq, pos) >= upto_key:
                    tx.past_upto()
                    break
                yield from self._rows(plan, op, etype, pkt, end, pos, ts)
                continue
            if etype == ROTATE_EVENT:
                position = int.from_bytes(pkt[BODY:BODY + 8], "little")
                name = pkt[BODY + 8:end].decode()
                if log_pos == 0:  # artificial rotate at the start of a file / of the stream
                    tx.file, self.file_seq = name, file_seq(name)
                    key = (self.file_seq, position)
                    if key >= upto_key and key > start_key:
                        break
                    continue
                if (self.file_seq, log_pos - size) >= upto_key:
                    break
                tx.file, self.file_seq = name, file_seq(name)
                by_id.clear()  # table ids are only valid within one binlog file
                continue
            if etype == FORMAT_DESCRIPTION_EVENT:
                self._format_description(pkt, end)
                continue
            if etype not in (MARIADB_GTID_EVENT, GTID_LOG_EVENT, QUERY_EVENT, XID_EVENT,
                             XA_PREPARE_LOG_EVENT, PARTIAL_UPDATE_ROWS_EVENT) and \
                    etype not in MARIADB_COMPRESSED_EVENTS:
                continue  # events a read does not need
            pos = log_pos - size
            if (self.file_seq, pos) >= upto_key:
                tx.past_upto()
                break
            if etype == PARTIAL_UPDATE_ROWS_EVENT or etype in MARIADB_COMPRESSED_EVENTS:
                self._refuse(etype, pkt, pos)
                continue
            if etype == MARIADB_GTID_EVENT:
                seq = int.from_bytes(pkt[BODY:BODY + 8], "little")
                domain = int.from_bytes(pkt[BODY + 8:BODY + 12], "little")
                flags = pkt[BODY + 12]
                self.gtids.add_mariadb(domain, sid, seq)
                tx.begin(pos, f"{domain}-{sid}-{seq}", bool(flags & MARIADB_FL_STANDALONE))
            elif etype == GTID_LOG_EVENT:
                x = pkt[BODY + 1:BODY + 17].hex()
                gno = int.from_bytes(pkt[BODY + 17:BODY + 25], "little")
                gtid = f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}:{gno}"
                self.gtids.add_mysql(gtid)
                tx.begin(pos, gtid, False)
            elif etype == XID_EVENT:
                if not tx.in_tx:
                    raise SourceError(f"XID event at {tx.file}:{pos} outside a transaction")
                yield from tx.end(log_pos)
            elif etype == QUERY_EVENT:
                yield from self._query(pkt, end, pos, log_pos, ts)
            else:
                raise SourceError(f"XA transaction at {tx.file}:{pos}: XA transactions are not "
                                  f"supported by the binlog source")
        yield from tx.finish()

    def _refuse(self, etype: int, pkt: bytes, pos: int) -> None:
        """Events the library path drops without a word, which would lose changes here: refuse
        them, unless they are row events of a table the read does not capture."""
        if etype != MARIADB_QUERY_COMPRESSED_EVENT:
            plan = self.by_id.get(self._table_id(pkt, etype))
            if plan is _SKIP or (plan is not None and self.tables and
                                 (plan.schema, plan.table) not in self.tables):
                return
        if etype == PARTIAL_UPDATE_ROWS_EVENT:
            raise SourceSettingError(
                f"partial JSON update at {self.tx.file}:{pos}: CDC needs full row images; set "
                f"binlog_row_value_options='' (SET GLOBAL, and in the server config)")
        raise SourceSettingError(
            f"compressed binlog event at {self.tx.file}:{pos}: the binlog reader does not "
            f"decompress events; set log_bin_compress=OFF (SET GLOBAL, and in the server config)")

    def _format_description(self, pkt: bytes, end: int) -> None:
        # binlog version (2), server version (50), create time (4), header length (1), then
        # one post-header length per event type, then the checksum algorithm byte.
        lengths = pkt[BODY + 57:end - 1]
        self.post_header = bytes(lengths) + bytes(max(0, 256 - len(lengths)))

    def _post_header_len(self, etype: int, default: int) -> int:
        return self.post_header[etype - 1] or default

    def _table_id(self, pkt: bytes, etype: int) -> int:
        n = 4 if self._post_header_len(etype, 8) == 6 else 6
        return int.from_bytes(pkt[BODY:BODY + n], "little")

    # ------------------------------------------------------------------ table maps and rows

    def _table_map(self, pkt: bytes, end: int) -> None:
        body = pkt[BODY:end]
        plan = self.plans.get(body)
        if plan is not None:
            self.by_id[plan.table_id] = plan
            return
        phl = self._post_header_len(TABLE_MAP_EVENT, 8)
        tid, schema, table = table_names(pkt, BODY, phl)
        if self.dbs and schema not in self.dbs:
            self.by_id[tid] = _SKIP
            return
        tm = parse_table_map(pkt, BODY, end, phl, mariadb=self.mariadb)
        plan = build_plan(tm, self.codec_for)
        if len(self.plans) >= _PLAN_CACHE_MAX:
            self.plans.clear()
        self.plans[body] = plan
        self.by_id[tid] = plan

    def _rows(self, plan: TablePlan | None, op: str, etype: int, pkt: bytes, end: int, pos: int,
              ts: int) -> Iterator[SourceItem]:
        tx = self.tx
        if plan is None:
            raise SourceError(f"row event at {tx.file}:{pos} refers to table id "
                              f"{self._table_id(pkt, etype)} without a TABLE_MAP event before it")
        schema, table = plan.schema, plan.table
        if self.tables and (schema, table) not in self.tables:
            return
        if not tx.in_tx:
            raise SourceError(f"row event at {tx.file}:{pos} outside a transaction")
        if plan.missing_name is not None:
            raise SourceSettingError(
                f"the binlog has no column names for {schema}.{table} (column "
                f"{plan.missing_name + 1}): CDC needs binlog_row_metadata=FULL when the rows are "
                f"written (SET GLOBAL binlog_row_metadata=FULL, and in the server config); column "
                f"names are never guessed from the current schema")
        o = BODY + self._post_header_len(etype, 10 if etype in _V2 else 8)
        if etype in _V2:  # the v2 post-header's last field is the extra data length
            o += int.from_bytes(pkt[o - 2:o], "little") - 2
        ncols, o = lenenc(pkt, o)
        nb = (ncols + 7) // 8
        self._check_image(plan, pkt[o:o + nb], pos)
        o += nb
        if op == "u":
            self._check_image(plan, pkt[o:o + nb], pos)
            o += nb
        decode = plan.decode
        if decode is None:
            raise SourceError(f"cannot decode rows of {schema}.{table} at {tx.file}:{pos}: "
                              f"{plan.error}")
        if plan.native is not None and self.native:
            events = self._native_rows(plan, op, pkt, o, end, pos, ts)
            if events is not None:
                yield from self._hold_last(events)
                return
        rows = []
        flag = plan.float_flag
        flag[0] = False
        try:
            while o < end:
                image, o = decode(pkt, o)
                if op == "u":
                    after, o = decode(pkt, o)
                    rows.append((image, after))
                elif op == "c":
                    rows.append((None, image))
                else:
                    rows.append((image, None))
        except (ValueError, IndexError, UnicodeDecodeError, KeyError) as exc:
            raise SourceError(f"cannot decode a row of {schema}.{table} at {tx.file}:{pos}: "
                              f"{type(exc).__name__}: {exc}") from None
        if o != end:
            raise SourceError(f"row event of {schema}.{table} at {tx.file}:{pos} is "
                              f"{o - end} bytes longer than its rows: the table map does not "
                              f"match the rows")
        spec = self.host.spec
        tenant, pipeline = spec.tenant, spec.pipeline
        pk = plan.pk
        checked = not flag[0]
        tkey = (schema, table)
        per_table = tx.per_table
        file, tx_id, tx_gtid = tx.file, tx.tx_id, tx.tx_gtid
        ts_ms = ts * 1000
        native = ChangeEvent.native
        pk0 = pk[0] if len(pk) == 1 else None
        total = tx.total
        n = per_table.get(tkey, 0)
        pending = tx.pending
        for i, (before, after) in enumerate(rows):
            image = after if after is not None else before
            if pk0 is not None:
                key = {pk0: image[pk0]}
            else:
                key = {c: image[c] for c in pk} if pk else None
            total += 1
            n += 1
            ev = native(tenant, pipeline, "mysql", schema, schema, table, op, before, after, key,
                        tx_id, f"{file}:{pos}:{i}",
                        {"file": file, "pos": pos, "row": i, "gtid": tx_gtid}, ts_ms, total, n,
                        False, False, None, checked)
            if op == "u" and key is not None:
                old = {pk0: before[pk0]} if pk0 is not None else {c: before[c] for c in pk}
                if old != key:  # the primary key changed: a delete (held), then a create
                    if pending is not None:
                        yield pending
                    pending, ev = split_key_change(ev, old)
                    total += 1
                    n += 1
            if pending is not None:
                yield pending
            pending = ev
        # the last row stays held back: the transaction's end marks it (TransactionAssembler)
        tx.pending = pending
        tx.total = total
        per_table[tkey] = n

    def _native_rows(self, plan: TablePlan, op: str, pkt: bytes, o: int, end: int, pos: int,
                     ts: int) -> list[ChangeEvent] | None:
        """The event's rows through the compiled path (tidegate.native.rowcodec): events whose
        value, key and idempotency key are the bytes the Python path below gives, or None when
        the compiled path leaves this event to it (see rowcodec's docstring)."""
        tx = self.tx
        schema, table = plan.schema, plan.table
        table_parts = self.table_parts.get((schema, table))
        if table_parts is None:
            table_parts = self.table_parts[(schema, table)] = self._table_parts(schema, table)
        ikey, ikey_json, head = table_parts
        if self.tx_parts[0] != (tx.tx_id, tx.file, tx.tx_gtid):
            self.tx_parts = self._tx_parts()
        _, tx_ikey, tx_ikey_json, tx_head, gtid_part, tx_part = self.tx_parts
        at = str(pos).encode()
        ts_ms = str(ts * 1000).encode()
        common = {"op": op, "db": schema, "schema": schema, "table": table, "tx_id": tx.tx_id,
                  "tx_end": False, "end_position": None}
        tkey = (schema, table)
        n = tx.per_table.get(tkey, 0)
        at_row = at + b":"
        events = native_rows(plan.native, pkt, o, end, op, ikey + tx_ikey + at_row,
                             ikey_json + tx_ikey_json + at_row,
                             head + tx_head + at + b',"row":', gtid_part + ts_ms + tx_part,
                             b'},"ts_ms":' + ts_ms + b"}", tx.total, n, ShippedEvent, common)
        if events is not None:
            tx.total += len(events)
            tx.per_table[tkey] = n + len(events)
        return events

    def _table_parts(self, schema: str, table: str) -> tuple[bytes, bytes, bytes]:
        """The start of a table's envelopes (kept per table): its idempotency key and that
        key's JSON text up to the transaction id, and its source block up to the same."""
        spec, dumps = self.host.spec, orjson.dumps
        ikey = f"{spec.tenant}|{spec.pipeline}|{schema}.{table}|"
        head = (b',"source":{"connector":"mysql","pipeline":' + dumps(spec.pipeline) + b',"db":'
                + dumps(schema) + b',"schema":' + dumps(schema) + b',"table":' + dumps(table)
                + b',"tx_id":')
        return ikey.encode(), dumps(ikey)[:-1], head

    def _tx_parts(self) -> tuple:
        """The open transaction's part of its envelopes (kept while it is open): the
        idempotency key's from the transaction id to the event's position, as text and as JSON
        text (escaping is per character, so the key's JSON is its parts' JSON joined), the
        source block's from the transaction id to the position, and the source block's text
        around the commit time."""
        tx, dumps = self.tx, orjson.dumps
        tx_id, file = tx.tx_id, tx.file
        tx_ikey = f"{tx_id}|{file}:"
        head = dumps(tx_id) + b',"position":{"file":' + dumps(file) + b',"pos":'
        gtid_part = b',"gtid":' + dumps(tx.tx_gtid) + b'},"ts_ms":'
        tx_part = b',"snapshot":"false"},"transaction":{"id":' + dumps(tx_id) + b',"total_order":'
        return ((tx_id, file, tx.tx_gtid), tx_ikey.encode(), dumps(tx_ikey)[1:-1], head, gtid_part,
                tx_part)

    def _hold_last(self, events: list[ChangeEvent]) -> Iterator[ChangeEvent]:
        """Yield the held-back event and all but the last of ``events``, which is held back in
        its place: the transaction's end marks it (TransactionAssembler)."""
        tx = self.tx
        if not events:
            return
        if tx.pending is not None:
            yield tx.pending
        yield from events[:-1]
        tx.pending = events[-1]

    def _check_image(self, plan: TablePlan, bitmap: bytes, pos: int) -> None:
        full = plan.full_bitmap
        if bitmap[:len(full)] != full:
            raise SourceSettingError(
                f"partial row image for {plan.schema}.{plan.table} at {self.tx.file}:{pos}: CDC needs "
                f"binlog_row_image=FULL (SET GLOBAL binlog_row_image=FULL, and in the server "
                f"config; sessions must not override it)")

    # ------------------------------------------------------------------ statements

    def _query(self, pkt: bytes, end: int, pos: int, end_pos: int, ts: int) -> Iterator[SourceItem]:
        schema, q = query_text(pkt, end, self._post_header_len(QUERY_EVENT, 13))
        yield from self.tx.statement(schema, q, pos, end_pos, ts)
