"""Debezium's records for tidegate's events (a sink's ``envelope: debezium``).

One :class:`DebeziumEncoder` per sink turns each item of a sub-batch into the Kafka records the
Debezium connector would have written for the same change with the same settings: the change
record (key = the primary key as a struct, value = ``{before, after, source, transaction, op,
ts_ms, ts_us, ts_ns}``), a tombstone after a delete, the ``__debezium.oldkey`` /
``__debezium.newkey`` headers of a primary-key change (the two events come split by the source:
``events.split_key_change``), ``op: "t"`` for a TRUNCATE, and, when asked, the BEGIN/END records
of the transaction metadata topic, the schema change topic's records (:mod:`.schema_changes`)
and heartbeats. ``schemas: true`` wraps key and value in the JSON converter's
``{schema, payload}``.

Column types come from the source's catalog (:class:`SourceInfo`, asked once per run when the
first event is encoded); values are converted by :mod:`.values`. What cannot match Debezium, and
why, is listed in docs/operations.md ("Debezium envelope").
"""

from __future__ import annotations

import base64
import json
import re
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import orjson

from ..events import NEW_KEY_HEADER, OLD_KEY_HEADER
from ..filters import ColumnFilters
from . import schema_changes
from .headers import header_value
from .values import DECIMAL_SCHEMA, Mapping, Modes, at_scale, column_mapping

CONNECTORS = ("mysql", "mariadb", "postgresql")
# The connector releases whose output this envelope reproduces (source.version).
VERSIONS = {"mysql": "3.6.1.Final", "mariadb": "3.5.0.Final", "postgresql": "3.6.1.Final"}
SNAPSHOT_ALLOWED = "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"
POSITION_HEADER = "tidegate.position"  # a heartbeat's source position (JSON)
_MARIADB_GTID = re.compile(r"^\d+-\d+-\d+$")
_MYSQL_GTID = re.compile(r"^[0-9a-fA-F-]{36}:\d+$")
_FALLBACKS = {"string": "", "bytes": "", "boolean": False, "int8": 0, "int16": 0, "int32": 0, "int64": 0,
              "float": 0.0, "double": 0.0, "io.debezium.time.ZonedTime": "00:00:00Z",
              "io.debezium.data.VariableScaleDecimal": {"scale": 0, "value": "AA=="}}
ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"
_TRAILING_FRACTION = re.compile(r"(\.\d+)Z$")


_DECIMAL_TYPE = re.compile(r"^(?:numeric|decimal)\(\d+,\s*(\d+)\)", re.I)


def _decimal_scale(sql: str) -> int | None:
    """A fixed-scale decimal column's scale (money's is 2), else None."""
    if sql.lower().startswith("money"):
        return 2
    m = _DECIMAL_TYPE.match(sql)
    return int(m.group(1)) if m else None


def _shortest_float32(text: str) -> float:
    """The decimal Java's Float.toString gives a float: the fewest digits that read back as the
    same 4-byte float."""
    single = struct.unpack("<f", struct.pack("<f", float(text)))[0]
    for digits in range(1, 10):
        shortest = float(f"{single:.{digits}g}")
        if struct.unpack("<f", struct.pack("<f", shortest))[0] == single:
            return shortest
    return single


def _fraction_trimmed(m: re.Match) -> str:
    return m.group(1).rstrip("0").rstrip(".") + "Z"


_NUMBER_TEXT = re.compile(r"^-?\d+(\.\d*)?([eE][+-]?\d+)?$")
_BINARY_TYPE = re.compile(r"^(var)?binary\b|^(tiny|medium|long)?blob\b", re.I)
_BIT_LITERAL = re.compile(r"^b'([01]*)'$")


@dataclass(frozen=True)
class DebeziumOptions:
    """A sink's ``debezium:`` options (docs/operations.md, "Debezium envelope")."""

    topic_prefix: str = ""  # Debezium's topic.prefix (source.name); "" = the pipeline's name
    schemas: bool = False  # the JSON converter's schemas.enable
    tombstones_on_delete: bool = True
    skipped_operations: tuple[str, ...] = ("t",)  # Debezium's default skips TRUNCATE events
    transaction_metadata: bool = False  # provide.transaction.metadata
    schema_change_topic: bool = False  # include.schema.changes (MySQL/MariaDB only)
    heartbeat_interval_ms: int = 0  # heartbeat.interval.ms; 0: no heartbeats
    connector: str | None = None  # mysql | mariadb | postgresql; None: what the source is
    decimal_handling_mode: str = "precise"
    time_precision_mode: str | None = None  # None: the connector's default
    binary_handling_mode: str = "bytes"
    bigint_unsigned_handling_mode: str = "long"

    def modes_for(self, connector: str) -> Modes:
        # PostgreSQL's default time.precision.mode is adaptive; MySQL's and MariaDB's keep
        # microseconds for TIME of every precision.
        default_time = "adaptive" if connector == "postgresql" else "adaptive_time_microseconds"
        return Modes(decimal=self.decimal_handling_mode, time=self.time_precision_mode or default_time,
                     binary=self.binary_handling_mode, bigint_unsigned=self.bigint_unsigned_handling_mode)


@dataclass(frozen=True)
class TableInfo:
    columns: dict[str, str]  # name -> SQL type as the catalog spells it, in table order
    nullable: dict[str, bool] = field(default_factory=dict)
    defaults: dict[str, str] = field(default_factory=dict)  # a column's constant default, as text
    primary_key: tuple[str, ...] = ()  # MySQL/MariaDB: for the schema change topic
    charsets: dict[str, str] = field(default_factory=dict)  # name -> character set (text columns)
    default_charset: str | None = None  # the table's default character set
    type_names: dict[str, str] = field(default_factory=dict)  # PostgreSQL: name -> pg_type.typname
    # PostgreSQL's generated columns: in a snapshot's rows, never in the log's (pgoutput and
    # wal2json leave them out), so not in a DELETE's filled-in old row
    generated: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class SourceInfo:
    """What the encoder asks of the source once: which connector it is, the database's name
    (PostgreSQL's ``source.db``) and every captured table's column types."""

    connector: str
    database: str
    tables: dict[str, TableInfo]  # "schema.table"
    server_id: int = 0  # MySQL/MariaDB: the server's @@server_id (source.server_id)


@dataclass(frozen=True)
class Record:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


def _dumps(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj)
    except TypeError:  # an integer beyond 64 bits
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def lsn_int(text: str) -> int | None:
    """PostgreSQL's ``X/Y`` LSN text as the number Debezium writes."""
    hi, sep, lo = str(text).partition("/")
    try:
        return (int(hi, 16) << 32) | int(lo, 16) if sep else int(text)
    except ValueError:
        return None


class _Table:
    """One table's conversions and schemas (cached per column set)."""

    def __init__(self, enc: DebeziumEncoder, schema_name: str, table: str, info: TableInfo | None):
        self.enc = enc
        self.info = info
        self.name = f"{enc.prefix}.{schema_name}.{table}"
        self.maps: dict[str, Mapping] = {}
        self.schemas: dict[tuple, dict] = {}
        self.defaults: dict[str, dict[str, Any]] = {}

    def mapping(self, column: str, sample: Any) -> Mapping:
        m = self.maps.get(column)
        if m is None:
            sql = self.info.columns.get(column) if self.info is not None else None
            m = column_mapping(self.enc.connector, sql, self.enc.modes, sample)
            if sql is not None or sample is not None:  # an unknown column waits for a value to type it
                self.maps[column] = m
        return m

    def default(self, column: str) -> dict[str, Any]:
        """``{"default": value}`` for a column with a constant default (Debezium writes it in the
        field's schema, converted as the column's values are), else nothing."""
        d = self.defaults.get(column)
        if d is None:
            d = self.defaults[column] = self._default(column)
        return d

    def _default(self, column: str) -> dict[str, Any]:
        text = self.info.defaults.get(column) if self.info is not None else None
        if text is None:
            return {}
        m = self.mapping(column, text)
        if m.schema.get("type") in ("array", "struct", "map"):
            return {}  # a composite default ('{1,2}', a POINT) is not typed here: left out
        if self.enc.connector == "postgresql" and self.info is not None \
                and self.info.type_names.get(column) not in POSTGRES_DEFAULT_TYPES \
                and not self.info.columns.get(column, "").startswith("enum("):
            return {}  # a type Debezium's PostgreSQL connector parses no default of
        if self.enc.connector != "postgresql" and self.info is not None \
                and _BINARY_TYPE.match(self.info.columns.get(column, "")):
            # a binary column's default is its bytes as text; its values arrive as base64
            text = base64.b64encode(text.encode("utf-8")).decode("ascii")
        try:
            value = self._default_value(column, text, m)
        except (ValueError, TypeError, ArithmeticError):
            return {}  # a default this envelope cannot type: left out rather than guessed
        return {} if value is None else {"default": value}

    def _default_value(self, column: str, text: str, m: Mapping) -> Any:
        """A default's text as Debezium's default value converters read it, where they differ
        from how the column's values are read (the generated comparison's seeds 14, 15, 28):
        MySQL/MariaDB parse a number through a Java double (a BIGINT beyond 2^53 rounds, beyond a
        long saturates; a FLOAT(M,D) is not widened from a float); PostgreSQL's time 24:00:00 is
        LocalTime.MAX, 23:59:59.999999999."""
        sql = (self.info.columns.get(column, "") if self.info is not None else "").lower()
        if self.enc.connector != "postgresql" and m.schema.get("name") is None:
            if m.schema.get("type") == "int64" and _NUMBER_TEXT.match(text):
                return min(max(int(float(text)), LONG_MIN), LONG_MAX)
            if m.schema.get("type") in ("float", "double") and _NUMBER_TEXT.match(text):
                return float(text)
        if self.enc.connector == "postgresql" and sql == "real" and _NUMBER_TEXT.match(text):
            return _shortest_float32(text)  # parsed as a Java float: -655585.18 is -655585.2 (seed 58)
        if self.enc.connector == "postgresql" and sql.startswith("time") and "with time zone" not in sql \
                and text.startswith("24:00:00"):
            text = "23:59:59.999999999"
        if m.schema.get("type") == "boolean" and text == "":
            return None  # an empty BIT VARYING(1) default: Debezium's bit parser gives none
        return m.convert(default_value(text, m.schema))

    def row(self, row: dict[str, Any] | None) -> dict[str, Any] | None:
        """A row's values as Debezium's; a NULL in a column with a default is the default, as
        Kafka Connect writes it (Struct.get and the JSON converter's replace.null.with.default)."""
        if row is None:
            return None
        out = {}
        for k, v in row.items():
            if v is not None:
                v = self.mapping(k, v).convert(v)
            out[k] = self.default(k).get("default", self._fallback(k)) if v is None else v
        return out

    def as_snapshot_read(self, row: dict[str, Any] | None, raw: dict[str, Any] | None
                         ) -> dict[str, Any] | None:
        """A MySQL/MariaDB snapshot row's TIMESTAMP as Debezium's snapshot writes it: read over
        JDBC and formatted ISO-style, its fraction without trailing zeros ("03:14:07Z" where its
        binlog events write "03:14:07.000000Z"); the generated snapshot comparison, seed 6. A
        NULL written as the column's default keeps the default's form (seeds 60, 61)."""
        if row is None:
            return None
        out = dict(row)
        for column, value in row.items():
            if (raw or {}).get(column) is None:
                continue
            if isinstance(value, str) and self.mapping(column, value).schema.get("name") == ZONED_TIMESTAMP:
                out[column] = _TRAILING_FRACTION.sub(_fraction_trimmed, value)
        return out

    def _fallback(self, column: str) -> Any:
        """What Debezium writes for a NOT NULL column whose value the log does not hold (a
        REPLICA IDENTITY DEFAULT delete's other columns) and that has no default: its converters'
        fallback, the type's zero ("" for text, 0, false, no bytes); null for a nullable one."""
        if self.info is None or self.info.nullable.get(column, True):
            return None
        schema = self.mapping(column, None).schema
        if schema.get("name") == DECIMAL_SCHEMA:
            return self.mapping(column, None).convert(0)
        scale = _decimal_scale(self.info.columns.get(column, ""))
        if scale is not None and schema.get("type") == "string":
            return str(at_scale(Decimal(0), scale))  # the zero at its places: "0.00" (seeds 29, 84)
        return _FALLBACKS.get(schema.get("name"), _FALLBACKS.get(schema.get("type")))

    def struct(self, row: dict[str, Any], suffix: str, optional: bool) -> dict[str, Any]:
        cols = tuple(row)
        key = (suffix, cols)
        s = self.schemas.get(key)
        if s is None:
            nullable = self.info.nullable if self.info is not None else {}
            fields = [{**self.mapping(c, row[c]).schema, "optional": nullable.get(c, suffix != "Key"),
                       **self.default(c), "field": c} for c in cols]
            s = self.schemas[key] = {"type": "struct", "fields": fields, "optional": optional,
                                     "name": f"{self.name}.{suffix}"}
        return s


def _header_struct(t: _Table, raw: dict[str, Any]) -> bytes:
    """A key as SimpleHeaderConverter writes a struct (headers.py): JSON-like, Java's renderings
    of its values, not the record's JSON converter's."""
    row = t.row(raw)
    if row is None:
        return _dumps(None)
    fields = (f"{json.dumps(c)}:{header_value(t.mapping(c, raw.get(c)).schema, raw.get(c), v, _dumps)}"
              for c, v in row.items())
    return ("{" + ",".join(fields) + "}").encode()


def _collection(ev: Any) -> str:
    return f"{ev.schema}.{ev.table}"


def _block(tx: dict[str, Any] | None, ev: Any) -> dict[str, Any] | None:
    """A change record's ``transaction`` block (None outside transaction metadata)."""
    if tx is None:
        return None
    return {"id": tx["id"], "total_order": tx["total_order"],
            "data_collection_order": tx["counts"][_collection(ev)]}


class _Transactions:
    """``transaction_metadata``: each change's transaction counters and the BEGIN and END
    records of the transaction topic. ``open``: the open transaction (its key, id, counts)."""

    def __init__(self, enc: DebeziumEncoder):
        self.enc = enc
        self.open: dict[str, Any] | None = None

    def block_of(self, ev: Any) -> dict[str, Any] | None:
        """The transaction's counters with ``ev`` counted; snapshot rows have none. ``id`` is
        what this event's block and the BEGIN record name the transaction: on PostgreSQL
        Debezium names it by the event's own LSN (``xid:lsn``), so each event of a transaction
        has another id, the BEGIN its first event's, the END its commit's end (the generated
        comparison with transaction metadata); elsewhere the transaction's id."""
        if not self.enc.options.transaction_metadata or ev.op == "r":
            return None
        key = str(ev.tx_id)
        postgres = self.enc.connector == "postgresql"
        if self.open is None or self.open["key"] != key:
            self.open = {"key": key, "id": _transaction_id(key) if postgres else key, "total_order": 0,
                         "counts": {}}
        tx = self.open
        if postgres:
            lsn = lsn_int(str(ev.event_id).split(":", 1)[0])
            if lsn is not None:
                tx["id"] = f"{key.partition(':')[0]}:{lsn}"
                tx.setdefault("begin_id", tx["id"])
        tx["total_order"] += 1
        coll = _collection(ev)
        tx["counts"][coll] = tx["counts"].get(coll, 0) + 1
        return tx

    def begin(self, ts_ms: int) -> Record:
        tx = self.open
        assert tx is not None
        return self._record("BEGIN", ts_ms, None, tx.get("begin_id", tx["id"]))

    def end(self, ts_ms: int, tx: dict[str, Any], ev: Any) -> Record:
        """The END record (on PostgreSQL its id is the xid and where the commit ended); the
        transaction is closed."""
        end = getattr(getattr(ev, "end_position", None), "lsn", None)
        if self.enc.connector == "postgresql" and getattr(end, "value", None) is not None:
            tx_id = f"{tx['key'].partition(':')[0]}:{end.value}"
        else:
            tx_id = tx["id"]
        self.open = None
        return self._record("END", ts_ms, tx, tx_id)

    def _record(self, status: str, ts_ms: int, tx: dict[str, Any] | None, tx_id: str) -> Record:
        value = {"status": status, "id": tx_id,
                 "event_count": tx["total_order"] if tx is not None else None,
                 "data_collections": ([{"data_collection": c, "event_count": n}
                                       for c, n in tx["counts"].items()] if tx is not None else None),
                 "ts_ms": ts_ms}
        enc = self.enc
        return Record(enc.transaction_topic, enc._wrap({"id": tx_id}, lambda: _TX_KEY_SCHEMA),
                      enc._wrap(value, lambda: _TX_VALUE_SCHEMA), [])


def _transaction_id(tx_id: str) -> str:
    """A PostgreSQL transaction's id as Debezium names it: the xid and the LSN as a number."""
    xid, _, lsn = tx_id.partition(":")
    n = lsn_int(lsn)
    return f"{xid}:{n}" if n is not None else tx_id


class _CommitLsns:
    """PostgreSQL source.sequence[0]: where the previous transaction's commit ended, as
    Debezium's lastCommitLsn. Kept per transaction id so that a retried sub-batch gives the
    same bytes; null until a commit was seen (as Debezium after a fresh start)."""

    def __init__(self) -> None:
        self.last: int | None = None
        self._before: dict[str, int | None] = {}

    def before(self, tx_id: str) -> int | None:
        """Where the commit before transaction ``tx_id`` ended (the same answer on a retry)."""
        if tx_id not in self._before:
            if len(self._before) >= 4096:  # retries only see recent transactions
                del self._before[next(iter(self._before))]
            self._before[tx_id] = self.last
        return self._before[tx_id]

    def note(self, item: Any) -> None:
        """``item`` ends its transaction: its commit's end is the last one now."""
        end = getattr(item, "end_position", None)
        if getattr(item, "tx_end", False) and end is not None and hasattr(end, "lsn"):
            self.last = getattr(end.lsn, "value", None)


class DebeziumEncoder:
    """Debezium's records for one sink (see the module docstring). ``source_info`` is called
    once, when the first event is encoded; ``clock`` gives the processing time in ns."""

    def __init__(self, options: DebeziumOptions, pipeline: str, source_info: Callable[[], SourceInfo | None],
                 clock: Callable[[], int] = time.time_ns,
                 excluded: Callable[[str, str], frozenset[str]] = lambda db, table: frozenset()):
        self.options = options
        self.prefix = options.topic_prefix or pipeline
        self._source_info = source_info
        self._info: SourceInfo | None = None
        self._loaded = False
        self.clock = clock
        # source.columns' excluded columns of a table: the catalog's definition (a schema change
        # record's fallback) must not name them either
        self.excluded = excluded
        self._tables: dict[tuple[str, str], _Table] = {}
        self.tx = _Transactions(self)
        self.commits = _CommitLsns()
        # MySQL/MariaDB source.row of the last change written, which a statement (TRUNCATE, DDL)
        # repeats; kept per statement so that a retried sub-batch gives the same bytes
        self._last_row = 0
        self._statement_row: dict[str, int] = {}

    def reset(self) -> None:
        """Forget an open transaction (a sub-batch is delivered again from its start)."""
        self.tx.open = None

    # ------------------------------------------------------------------ source facts

    def _load(self, connector_hint: str) -> None:
        if self._loaded:
            return
        self._info = self._source_info()
        self._loaded = True
        connector = self.options.connector or (self._info.connector if self._info else None)
        self.connector = connector or ("postgresql" if connector_hint == "postgresql" else "mysql")
        self.modes = self.options.modes_for(self.connector)

    def _table(self, schema: str, table: str) -> _Table:
        t = self._tables.get((schema, table))
        if t is None:
            info = self._info.tables.get(f"{schema}.{table}") if self._info is not None else None
            t = self._tables[(schema, table)] = _Table(self, schema, table, info)
        return t

    def topic(self, schema: str, table: str) -> str:
        """Debezium's data topic: ``<prefix>.<db>.<table>`` (PostgreSQL: the schema)."""
        return f"{self.prefix}.{schema}.{table}"

    @property
    def transaction_topic(self) -> str:
        return f"{self.prefix}.transaction"

    @property
    def schema_change_topic(self) -> str:
        """Debezium's schema change topic: the topic prefix itself."""
        return self.prefix

    @property
    def heartbeat_topic(self) -> str:
        """Debezium's heartbeat topic (``topic.heartbeat.prefix`` is ``__debezium-heartbeat``)."""
        return f"__debezium-heartbeat.{self.prefix}"

    # ------------------------------------------------------------------ records

    def records(self, items: Iterable[Any], topic_of: Callable[[Any], str] | None = None
                ) -> list[tuple[Any, Record]]:
        """Every record of a sub-batch's items, in order, each with the item it comes from.
        Control messages other than a TRUNCATE give nothing here (the sink sends them on its
        control channel as before)."""
        out: list[tuple[Any, Record]] = []
        for item in items:
            if getattr(item, "type", None) is not None:  # a control message
                out.extend((item, rec) for rec in self.truncate_records(item, topic_of))
                continue
            out.extend((item, r) for r in self.change_records(item, topic_of))
        return out

    def change_records(self, ev: Any, topic_of: Callable[[Any], str] | None = None) -> list[Record]:
        self._load(ev.connector)
        t = self._table(ev.schema, ev.table)
        topic = topic_of(ev) if topic_of is not None else self.topic(ev.schema, ev.table)
        key = t.row(ev.key) if ev.key is not None else None
        tx = self.tx.block_of(ev)
        out: list[Record] = []
        if tx is not None and tx["total_order"] == 1:
            out.append(self.tx.begin(ev.ts_ms))
        before = self._before(t, ev)
        after = t.row(ev.after)
        if ev.op == "r" and self.connector != "postgresql":
            after = t.as_snapshot_read(after, ev.after)
        payload = {"before": t.row(before), "after": after, "source": self._source(ev),
                   "transaction": _block(tx, ev),
                   "op": ev.op}
        payload.update(self._now())
        key_bytes = self._key_bytes(t, key, ev.key)
        value = self._wrap(payload, lambda: self._envelope_schema(t, before or ev.after or {}))
        headers = self._key_headers(t, ev.headers) + self._context_headers()
        out.append(Record(topic, key_bytes, value, headers))
        self._last_row = payload["source"].get("row", 0)
        if ev.op == "d" and self.options.tombstones_on_delete:
            out.append(Record(topic, key_bytes, None, list(headers)))
        if tx is not None and ev.tx_end:
            out.append(self.tx.end(ev.ts_ms, tx, ev))
        self.commits.note(ev)
        return out

    def dead_lettered(self, item: Any) -> list[Record]:
        """The records owed for an item the sink sent to its dead-letter topic instead: the END
        of the transaction it ends, when the changes before it opened one (a consumer that
        buffers a transaction until its END would wait for it; the END counts the changes
        written, the dead letter left out), else none."""
        if not getattr(item, "tx_end", False):
            return []
        tx, out = self.tx.open, []
        if tx is not None and tx["key"] == str(item.tx_id):
            out.append(self.tx.end(item.ts_ms, tx, item))
        self.commits.note(item)
        return out

    def truncate_records(self, msg: Any, topic_of: Callable[[Any], str] | None = None) -> list[Record]:
        """``op: "t"`` for a TRUNCATE (a ``schema_change`` with ``change: "truncate"``), unless
        ``skipped_operations`` holds ``t`` (Debezium's default)."""
        f = msg.fields
        if msg.type != "schema_change" or f.get("change") != "truncate":
            return []
        if "t" in self.options.skipped_operations:
            # skipped, but its transaction's commit still moves source.sequence[0] of the next
            self.commits.note(msg)
            return []
        connector = "postgresql" if str(msg.event_id).count(":truncate:") else "mysql"
        self._load(connector)
        schema, table = f.get("schema") or f.get("db"), f.get("table")
        t = self._table(schema, table)
        probe = _Probe(msg, schema, table)
        source = self._source(probe)
        self.commits.note(msg)
        self._repeat_row(msg, source)
        out: list[Record] = []
        end = None
        tx = self.tx.block_of(probe)
        block = _block(tx, probe)  # counted in its transaction as a row is
        if tx is not None:
            if tx["total_order"] == 1:
                out.append(self.tx.begin(msg.ts_ms))
            if connector != "postgresql":
                self.tx.open = None  # a binlog TRUNCATE has no XID event: Debezium writes no END
            elif msg.tx_end:
                end = self.tx.end(msg.ts_ms, tx, msg)
        payload = {"before": None, "after": None, "source": source, "transaction": block, "op": "t"}
        payload.update(self._now())
        topic = topic_of(probe) if topic_of is not None else self.topic(schema, table)
        # no row, but the schema still lists the table's columns as the catalog knows them (those
        # the log carries: not PostgreSQL's generated ones)
        columns = {c: None for c in t.info.columns if c not in t.info.generated} if t.info is not None else {}
        out.append(Record(topic, None, self._wrap(payload, lambda: self._envelope_schema(t, columns)),
                          self._context_headers()))
        return out + ([end] if end is not None else [])

    def schema_change_record(self, msg: Any) -> Record | None:
        """The schema change topic's record for a ``schema_change`` message of a MySQL/MariaDB
        source (``schema_change_topic``; :mod:`.schema_changes`); None for a TRUNCATE, for
        PostgreSQL (its connector has no such topic) and when the option is off."""
        f = msg.fields
        if not self.options.schema_change_topic or msg.type != "schema_change" \
                or str(msg.event_id).count(":truncate:") or "ddl" not in f:
            return None
        self._load("mysql")
        if self.connector == "postgresql":
            return None
        db, table = f.get("db") or f.get("schema"), f.get("table")
        info = self._info.tables.get(f"{db}.{table}") if self._info is not None else None
        change = schema_changes.table_change(f, info, self.connector, self.excluded(db, table))
        if change is None:
            return None
        probe = _Probe(msg, db, table)
        source = self._source(probe)
        self._repeat_row(msg, source)
        value = {"source": source, "ts_ms": self.clock() // 1_000_000, "databaseName": db,
                 "schemaName": None, "ddl": f.get("ddl"), "tableChanges": [change]}
        key = self._wrap({"databaseName": db}, lambda: schema_changes.key_schema(self.connector))
        connector = self.connector
        value_bytes = self._wrap(value, lambda: schema_changes.value_schema(connector, self._source_schema()))
        return Record(self.schema_change_topic, key, value_bytes, self._context_headers())

    def _repeat_row(self, msg: Any, source: dict[str, Any]) -> None:
        """Debezium's binlog connectors set no row of their own for a statement (a TRUNCATE, a
        DDL): its source.row is the previous change's, left in their offset (0 before any in a
        run). The generated comparison found it (docs/compat.md)."""
        if "row" in source:
            source["row"] = self._statement_row.setdefault(str(msg.event_id), self._last_row)

    def heartbeat_record(self, position: Any) -> Record:
        """A heartbeat (``heartbeat_interval_ms``): key ``{serverName}``, value ``{ts_ms}`` as
        Debezium writes them; the source position the sink's checkpoint moves to with it rides in
        the ``tidegate.position`` header (Debezium keeps it in Kafka Connect's offsets)."""
        key = self._wrap({"serverName": self.prefix}, lambda: _HEARTBEAT_KEY_SCHEMA)
        value = self._wrap({"ts_ms": self.clock() // 1_000_000}, lambda: _HEARTBEAT_VALUE_SCHEMA)
        where = position.to_json() if hasattr(position, "to_json") else position
        self._load("postgresql" if isinstance(where, dict) and "lsn" in where else "mysql")
        # Debezium's heartbeats carry no context headers (the generated comparison)
        return Record(self.heartbeat_topic, key, value, [(POSITION_HEADER, _dumps(where))])

    # ------------------------------------------------------------------ parts

    def _before(self, t: _Table, ev: Any) -> dict[str, Any] | None:
        """The old row as Debezium's PostgreSQL connector gives it when the log holds only the
        replica identity (REPLICA IDENTITY DEFAULT: the key): an UPDATE that kept the key has no
        old row (null), a DELETE has every column, null where the log does not tell. tidegate's
        source gives the key columns as the old row in both cases."""
        before = ev.before
        if self.connector != "postgresql" or before is None or ev.key is None or set(before) != set(ev.key):
            return before
        if ev.op == "u" and ev.after is not None and len(ev.after) > len(before):
            return None
        if ev.op == "d" and t.info is not None and len(t.info.columns) > len(before):
            return {c: before.get(c) for c in t.info.columns if c not in t.info.generated}
        return before

    def _now(self) -> dict[str, int]:
        ns = self.clock()
        return {"ts_ms": ns // 1_000_000, "ts_us": ns // 1000, "ts_ns": ns}

    def _key_bytes(self, t: _Table, key: dict[str, Any] | None, raw: dict[str, Any] | None) -> bytes | None:
        if key is None:
            return None
        return self._wrap(key, lambda: t.struct(raw or {}, "Key", False))

    def _key_headers(self, t: _Table, headers: dict[str, bytes] | None) -> list[tuple[str, bytes]]:
        """The other key of a primary-key change as Kafka Connect's default header converter
        (SimpleHeaderConverter) writes a struct: its plain JSON, never the {schema, payload} form."""
        out = []
        for name in (NEW_KEY_HEADER, OLD_KEY_HEADER):
            raw = (headers or {}).get(name)
            if raw is not None:
                out.append((name, _header_struct(t, json.loads(raw))))
        return out

    def _context_headers(self) -> list[tuple[str, bytes]]:
        """The headers Debezium puts on every change record: the logical name (topic.prefix),
        the task (always 0: one task per connector) and the connector's kind. Its runId, a new
        UUID per connector start, has no counterpart in a tidegate run and is left out."""
        return [("__debezium.context.connectorLogicalName", self.prefix.encode()),
                ("__debezium.context.taskId", b"0"),
                ("__debezium.context.connectorName", self.connector.encode())]

    def _wrap(self, payload: Any, schema: Callable[[], dict]) -> bytes:
        if self.options.schemas:
            return _dumps({"schema": schema(), "payload": payload})
        return _dumps(payload)

    # ------------------------------------------------------------------ source block

    def _source(self, ev: Any) -> dict[str, Any]:
        # The commit time: to the µs where the source has it (PostgreSQL; Debezium's ts_ms is then
        # its µs // 1000, as Instant.toEpochMilli truncates), else tidegate's ms.
        us = getattr(ev, "commit_us", None)
        ts, ts_us = (int(ev.ts_ms), int(ev.ts_ms) * 1000) if us is None else (us // 1000, us)
        src = {"version": VERSIONS[self.connector], "connector": self.connector, "name": self.prefix,
               "ts_ms": ts, "snapshot": ev.snapshot}
        if self.connector == "postgresql":
            lsn = lsn_int(str(ev.event_id).split(":", 1)[0])
            xid = str(ev.tx_id).partition(":")[0]
            prev = self.commits.before(str(ev.tx_id))
            src.update(db=self._info.database if self._info else ev.db, sequence=_dumps(
                [str(prev) if prev is not None else None, str(lsn) if lsn is not None else None]).decode(),
                ts_us=ts_us, ts_ns=ts_us * 1000, schema=ev.schema, table=ev.table,
                txId=int(xid) if xid.isdigit() else None, lsn=lsn, xmin=None,
                origin=None, origin_lsn=None)  # replication origin: none for a plain publication
            return src
        pos = ev.position or {}
        file, p, row = _binlog_coordinates(str(ev.event_id), pos)
        server_id = pos.get("server_id") or (self._info.server_id if self._info else 0)
        gtid = ev.tx_id if (_MARIADB_GTID.match(str(ev.tx_id)) or _MYSQL_GTID.match(str(ev.tx_id))) else None
        src.update(db=ev.db, sequence=None, ts_us=ts_us, ts_ns=ts_us * 1000, table=ev.table,
                   server_id=int(server_id), gtid=gtid, file=file, pos=p, row=row,
                   thread=None, query=None)
        return src

    # ------------------------------------------------------------------ schemas

    def _source_schema(self) -> dict[str, Any]:
        def f(t: str, field_name: str, optional: bool = True, **extra: Any) -> dict[str, Any]:
            return {"type": t, "optional": optional, **extra, "field": field_name}
        common = [f("string", "version", False), f("string", "connector", False), f("string", "name", False),
                  f("int64", "ts_ms", False),
                  f("string", "snapshot", True, name="io.debezium.data.Enum", version=1,
                    parameters={"allowed": SNAPSHOT_ALLOWED}, default="false"),
                  f("string", "db", False), f("string", "sequence"), f("int64", "ts_us"), f("int64", "ts_ns")]
        if self.connector == "postgresql":
            rest = [f("string", "schema", False), f("string", "table", False), f("int64", "txId"),
                    f("int64", "lsn"), f("int64", "xmin"), f("string", "origin"), f("int64", "origin_lsn")]
        else:
            rest = [f("string", "table"), f("int64", "server_id", False), f("string", "gtid"),
                    f("string", "file", False), f("int64", "pos", False), f("int32", "row", False),
                    f("int64", "thread"), f("string", "query")]
        return {"type": "struct", "fields": common + rest, "optional": False,
                "name": f"io.debezium.connector.{self.connector}.Source", "version": 1}

    def _envelope_schema(self, t: _Table, row: dict[str, Any]) -> dict[str, Any]:
        value = t.struct(row, "Value", True)
        return {"type": "struct", "fields": [
            {**value, "field": "before"}, {**value, "field": "after"},
            {**self._source_schema(), "field": "source"},
            {**_TX_BLOCK_SCHEMA, "field": "transaction"},
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
            {"type": "int64", "optional": True, "field": "ts_us"},
            {"type": "int64", "optional": True, "field": "ts_ns"}],
            "optional": False, "name": f"{t.name}.Envelope", "version": 2}


LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1
# The types (pg_type.typname) whose column defaults the PostgreSQL connector writes in the schema:
# its default value converter has a parser for these only. Others (bytea, money, inet, macaddr,
# timetz, arrays, enums, and any domain, named by its own name) have no default, so a NULL in
# them stays null. Found by the generated comparison (tests/compat/test_generated.py).
POSTGRES_DEFAULT_TYPES = frozenset({
    "bit", "varbit", "bool", "bpchar", "varchar", "text", "date", "time", "timestamp", "timestamptz",
    "int2", "int4", "int8", "float4", "float8", "numeric", "interval", "uuid", "json", "jsonb", "xml"})


def default_value(text: str, schema: dict[str, Any]) -> Any:
    """A default's text in the form the source gives the column's values (numbers as numbers
    for plain integer, floating and boolean columns, text for the rest: decimals, strings and
    the logical types, dates and times, whose conversion reads text). An integer default
    beyond a Java long is the nearest long, as Debezium's default parser gives it (BIGINT
    UNSIGNED's 18446744073709551615 is 9223372036854775807; its values wrap instead)."""
    schema_type = schema.get("type")
    bits = _BIT_LITERAL.match(text)
    if bits and (schema.get("name") == "io.debezium.data.Bits" or schema_type == "boolean"):
        return bits.group(1)  # a MySQL/MariaDB BIT default is written b'101'
    if schema.get("name") is not None:
        return text
    if schema_type in ("int8", "int16", "int32", "int64"):
        return min(max(int(text), LONG_MIN), LONG_MAX)
    if schema_type in ("float", "double"):
        return float(text)
    if schema_type == "boolean":
        return text.lower() in ("1", "true", "t", "b'1'")
    return text


class _Probe:
    """The fields of a TRUNCATE's control message in the shape the source block reads."""

    def __init__(self, msg: Any, schema: str, table: str):
        self.ts_ms, self.snapshot, self.schema, self.table = msg.ts_ms, "false", schema, table
        self.commit_us = getattr(msg, "commit_us", None)
        self.db = msg.fields.get("db") or schema
        self.event_id, self.tx_id, self.position = msg.event_id, msg.tx_id, msg.position or {}
        self.connector, self.op = None, "t"


def _binlog_coordinates(event_id: str, position: dict[str, Any]) -> tuple[str, int, int]:
    """(file, pos, row) of a row event: tidegate's event id is ``file:pos:row``; a schema change's
    ``file:pos:db.table``; a snapshot row has no binlog coordinates (Debezium writes the
    snapshot's start; tidegate does not know it per row)."""
    if "file" in position and "row" in position:  # a log row's own position
        return str(position["file"]), int(position.get("pos") or 0), int(position["row"])
    parts = event_id.split(":")
    if len(parts) >= 3 and parts[1].isdigit():
        return parts[0], int(parts[1]), int(parts[2]) if parts[2].isdigit() else 0
    return str(position.get("file") or ""), int(position.get("pos") or 0), 0


_TX_BLOCK_SCHEMA = {"type": "struct", "fields": [
    {"type": "string", "optional": False, "field": "id"},
    {"type": "int64", "optional": False, "field": "total_order"},
    {"type": "int64", "optional": False, "field": "data_collection_order"}],
    "optional": True, "name": "event.block", "version": 1}
# As Debezium 3.5/3.6 write them (the generated comparison with transaction metadata, schemas on)
_TX_KEY_SCHEMA = {"type": "struct", "fields": [{"type": "string", "optional": False, "field": "id"}],
                  "optional": False, "name": "io.debezium.connector.common.TransactionMetadataKey",
                  "version": 1}
_TX_VALUE_SCHEMA = {"type": "struct", "fields": [
    {"type": "string", "optional": False, "field": "status"},
    {"type": "string", "optional": False, "field": "id"},
    {"type": "int64", "optional": True, "field": "event_count"},
    {"type": "array", "items": {"type": "struct", "fields": [
        {"type": "string", "optional": False, "field": "data_collection"},
        {"type": "int64", "optional": False, "field": "event_count"}], "optional": True,
        "name": "event.collection", "version": 1},
     "optional": True, "field": "data_collections"},
    {"type": "int64", "optional": False, "field": "ts_ms"}],
    "optional": False, "name": "io.debezium.connector.common.TransactionMetadataValue", "version": 1}
_HEARTBEAT_KEY_SCHEMA = {"type": "struct",
                         "fields": [{"type": "string", "optional": False, "field": "serverName"}],
                         "optional": False, "name": "io.debezium.connector.common.ServerNameKey",
                         "version": 1}
_HEARTBEAT_VALUE_SCHEMA = {"type": "struct",
                           "fields": [{"type": "int64", "optional": False, "field": "ts_ms"}],
                           "optional": False, "name": "io.debezium.connector.common.Heartbeat",
                           "version": 1}


def encoder_for(pipeline: Any, sink: Any, source_info: Callable[[], SourceInfo | None]
                ) -> DebeziumEncoder | None:
    """The record encoder of a sink entry: Debezium's records for ``envelope: debezium``, None
    (the tidegate envelope) otherwise. The kind hands it to the sink (``SinkKind.envelope``), so
    no sink imports this package."""
    if sink.envelope != "debezium" or sink.debezium is None:
        return None
    filters = ColumnFilters.of(pipeline.source.columns, b"")

    def excluded(db: str, table: str) -> frozenset[str]:
        """source.columns' excluded columns of (db, table): none without rules."""
        rules = filters.for_table(db, table) if filters is not None else None
        return rules.excluded if rules is not None else frozenset()
    return DebeziumEncoder(sink.debezium, pipeline.pipeline, source_info, excluded=excluded)
