"""Reading the slot through PostgreSQL's built-in ``pgoutput`` plugin (protocol version 1).

pgoutput sends binary messages (PostgreSQL's "Logical Replication Message Formats"): Begin,
Commit, Relation (a table's columns with type OIDs, sent before the first change of the table in
a session and again after it changes), Type, Insert, Update, Delete, Truncate, Origin; values
come as their text output. This module turns them into the messages the wal2json read path
takes (:meth:`~.wal2json.Wal2JsonDecoder.items`), so one piece of code applies the transaction
rules, fills unchanged TOAST values, splits key changes and tells schema changes, and an
envelope is the same bytes whichever plugin the slot has
(``tests/integration/test_pgoutput.py`` compares the two on the same WAL):

* a column's type is named as wal2json names it (``format_type`` of its OID and modifier,
  asked of the server once per type), and its text becomes what wal2json writes for it (the
  integer types a JSON integer, real/double/numeric a JSON number or null for NaN and
  infinities, boolean true/false, bytea its hex digits, everything else the text), then goes
  through the wal2json path's conversion code for that type (``values.value_code``), generated
  once per table and column selection;
* an unchanged TOAST value (``u``) is left out of the row, as wal2json leaves it out;
* an UPDATE without an old tuple (the key did not change) gets the replica identity columns of
  the new row as its old key, a ``K`` tuple its replica identity columns, an ``O`` tuple (REPLICA
  IDENTITY FULL) every column: what wal2json writes as ``identity``;
* the primary key is the replica identity's columns for REPLICA IDENTITY DEFAULT (the Relation
  message flags them), else the catalog's primary key (asked once per table and read);
* wal2json's Begin carries the end of the transaction's commit record, pgoutput's only the
  Commit does: the messages of a transaction are held until its Commit (in memory, in a
  temporary file beyond :data:`SPOOL_BYTES`), then passed on with a Begin that carries the end,
  so the bound and the start are applied as the wal2json path applies them. A Begin whose commit
  record starts at or after the bound ends the read at once (that transaction ends after it).

What differs from wal2json, by pgoutput's design: only the tables of the publication are
sent; stored generated columns are not sent (wal2json includes them); a Relation message
names types by OID, so a user-defined type renamed or dropped since the change was written is
named as it is now (or as the Type message named it).
"""

from __future__ import annotations

import struct
import tempfile
from collections.abc import Callable, Iterable, Iterator
from decimal import Decimal
from typing import Any

import msgspec
import psycopg2

from ..base import SourceItem
from .connection import REPLICATION_OPTIONS, PgServer
from .position import Lsn, PgPosition
from .slot import Slot
from .values import (
    BOOL_OID,
    DECIMAL_OIDS,
    INT_OIDS,
    compiled_kind,
    complete_after,
    plan_namespace,
    value_code,
)
from .wal2json import ReadHost, Wal2JsonDecoder, compiled_rows, replication_stream

PROTO_VERSION = "1"
# pgoutput writes values through the session's output functions, converted to its
# client_encoding: UTF-8, whatever the database's encoding.
PGOUTPUT_SESSION = REPLICATION_OPTIONS + " -c client_encoding=UTF8"
SPOOL_BYTES = 64 << 20  # a transaction's messages held in memory before they go to a temporary file
BYTEA_OID = 17
FIRST_USER_OID = 10000  # OIDs below are the built-in catalog's (FirstGenbkiObjectId): names never change

_B, _C, _R, _Y, _I, _U, _D, _T = b"BCRYIUDT"  # message types (as ints)
_KEY, _OLD = b"KO"  # an old tuple: the replica identity's columns, or the whole row (FULL)
_TEXT, _NULL, _UNCHANGED = b"tnu"

_u16 = struct.Struct(">H").unpack_from
_u32 = struct.Struct(">I").unpack_from
_begin = struct.Struct(">QqI").unpack_from  # final (commit) LSN, commit time (µs since 2000), xid
_commit = struct.Struct(">BQQq").unpack_from  # flags, commit LSN, end LSN, commit time
_type_mod = struct.Struct(">Ii").unpack_from  # a column's type OID and modifier
_frame = struct.Struct(">QI")  # a spooled message: its LSN and length
_UNIX_2000_US = 946_684_800_000_000  # 2000-01-01 UTC in µs since 1970
_TYPE_NAMES: dict[tuple[int, int], str] = {}  # built-in (oid, typmod) -> name, for the process


class ProtocolError(ValueError):
    """A message this decoder cannot read (never sent by pgoutput protocol version 1)."""


class Unchanged:
    """The value of an unchanged TOAST column (``u``): pgoutput does not send it."""

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = Unchanged()


# ---------------------------------------------------------------------- the messages


class Column(msgspec.Struct, frozen=True):
    name: str
    type_oid: int
    type_mod: int
    key: bool  # part of the replica identity (every column under REPLICA IDENTITY FULL)


class Relation(msgspec.Struct, frozen=True):
    relid: int
    schema: str
    table: str
    replica_identity: str  # d(efault), n(othing), f(ull), i(ndex)
    columns: tuple[Column, ...]


class Change(msgspec.Struct, gc=False):
    """A message as the wal2json read path reads it (:class:`~.wal2json.Message`'s fields), with
    what saves it parsing text again: ``timestamp`` as µs since 1970, ``nextlsn`` as an
    :class:`Lsn`; ``columns`` and ``identity`` are :class:`RowTuple` objects, ``pk`` :class:`KeyName`
    objects."""

    action: str
    xid: int | None = None
    timestamp: int | None = None
    lsn: str | None = None
    nextlsn: Lsn | None = None
    schema: str | None = None
    table: str | None = None
    columns: Any = None
    identity: Any = None
    pk: Any = None


class KeyName(msgspec.Struct, frozen=True, gc=False):
    name: str


def _cstring(data: bytes, pos: int) -> tuple[str, int]:
    end = data.index(0, pos)
    return data[pos:end].decode(), end + 1


def lsn_text(value: int) -> str:
    return "%X/%X" % (value >> 32, value & 0xFFFFFFFF)  # noqa: UP031 - faster than the f-string


def commit_us_of(us: int) -> int:
    """A commit time in µs since 2000-01-01 UTC (pgoutput's) as µs since 1970 (what
    ``values.commit_time`` takes)."""
    return us + _UNIX_2000_US


def parse_begin(data: bytes) -> tuple[int, int, int]:
    """(final LSN = start of the commit record, commit time in µs since 2000, xid)."""
    return _begin(data, 1)


def parse_commit(data: bytes) -> tuple[int, int, int]:
    """(commit LSN, end LSN = end of the commit record, commit time)."""
    _flags, commit, end, ts = _commit(data, 1)
    return commit, end, ts


def parse_relation(data: bytes) -> Relation:
    (relid,) = _u32(data, 1)
    schema, pos = _cstring(data, 5)
    table, pos = _cstring(data, pos)
    ident = chr(data[pos])
    (n,) = _u16(data, pos + 1)
    pos += 3
    cols = []
    for _ in range(n):
        flags = data[pos]
        name, pos = _cstring(data, pos + 1)
        oid, mod = _type_mod(data, pos)
        pos += 8
        cols.append(Column(name, oid, mod, bool(flags & 1)))
    return Relation(relid, schema or "pg_catalog", table, ident, tuple(cols))


def parse_type(data: bytes) -> tuple[int, str, str]:
    """(type OID, schema, name) of a Type message."""
    (oid,) = _u32(data, 1)
    schema, pos = _cstring(data, 5)
    name, _ = _cstring(data, pos)
    return oid, schema, name


def parse_tuple(data: bytes, pos: int) -> tuple[list[Any], int, bool]:
    """TupleData at ``pos``: (values, position after it, whether one is :data:`UNCHANGED`).
    A value is its text output as bytes, None for NULL, or :data:`UNCHANGED`."""
    (n,) = _u16(data, pos)
    pos += 2
    out: list[Any] = []
    add = out.append
    unchanged = False
    for _ in range(n):
        kind = data[pos]
        if kind == _TEXT:
            start = pos + 5
            pos = start + _u32(data, pos + 1)[0]
            add(data[start:pos])
        elif kind == _NULL:
            add(None)
            pos += 1
        elif kind == _UNCHANGED:
            add(UNCHANGED)
            unchanged = True
            pos += 1
        else:
            raise ProtocolError(f"pgoutput column kind {chr(kind)!r} (binary values are not asked for)")
    return out, pos, unchanged


def parse_truncate(data: bytes) -> list[int]:
    """The relation ids of a Truncate message."""
    (n,) = _u32(data, 1)
    return [_u32(data, 6 + 4 * i)[0] for i in range(n)]


# ---------------------------------------------------------------------- values


def json_number(text: bytes) -> Any:
    """What the wal2json path makes of a real/double/numeric's text output: wal2json writes it
    as a bare JSON number (NaN and the infinities as null), and the reader parses integers as
    int and other numbers as exact Decimals."""
    head = text[:3].lower()
    if head == b"nan" or head == b"inf" or text[:4].lower() == b"-inf":
        return None
    if b"." in text or b"e" in text or b"E" in text:
        return Decimal(text.decode())
    return int(text)


def float_number(text: bytes) -> Any:
    """:func:`json_number` as the float the wal2json path makes of it for real/double, without
    the exact Decimal on the way: ``float`` of the text is the same correctly rounded float,
    except for an integer zero: JSON ``-0`` parses as the integer 0, so 0.0, not -0.0. (The
    server writes NaN and the infinities as ``NaN``, ``Infinity``, ``-Infinity``: null.)"""
    v = float(text)
    if v - v != 0.0:  # NaN or an infinity
        return None
    if v == 0.0 and b"." not in text and b"e" not in text and b"E" not in text:
        return 0.0
    return v


def numeric_text(text: bytes) -> Any:
    """:func:`json_number` as the string the wal2json path makes of it for numeric
    (:func:`~tidegate.events.decimal_text`): the server's text itself, which never has an
    exponent, a leading zero or a sign of zero."""
    if text[:1] in b"NI-" and (text[:1] != b"-" or text[1:2] == b"I"):
        return None  # NaN, Infinity, -Infinity
    return text.decode()


FLOAT_OIDS = frozenset({700, 701})


def _as_wal2json(raw: str, oid: int) -> str:
    """An expression of the value wal2json's path holds for the (non-NULL) text output ``raw``
    before the conversion of its type: the integer types an int, real/double a float,
    numeric its final string, boolean true/false, bytea the hex digits, everything else text."""
    if oid in INT_OIDS:
        return f"int({raw})"
    if oid in FLOAT_OIDS:
        return f"_float({raw})"
    if oid in DECIMAL_OIDS:
        return f"_numeric({raw})"
    if oid == BOOL_OID:
        return f"{raw} == b't'"
    if oid == BYTEA_OID:  # wal2json writes the hex digits without the leading \x
        return f"{raw}[2:].decode()"
    return f"{raw}.decode()"


def _namespace(float_flag: list[bool]) -> dict[str, Any]:
    ns = plan_namespace(float_flag)
    ns.update(_numeric=numeric_text, _float=float_number, _u16=_u16, _u32=_u32)
    return ns


def _value_lines(i: int, column: Column, typ: str, ns: dict[str, Any], raw: str) -> list[str]:
    """Code setting ``v{i}`` to the final value of the text output ``raw`` (not NULL): as
    wal2json writes it, then the wal2json path's conversion of the type (``values.value_code``)."""
    return value_code(i, typ, ns, src=_as_wal2json(raw, column.type_oid))


def _compile(lines: list[str], ns: dict[str, Any], name: str) -> Any:
    exec(compile("\n".join(lines), "<pgoutput row plan>", "exec"), ns)  # noqa: S102 - names only appear as repr() literals
    return ns[name]


class Plan:
    """One table's columns ``picks`` (indices into a tuple's values, :func:`parse_tuple`) turned
    into a row dict in generated straight-line code: ``plan.convert(values)``. ``signature`` is
    what the wal2json path's plan of the same columns has (names and wal2json type names)."""

    __slots__ = ("convert", "signature")

    def __init__(self, columns: tuple[Column, ...], types: tuple[str, ...], picks: tuple[int, ...],
                 float_flag: list[bool]):
        self.signature = tuple((columns[k].name, types[k]) for k in picks)
        ns = _namespace(float_flag)
        lines = ["def convert(vals):"]
        for i, k in enumerate(picks):
            lines += [f"    r = vals[{k}]", "    if r is None:", f"        v{i} = None", "    else:"]
            lines += ["        " + line for line in _value_lines(i, columns[k], types[k], ns, "r")]
        items = ", ".join(f"{columns[k].name!r}: v{i}" for i, k in enumerate(picks))
        lines.append(f"    return {{{items}}}")
        self.convert = _compile(lines, ns, "convert")


def row_decoder(columns: tuple[Column, ...], types: tuple[str, ...], float_flag: list[bool]) -> Any:
    """``decode(data, pos)``: the row dict of the TupleData at ``pos`` with every column, read
    and converted in one generated pass; None when a value is not text or NULL (an unchanged
    TOAST value: :class:`Plan` takes those)."""
    ns = _namespace(float_flag)
    lines = ["def decode(d, p):", f"    if _u16(d, p)[0] != {len(columns)}:", "        return None",
             "    p += 2"]
    for i, (column, typ) in enumerate(zip(columns, types, strict=True)):
        lines += ["    if d[p] == 116:", "        e = p + 5 + _u32(d, p + 1)[0]"]
        lines += ["        " + line for line in _value_lines(i, column, typ, ns, "d[p + 5:e]")]
        lines += ["        p = e", "    elif d[p] == 110:", f"        v{i} = None", "        p += 1",
                  "    else:", "        return None"]
    items = ", ".join(f"{c.name!r}: v{i}" for i, c in enumerate(columns))
    lines.append(f"    return {{{items}}}")
    return _compile(lines, ns, "decode")


class RowTuple(msgspec.Struct, gc=False):
    """A tuple of a message, converted when the read path asks (``PgOutputDecoder._convert``,
    after it reset the float flag for the row): the whole row, or its replica identity columns."""

    table: Table
    data: bytes
    pos: int
    key: bool


class Table:
    """A Relation with what reading its rows needs: type names, keys, the generated decoder, plans
    per choice of columns."""

    def __init__(self, rel: Relation, types: tuple[str, ...], pk: list[str], float_flag: list[bool]):
        self.rel = rel
        self.schema, self.table = rel.schema, rel.table
        self.types = types
        self.all = tuple(range(len(rel.columns)))
        self.key = tuple(k for k, c in enumerate(rel.columns) if c.key)
        self.key_names = [rel.columns[k].name for k in self.key]
        self.pk = [KeyName(n) for n in pk]
        self.flag = float_flag
        self.plans: dict[tuple[int, ...], Plan] = {}
        self.decode = row_decoder(rel.columns, types, float_flag)
        self.full_plan, self.key_plan = self.plan(self.all), self.plan(self.key)

    def plan(self, picks: tuple[int, ...]) -> Plan:
        plan = self.plans.get(picks)
        if plan is None:
            plan = self.plans[picks] = Plan(self.rel.columns, self.types, picks, self.flag)
        return plan


def skip_tuple(data: bytes, pos: int) -> int:
    """Where the TupleData at ``pos`` ends."""
    (n,) = _u16(data, pos)
    pos += 2
    for _ in range(n):
        pos += 5 + _u32(data, pos + 1)[0] if data[pos] == _TEXT else 1
    return pos


# ---------------------------------------------------------------------- the transport


def stream_changes(server: PgServer, slot: Slot, upto: PgPosition, publication: str
                   ) -> Iterator[tuple[int, bytes]]:
    """(LSN, message) pairs of the slot's pgoutput messages over the streaming replication
    protocol, until the server has decoded past ``upto`` (``wal2json.replication_stream``). The
    LSN of a row change is the change's own, as wal2json's ``lsn``."""
    options = {"proto_version": PROTO_VERSION, "publication_names": publication}
    return replication_stream(server, slot, upto, options, with_lsn=True, session=PGOUTPUT_SESSION)


def peek_sql() -> str:
    return ("SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, %s, "
            "'proto_version', '" + PROTO_VERSION + "', 'publication_names', %s)")


def has_changes(server: PgServer, slot: Slot, publication: str, tables: frozenset[tuple[str, str]],
                start_lsn: Lsn, upto: PgPosition, limit: int) -> bool | None:
    """``wal2json.has_changes`` for a pgoutput slot: a row change or truncate of a captured table
    in a transaction whose commit record starts in [start, upto) (a bound or a start is never
    inside a commit record: ``PgServer.head``); None when the look was cut off before one.
    The rows sent back are capped as there (a whole first transaction otherwise)."""
    try:
        rows = server.query(peek_sql() + " LIMIT %s", (slot.name, str(upto.lsn), limit, publication, limit))
    except psycopg2.Error as exc:
        raise slot.read_error(exc) from None
    names: dict[int, tuple[str, str]] = {}
    counts = False
    for _lsn, data in rows:
        data = bytes(data)
        kind = data[0]
        if kind == _B:
            final = parse_begin(data)[0]
            counts = start_lsn.value <= final < upto.lsn.value
        elif kind == _R:
            rel = parse_relation(data)
            names[rel.relid] = (rel.schema, rel.table)
        elif counts and kind in (_I, _U, _D):
            if not tables or names.get(_u32(data, 1)[0]) in tables:
                return True
        elif counts and kind == _T:
            if not tables or any(names.get(r) in tables for r in parse_truncate(data)):
                return True
    return None if len(rows) >= limit else False


# ---------------------------------------------------------------------- the read path


class Spool:
    """A transaction's messages once they outgrow memory (:data:`SPOOL_BYTES`), in a temporary file."""

    def __init__(self, held: list[tuple[int, bytes]]):
        self.file = tempfile.TemporaryFile(prefix="tidegate-pgoutput-")
        for lsn, data in held:
            self.add(lsn, data)

    def add(self, lsn: int, data: bytes) -> None:
        self.file.write(_frame.pack(lsn, len(data)))
        self.file.write(data)

    def replay(self) -> Iterator[tuple[int, bytes]]:
        f = self.file
        f.seek(0)
        while head := f.read(_frame.size):
            lsn, n = _frame.unpack(head)
            yield lsn, f.read(n)
        f.close()


class PgOutputDecoder(Wal2JsonDecoder):
    """One bounded pass over a pgoutput slot: the transactions that end in (``start_lsn``,
    ``upto``], as :class:`~.wal2json.Wal2JsonDecoder` reads them (module docstring)."""

    spool_bytes = SPOOL_BYTES  # how much of a transaction is held in memory before a file takes it

    @staticmethod
    def messages(source: Any, upto: PgPosition) -> Iterator[tuple[int, bytes]]:
        return stream_changes(source.server, source.replication_slot, upto, source.publication.name)

    def __init__(self, host: ReadHost, start_lsn: Lsn, upto: PgPosition):
        super().__init__(host, start_lsn, upto)
        self.relations: dict[int, Table] = {}
        self.user_types: dict[int, str] = {}  # Type messages: OID -> schema.name (a dropped type's name)
        self._last: tuple[Any, int, Any] = (None, 0, None)  # the tuple decoded last: data, pos, row
        self._row_table: Table | None = None
        self.compiled: Any = None  # rowcodec.PgOutputRows, for a read that uses it

    def run(self, messages: Iterator[tuple[int, bytes]]) -> Iterator[SourceItem]:
        """The items of the slot's pgoutput ``messages``: row changes through the compiled path
        where it applies (``wal2json.compiled_rows``), the rest decoded here."""
        self.compiled = compiled_rows(self.host, "pgoutput") if self.use_compiled else None
        if self.compiled is None:
            return self.items(self.changes(messages))
        return self.items(self.changes(messages), self.compiled, self._decoded)

    def _decoded(self, m: Any) -> Any:
        """A message the compiled path declined, as :meth:`items` reads it: a row change (its
        LSN and bytes, which :meth:`_rows` passed on undecoded) as its :class:`Change`."""
        return self._row_change(*m) if type(m) is tuple else m

    def _convert(self, schema: str, table: str, tup: RowTuple) -> dict[str, Any]:
        """A tuple's row (the read path's call, which sets :attr:`plan` for its signature). An
        UPDATE without an old tuple asks for the new one twice (its key, then the row): decoded
        once."""
        t, data, pos = tup.table, tup.data, tup.pos
        self._row_table = t  # the relation of the row _complete may fill
        if data is self._last[0] and pos == self._last[1]:
            row = self._last[2]
        else:
            row = t.decode(data, pos)
            self._last = (data, pos, row)
        if row is not None:
            if tup.key:
                self.plan = t.key_plan
                return {n: row[n] for n in t.key_names}
            self.plan = t.full_plan
            return row
        # unchanged TOAST values: the row of the columns present, as wal2json writes it; its
        # signature is the whole relation's (whole_rows), and _complete names the rest
        values = parse_tuple(data, pos)[0]
        present = tuple(k for k in (t.key if tup.key else t.all) if values[k] is not UNCHANGED)
        plan = t.plan(present)
        self.plan = t.key_plan if tup.key else t.full_plan
        return plan.convert(values)

    whole_rows = True

    def _complete(self, after: dict[str, Any], before: dict[str, Any] | None,
                  table_columns: Callable[[], list[str]]) -> dict[str, Any]:
        """As wal2json's rows are filled (``complete_after``), but with the relation's columns, which
        name every column of the row, instead of the set merged from the rows seen before."""
        table = self._row_table
        assert table is not None
        return complete_after(after, before, lambda: [c.name for c in table.rel.columns])

    # -------------------------------------------------------------- transactions

    def changes(self, messages: Iterator[tuple[int, bytes]]) -> Iterator[Change]:
        """The transactions of ``messages`` as the wal2json path's messages, each once its
        Commit has said where it ends: B (with ``nextlsn``), its changes, C."""
        upto, start = self.upto.lsn.value, self.start_lsn.value
        held: list[tuple[int, bytes]] = []
        size = 0
        spool: Spool | None = None
        begin: tuple[int, int, int] | None = None
        for lsn, data in messages:
            kind = data[0]
            if begin is not None and kind != _C and spool is None:  # most messages: hold them
                held.append((lsn, data))
                size += len(data)
                if size > self.spool_bytes:
                    spool = Spool(held)
                    held = []
            elif kind == _B:
                begin = parse_begin(data)
                if begin[0] >= upto:
                    return  # its commit record starts at or after the bound: it ends after it
                held, size, spool = [], 0, None
            elif begin is None:  # outside a transaction: only the catalog messages matter
                self._catalog(data)
            elif kind == _C:
                final, end, _ts = parse_commit(data)
                taken = held if spool is None else spool.replay()
                xid, ts = begin[2], begin[1]
                begin = None
                if end > upto:
                    return  # straddles the bound: the next run takes it
                if end <= start:  # delivered before: its Relation messages still count
                    for _lsn, msg in taken:
                        self._catalog(msg)
                    continue
                yield Change("B", xid, commit_us_of(ts), lsn_text(final), Lsn(end))
                yield from self._rows(taken)
                yield Change("C")
            else:
                spool.add(lsn, data)

    def _rows(self, taken: Iterable[tuple[int, bytes]]) -> Iterator[Any]:
        """The changes of a transaction's messages (Relation and Type messages applied in
        their place); with the compiled path, a row change is passed on as it came, its LSN and
        bytes, for the compiled path to take or :meth:`_decoded` to decode."""
        rows, raw = (_I, _U, _D), self.compiled is not None
        for item in taken:
            if item[1][0] in rows:
                yield item if raw else self._row_change(*item)
            else:
                yield from self._other(*item)

    def _row_change(self, at: int, msg: bytes) -> Change:
        """The :class:`Change` of an Insert, Update or Delete message."""
        lsn = "%X/%X" % (at >> 32, at & 0xFFFFFFFF)  # noqa: UP031 - lsn_text's, a call less per row
        kind = msg[0]
        t = self.relations[_u32(msg, 1)[0]]
        if kind == _I:
            return Change("I", None, None, lsn, None, t.schema, t.table, RowTuple(t, msg, 6, False), None,
                          t.pk)
        if kind == _D:
            return Change("D", None, None, lsn, None, t.schema, t.table, None,
                          RowTuple(t, msg, 6, msg[5] == _KEY), t.pk)
        old = msg[5]
        if old == _KEY or old == _OLD:
            ident = RowTuple(t, msg, 6, old == _KEY)
            pos = skip_tuple(msg, 6) + 1
        else:  # the key did not change: wal2json takes it from the new row
            ident, pos = None, 6
        if ident is None and t.key:
            ident = RowTuple(t, msg, pos, True)
        return Change("U", None, None, lsn, None, t.schema, t.table, RowTuple(t, msg, pos, False), ident,
                      t.pk)

    def _other(self, at: int, msg: bytes) -> Iterator[Change]:
        """A transaction's message that is not a row change: a Truncate's changes, or a Relation
        or Type message applied (Origin and Message say nothing about rows)."""
        if msg[0] == _T:
            lsn = lsn_text(at)
            for relid in parse_truncate(msg):
                t = self.relations[relid]
                yield Change("T", None, None, lsn, None, t.schema, t.table)
        else:
            self._catalog(msg)

    def _catalog(self, data: bytes) -> None:
        kind = data[0]
        if kind == _R:
            self._relation(parse_relation(data))
        elif kind == _Y:
            oid, schema, name = parse_type(data)
            self.user_types[oid] = f"{schema}.{name}"

    # -------------------------------------------------------------- relations

    def _relation(self, rel: Relation) -> None:
        types = self._type_names(rel)
        if rel.replica_identity == "d":  # the replica identity is the primary key
            pk = [c.name for c in rel.columns if c.key]
        else:
            pk = [r[0] for r in self.host.server.query(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND "
                "a.attnum = ANY (i.indkey) WHERE i.indrelid = %s AND i.indisprimary ORDER BY a.attnum",
                (rel.relid,))]
        table = self.relations[rel.relid] = Table(rel, types, pk, self.flag)
        if self.compiled is not None:
            kinds = [compiled_kind(c.type_oid, typ, log=True)
                     for c, typ in zip(rel.columns, types, strict=True)]
            self.compiled.relation(rel.relid, rel.schema, rel.table, [c.name for c in rel.columns], kinds,
                                   [c.key for c in rel.columns], pk, table.full_plan.signature)

    def _type_names(self, rel: Relation) -> tuple[str, ...]:
        """The columns' types as wal2json names them: ``format_type`` with the modifier, -1
        included (wal2json's ``format_type_with_typemod``: ``bpchar``, not ``character``)."""
        keys = [(c.type_oid, c.type_mod) for c in rel.columns]
        ask = sorted({k for k in keys if k not in _TYPE_NAMES})
        names = dict(_TYPE_NAMES)
        if ask:
            rows = self.host.server.query(
                "SELECT t, m, format_type(t, m) FROM unnest(%s::oid[], %s::int[]) AS u(t, m)",
                ([k[0] for k in ask], [k[1] for k in ask]))
            for oid, mod, name in rows:
                if name is None or name == "???":
                    name = self.user_types.get(oid, str(oid))
                names[(oid, mod)] = name
                if oid < FIRST_USER_OID:
                    _TYPE_NAMES[(oid, mod)] = name
        return tuple(names[k] for k in keys)
