"""Snapshot reads of PostgreSQL tables (docs/architecture.md, "Snapshots").

:class:`PostgresSnapshotReads` are a :class:`~tidegate.sources.postgres.source.PostgresSource`'s
snapshot reads (``source.snapshots()``); :class:`PostgresCatalog`, a mixin of the source, lists its
tables and column types. Every chunk is one read-only transaction of a
connection of its own: one SELECT through a server-side cursor (client memory bounded by
``FETCH_ROWS``), which takes only the ACCESS SHARE lock every SELECT takes (it blocks DDL on
the table for the chunk's few seconds, never writes). The transaction is REPEATABLE READ, so the
rows are those of the snapshot taken by its first statement; the WAL head read just after it is
the chunk's upper bound (:meth:`PostgresSnapshotReads.open_chunk`).

Chunks are primary-key ranges ``(lo, hi]``: PostgreSQL compares row values
(``(a, b) > (x, y)``) lexicographically through the primary key's index, so :meth:`chunk_plan`
walks the index (``ORDER BY key LIMIT 1 OFFSET chunk_rows - 1``) and keeps every
``chunk_rows``-th key, as text, as a bound.

Values get the JSON form of log events (sources/postgres/values.py): the reader takes every column's
text output from the server, in a session set up as the log reader's (UTC, ISO dates,
``extra_float_digits``), does what wal2json does with it (numbers of the integer types as
integers, real/double/numeric as exact decimals and their NaN/Infinity as null, booleans as
true/false, everything else as text) and then applies the log path's converter for the type.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from typing import Any

import psycopg2
import psycopg2.extensions as ext

from ...errors import SnapshotError
from ...filters import snapshot_candidates
from ..base import ChunkBound, SnapshotReads, SnapshotTable, snapshot_tables_of
from ..dbapi import SqlCatalog, fetch_all
from ..snapshot_rows import RawRows, compiled_plan
from .pgoutput import parse_begin
from .position import Lsn
from .values import compiled_kind, row_converter, wal2json_value

FETCH_ROWS = 5000
SYSTEM_SCHEMAS_SQL = ("n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE "
                      "'pg\\_toast%%' AND n.nspname NOT LIKE 'pg\\_temp%%'")


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _qualified(table: SnapshotTable) -> str:
    return f"{_ident(table.schema)}.{_ident(table.table)}"


class PostgresCatalog(SqlCatalog):
    """A mixin of :class:`~tidegate.sources.postgres.source.PostgresSource`: its tables' columns and
    types, read on the snapshot reads' kind of session (:meth:`snapshot_connection`)."""

    connector = "postgresql"
    catalog_sql = ("SELECT n.nspname, c.relname, a.attname, coalesce(a.attnum = ANY (i.indkey), false) "
                   "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_attribute a ON "
                   "a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped LEFT JOIN pg_index i ON "
                   f"i.indrelid = c.oid AND i.indisprimary WHERE c.relkind IN ('r', 'p') AND "
                   f"{SYSTEM_SCHEMAS_SQL} ORDER BY 1, 2, a.attnum")

    def snapshot_connection(self) -> Any:
        conn = self.server.connect(" for a snapshot", application_name="tidegate-snapshot")
        conn.set_session(readonly=True, autocommit=False)
        return conn

    def column_types(self) -> Any:
        """Every table's column types (``format_type``; a domain's is its base type's, which is
        how Debezium types a domain column) and nullability, and the database's name (Debezium's
        ``source.db``), for ``envelope: debezium``."""
        from ...debezium.envelope import SourceInfo, TableInfo  # loaded for envelope: debezium alone

        with closing(self.snapshot_connection()) as conn:
            database = str(fetch_all(conn, "SELECT current_database()")[0][0])
            rows = fetch_all(
                conn, "SELECT n.nspname, c.relname, a.attname, CASE WHEN ty.typtype = 'd' "
                      "THEN format_type(ty.typbasetype, ty.typtypmod) "
                      "ELSE format_type(a.atttypid, a.atttypmod) END, "
                      "NOT a.attnotnull, pg_get_expr(d.adbin, d.adrelid), ty.typname, "
                      "(SELECT string_agg(quote_literal(e.enumlabel), ',' ORDER BY e.enumsortorder) "
                      "FROM pg_enum e WHERE e.enumtypid = a.atttypid), a.attgenerated <> '' "
                      "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                      "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
                      "JOIN pg_type ty ON ty.oid = a.atttypid "
                      "LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum "
                      f"WHERE c.relkind IN ('r', 'p') AND {SYSTEM_SCHEMAS_SQL} ORDER BY 1, 2, a.attnum")
        tables: dict[str, TableInfo] = {}
        for schema, table, column, sql_type, nullable, default, type_name, labels, generated in rows:
            info = tables.setdefault(f"{schema}.{table}", TableInfo({}, {}))
            # an enum type is written as MySQL spells an ENUM column, with its labels in order
            info.columns[column] = f"enum({labels})" if labels is not None else str(sql_type)
            info.nullable[column] = bool(nullable)
            info.type_names[column] = str(type_name)  # a domain's or an enum's own name
            if generated:
                info.generated.add(column)
            literal = _default_literal(default)
            if literal is not None:
                info.defaults[column] = literal
        return SourceInfo("postgresql", database, tables)


class PostgresSnapshotReads(SnapshotReads):
    """The snapshot reads of a :class:`~tidegate.sources.postgres.source.PostgresSource` (the
    module docstring)."""

    source: Any

    def tables(self, tables: Sequence[str] | None = None) -> list[SnapshotTable]:
        with closing(self.source.snapshot_connection()) as conn:
            # Leaf tables only: a partitioned table's rows are its partitions' (so are its changes).
            existing = {f"{s}.{t}" for s, t in fetch_all(
                conn, "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = "
                      f"c.relnamespace WHERE c.relkind = 'r' AND {SYSTEM_SCHEMAS_SQL}")}
            captured = snapshot_candidates(self.source.spec.source.tables, existing)

            def primary_key(schema: str, table: str) -> list[str]:
                return [r[0] for r in fetch_all(
                    conn, "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = "
                          "i.indrelid AND a.attnum = ANY (i.indkey) WHERE i.indrelid = "
                          "format('%%I.%%I', %s, %s)::regclass AND i.indisprimary "
                          "ORDER BY array_position(i.indkey::int2[], a.attnum)", (schema, table))]

            return snapshot_tables_of(self.source.spec.pipeline, captured, existing, tables, primary_key,
                                      f"no such table on {self.source.conn} (or the CDC role cannot see it)")

    def _columns(self, conn: Any, table: SnapshotTable) -> list[tuple[str, int, str, str]]:
        """(name, type oid, type with modifiers as wal2json names it, type without them)."""
        return fetch_all(conn, "SELECT attname, atttypid::int, format_type(atttypid, atttypmod), "
                               "format_type(atttypid, NULL) FROM pg_attribute WHERE attrelid = "
                               "format('%%I.%%I', %s, %s)::regclass AND attnum > 0 AND NOT attisdropped "
                               "ORDER BY attnum", (table.schema, table.table))

    def _key_predicate(self, table: SnapshotTable, types: dict[str, str], op: str, values: Sequence[Any]
                       ) -> tuple[str, list[Any]]:
        cols = ", ".join(_ident(c) for c in table.key)
        params = ", ".join(f"%s::{types[c]}" for c in table.key)
        return f"({cols}) {op} ({params})", list(values)

    @staticmethod
    def _raw_text(conn: Any, cur_sql: str, params: Sequence[Any]) -> None:
        """Let this connection return the server's text output of every column of ``cur_sql``
        as is (psycopg2 would parse dates, numbers and arrays into Python objects)."""
        with conn.cursor() as cur:
            cur.execute(cur_sql + " LIMIT 0", params)
            oids = tuple({d.type_code for d in cur.description})
        ext.register_type(ext.new_type(oids, "TIDEGATE_RAW_TEXT", lambda v, _cur: v), conn)

    def chunk_plan(self, table: SnapshotTable, chunk_rows: int) -> list[tuple[ChunkBound, ChunkBound]]:
        conn = self.source.snapshot_connection()
        bounds: list[list[str]] = []
        try:
            types = {name: bare for name, _, _, bare in self._columns(conn, table)}
            cols = ", ".join(_ident(c) for c in table.key)
            base = f"SELECT {cols} FROM {_qualified(table)}"
            self._raw_text(conn, base, ())
            while True:
                where, params = (self._key_predicate(table, types, ">", bounds[-1]) if bounds
                                 else ("true", []))
                rows = fetch_all(conn, f"{base} WHERE {where} ORDER BY {cols} LIMIT 1 OFFSET %s",
                                 (*params, chunk_rows - 1))
                if not rows:
                    break
                bounds.append(list(rows[0]))
            conn.rollback()
        finally:
            conn.close()
        edges: list[ChunkBound] = [None, *bounds, None]
        return list(zip(edges[:-1], edges[1:], strict=True))

    def chunk_rows(self, table: SnapshotTable, lo: ChunkBound, hi: ChunkBound, build: Any
                   ) -> tuple[Any, Iterator[Any]]:
        """One REPEATABLE READ transaction: its first statement takes the snapshot, then the
        WAL head is read (every commit the snapshot sees is flushed before it), then the rows
        stream through a server-side cursor: each row's output text where the compiled path
        writes the events (``build.raw``, sources/snapshot_rows.py), else its values."""
        conn = self.source.snapshot_connection()
        try:
            conn.set_session(isolation_level=ext.ISOLATION_LEVEL_REPEATABLE_READ)
            columns = self._columns(conn, table)  # the transaction's snapshot is taken here
            upper = self.source.head()
        except BaseException:
            conn.close()
            raise
        return upper, self._chunk_rows(conn, table, lo, hi, columns, build)

    def open_chunk(self, table: SnapshotTable, lo: ChunkBound, hi: ChunkBound
                   ) -> tuple[Any, Iterator[dict[str, Any]]]:
        return self.chunk_rows(table, lo, hi, None)

    def _chunk_rows(self, conn: Any, table: SnapshotTable, lo: ChunkBound, hi: ChunkBound,
                    columns: list[tuple[str, int, str, str]], build: Any) -> Iterator[Any]:
        try:
            types = {name: bare for name, _, _, bare in columns}
            names = [c[0] for c in columns]
            decode = row_decoder(columns)
            plan = compiled_plan(build, names, [compiled_kind(oid, typ) for _, oid, typ, _ in columns]) \
                if build is not None else None
            if plan is not None:
                build.raw = RawRows(plan.values_event, decode)
            where, params = ["true"], []
            for bound, op in ((lo, ">"), (hi, "<=")):
                if bound is not None:
                    sql, p = self._key_predicate(table, types, op, bound)
                    where.append(sql)
                    params += p
            sql = (f"SELECT {', '.join(_ident(n) for n in names)} FROM {_qualified(table)} "
                   f"WHERE {' AND '.join(where)}")
            self._raw_text(conn, sql, params)
            cur = conn.cursor(name="tidegate_snapshot_chunk")
            cur.itersize = FETCH_ROWS
            cur.execute(sql + " ORDER BY " + ", ".join(_ident(c) for c in table.key), params)
            if plan is not None:
                yield from cur  # the output text of each column: the compiled path writes the events
            else:
                for row in cur:
                    yield decode(row)
            cur.close()
            conn.rollback()
        finally:
            conn.close()

    def handoff(self, at: Any) -> Any:
        """``at``, once every transaction whose commit record lies before it is visible.

        A commit waiting for a synchronous standby is flushed to WAL (so its commit record can
        lie before ``at``) and invisible to new snapshots until the standby answers: a chunk read
        now would miss it, and the log from ``at`` does not have it. Such a transaction is still
        running in a snapshot taken now (its xid is in ``pg_current_snapshot()``'s xip list, as
        is every transaction that has not committed yet); of those, the ones whose commit record
        lies before ``at`` are found in the WAL itself (the slot decoded up to ``at``, row changes
        left out), and the handoff waits until they are visible. No sleep and no privilege: the
        snapshot, the slot and ``pg_xact_status`` answer any REPLICATION role, where
        pg_stat_activity's wait events of other roles' sessions need pg_monitor. A transaction
        that commits later has its commit record after ``at``, and the log delivers it."""
        conn = self.source.server.connect(" for the snapshot's handoff", application_name="tidegate-snapshot")
        try:
            conn.autocommit = True
            xmax, xip = self._snapshot_now(conn)  # taken after ``at`` was chosen
            waiting = [x for x in self._committed_before(conn, at, xmax) if x in xip or x >= xmax]
            deadline = time.monotonic() + HANDOFF_WAIT_S
            while waiting:
                waiting = [int(x) for (x,) in fetch_all(
                    conn, "SELECT x FROM unnest(%s::text[]) x WHERE pg_xact_status(x::xid8) = 'in progress'",
                    ([str(x) for x in waiting],))]
                if not waiting:
                    break
                if time.monotonic() > deadline:
                    raise SnapshotError(
                        f"transaction(s) {', '.join(map(str, waiting))} on {self.source.conn} committed "
                        f"before the snapshot's handoff {at} but are still not visible after "
                        f"{HANDOFF_WAIT_S:.0f}s (waiting for a synchronous standby, "
                        f"synchronous_standby_names?): the snapshot would miss them; the run is retried")
                time.sleep(0.05)
        finally:
            conn.close()
        return at

    def _snapshot_now(self, conn: Any) -> tuple[int, set[int]]:
        """A new snapshot's xmax and xip list (full 64-bit xids): a transaction is invisible to it
        when it is in the list or at or after xmax (a commit still waiting when it was taken, or
        one that has not committed)."""
        xmax, xip = fetch_all(conn, "SELECT pg_snapshot_xmax(s)::text, ARRAY(SELECT pg_snapshot_xip(s))"
                                         "::text[] FROM (SELECT pg_current_snapshot() s) q")[0]
        return int(xmax), {int(x) for x in xip}

    def _committed_before(self, conn: Any, at: Any, xmax: int) -> list[int]:
        """The transactions whose commit record starts before ``at``, as full xids (the WAL has
        32 bits; the epoch is xmax's): the slot decoded up to ``at`` without its row changes (a
        peek: the slot does not move). Its confirmed position is at or before ``at`` (a snapshot's
        handoff is the head, a new slot's start or a checkpoint the slot was released to)."""
        slot = self.source.replication_slot
        if slot.check(at)["plugin"] == "pgoutput":
            sql = ("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL, "
                   "'proto_version', '1', 'publication_names', %s)")
            args: tuple = (slot.name, str(at.lsn), self.source.publication.name)
        else:
            sql = ("SELECT data FROM pg_logical_slot_peek_changes(%s, %s::pg_lsn, NULL, 'format-version', "
                   "'2', 'include-xids', '1', 'include-lsn', '1', 'filter-tables', '*.*')")
            args = (slot.name, str(at.lsn))
        found: list[int] = []
        conn.autocommit = False
        try:
            cur = conn.cursor(name="tidegate_handoff_commits")
            cur.itersize = FETCH_ROWS
            cur.execute(sql, args)
            for (data,) in cur:
                xid, commit = _begin_of(data)
                if xid is not None and commit < at.lsn.value:
                    full = (xmax >> 32 << 32) | xid
                    found.append(full - (1 << 32) if full > xmax + (1 << 31) else full)
            cur.close()
        except psycopg2.Error as exc:
            raise slot.read_error(exc) from None
        finally:
            conn.rollback()
            conn.autocommit = True
        return found


def _begin_of(data: Any) -> tuple[int | None, int]:
    """(xid, start of the commit record) of a transaction's begin message (wal2json format 2 or
    pgoutput); (None, 0) for any other message."""
    if isinstance(data, str):  # wal2json: {"action":"B","xid":..,"lsn":"X/Y",..}
        if not data.startswith('{"action":"B"'):
            return None, 0
        m = json.loads(data)
        return int(m["xid"]), Lsn.parse(m["lsn"]).value
    data = bytes(data)
    if data[:1] != b"B":
        return None, 0
    final, _ts, xid = parse_begin(data)
    return xid, final


HANDOFF_WAIT_S = 600.0


def row_decoder(columns: Sequence[tuple[str, int, str, str]]) -> Callable[[tuple], dict[str, Any]]:
    """A chunk row's output texts to its values (a dict of the column names), for columns as
    :meth:`PostgresSnapshotReads._columns` gives them."""
    names = [c[0] for c in columns]
    # only the columns whose text needs converting (most text types' does not)
    convert = [(i, name, f) for i, (name, oid, typ, _) in enumerate(columns)
               if (f := row_converter(oid, typ)) is not None]

    def decode(row: tuple) -> dict[str, Any]:
        out = dict(zip(names, row, strict=True))
        for i, name, f in convert:
            v = row[i]
            if v is not None:
                out[name] = f(v)
        return out

    return decode


__all__ = ["PostgresCatalog", "PostgresSnapshotReads", "compiled_kind", "row_decoder", "wal2json_value"]


_DEFAULT_CONSTANT = re.compile(
    r"^(?:'((?:[^']|'')*)'|(-?[0-9.]+(?:[eE][+-]?\d+)?|true|false))(?:::[\w .\"\[\]]+)?$")


def _default_literal(expr: str | None) -> str | None:
    """A column's constant default (``pg_get_expr``: ``7``, ``'abc'::character varying``,
    ``'-1'::integer``, ``true``) as text, ``0`` for a serial's ``nextval(...)``, or None for none
    or another expression (``now()``), which is left out of the schema."""
    if expr is None:
        return None
    if str(expr).startswith("nextval("):
        return "0"  # a serial column: Debezium writes the type's zero as its default
    m = _DEFAULT_CONSTANT.match(str(expr).strip())
    if not m:
        return None
    if m.group(1) is not None:
        # Debezium reads a quoted default up to its first quote ('(.*?)'): an escaped quote
        # ends it ('it''s' is "it"), which the generated comparison found (seeds 31-40)
        return m.group(1).split("'", 1)[0]
    return m.group(2)
