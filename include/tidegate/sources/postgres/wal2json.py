"""Reading the slot: wal2json messages in, change events out.

* the transports: :func:`stream_messages` (the default) reads the slot over the streaming
  replication protocol, so the server decodes while the reader converts;
  :func:`peek_messages` is one ``pg_logical_slot_peek_changes`` call up to the run's bound
  through a named server-side cursor (the reference path's transport; the server decodes the
  whole range before the first row comes back). Both cost time linear in the range, hold
  bounded memory on the client, and never move the slot.
* :class:`Wal2JsonDecoder` is the read path: it parses each message with msgspec into typed
  structs (JSON numbers that are not integers are kept exact as ``Decimal``), converts rows
  with a generated :class:`~.values.RowPlan` per (table, column signature), and builds events
  with ``ChangeEvent.native``; where the compiled module is built, row changes are first
  offered to it (:func:`compiled_rows`, tidegate.native.rowcodec.Wal2JsonRows), which writes
  the same bytes from the message's JSON. It applies the transaction rules of the package
  ("Positions, ids and boundaries" in ``sources/postgres/__init__.py``): the bound, the skip of
  transactions that end at or before the start, empty transactions, a commit straddling the
  bound, unchanged TOAST values.
* schema changes: a ``TRUNCATE`` and a change of a table's column set become ``schema_change``
  control messages where they sit (``columns.py`` tells the column changes from the rows);
* :func:`has_changes` is the cheap look a run takes before starting Spark.

The read path this one replaced (stdlib ``json`` and one converter call per value, over
:func:`peek_messages`) is a test oracle, ``tests/reference_decoders/postgres_reference.py``;
``tests/integration/test_postgres_reader.py`` reads one WAL range with both and compares every
item byte for byte.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable, Iterable, Iterator
from decimal import Decimal
from typing import Any, Protocol

import msgspec
import psycopg2

from ...errors import SourceError
from ...events import ChangeEvent, ControlMessage, PositionMark, split_key_change
from ...filters import table_list
from ...native import rowcodec
from ...shipped import ShippedEvent
from ...spec import PipelineSpec
from ..base import SourceItem
from ..timeouts import READ_TIMEOUT_ENV, read_timeout_s
from .columns import ColumnTracker
from .connection import REPLICATION_OPTIONS, PgServer
from .position import Lsn, PgPosition
from .slot import Slot
from .values import RowPlan, commit_time, complete_after

# wal2json's options, the same for both transports
WAL2JSON = {"format-version": "2", "include-lsn": "1", "include-xids": "1", "include-timestamp": "1",
            "include-pk": "1"}
WAL2JSON_OPTIONS = ", ".join(f"'{k}', '{v}'" for k, v in WAL2JSON.items())
_NO_FEEDBACK_S = 366 * 86400  # psycopg2's status interval: never, in practice
_WAIT_S = 1.0  # how long one wait for the next message lasts (then the loop looks again)
_OPS = {"I": "c", "U": "u", "D": "d"}
_PLAN_CACHE_MAX = 10_000


class ReadHost(Protocol):
    """What a reader asks of the source it reads for."""

    spec: PipelineSpec
    tables: frozenset[tuple[str, str]]  # or a filters.TableFilter (patterns): `in` answers either way
    server: PgServer

    def table_columns(self, schema: str, table: str) -> list[str]: ...

    def column_tracker(self, start: PgPosition) -> ColumnTracker: ...


def old_key(before: dict[str, Any], key: dict[str, Any]) -> dict[str, Any] | None:
    """The old primary key of an UPDATE when it differs from the new one; None when it is the
    same or the old row does not hold every key column (REPLICA IDENTITY without the key)."""
    if not all(c in before for c in key):
        return None
    old = {c: before[c] for c in key}
    return old if old != key else None


# ---------------------------------------------------------------------- transports


def peek_sql(table_options: Iterable[str] = (), limited: bool = False) -> str:
    """The peek, with a ``%s`` parameter for each of ``table_options`` (their values follow the
    slot, the bound and the limit)."""
    opts = WAL2JSON_OPTIONS + "".join(f", '{name}', %s" for name in table_options)
    return ("SELECT data FROM pg_logical_slot_peek_changes(%s, %s::pg_lsn, "
            + ("%s" if limited else "NULL") + ", " + opts + ")")


def peek_messages(server: PgServer, slot: Slot, upto: PgPosition, tables: frozenset[tuple[str, str]],
                  itersize: int) -> Iterator[str]:
    """The slot's wal2json messages of the transactions that commit up to ``upto`` (and possibly
    one commit straddling it), through a named cursor on a session of its own. Closing the
    iterator early closes the cursor and the session."""
    table_options = table_list(tables)  # the server leaves other tables out where it can
    args: list[Any] = [slot.name, str(upto.lsn), *table_options.values()]
    slot.take_over()
    conn = server.connect(application_name=slot.holder)
    try:
        cur = conn.cursor(name=f"tidegate_peek_{slot.name}")
        cur.itersize = itersize
        try:
            try:
                cur.execute(peek_sql(table_options), args)
                for (data,) in cur:
                    yield data
            except psycopg2.Error as exc:
                raise slot.read_error(exc) from None
        finally:
            try:
                cur.close()
            except psycopg2.Error:
                pass
    finally:
        try:
            conn.rollback()
            conn.close()
        except Exception:  # noqa: BLE001 - closing must not hide the read's own error
            pass


def stream_messages(server: PgServer, slot: Slot, upto: PgPosition,
                    tables: frozenset[tuple[str, str]]) -> Iterator[bytes]:
    """The slot's wal2json messages over the streaming replication protocol, from the slot's
    confirmed position until the server has decoded past ``upto``: the server decodes while
    the reader converts (a peek decodes the whole range before returning its first row).

    The same messages as :func:`peek_messages` (same plugin options, same session settings,
    the server starts at the slot's confirmed position either way), plus possibly more after
    the bound, which the reader does not take. See :func:`replication_stream`.
    """
    options = {**WAL2JSON, **table_list(tables)}
    return replication_stream(server, slot, upto, options)


def replication_stream(server: PgServer, slot: Slot, upto: PgPosition, options: dict[str, str], *,
                       with_lsn: bool = False, session: str = REPLICATION_OPTIONS) -> Iterator[Any]:
    """The slot's messages (``with_lsn``: (LSN, message) pairs, the LSN of the message's
    change) over the streaming replication protocol with the plugin ``options``, in a session
    with the settings ``session``.

    The stream ends when no message is waiting and the server's last report of how far it
    decoded (``wal_end``, from the keepalive it sends whenever it waits for more WAL) has
    reached ``upto``: every transaction that commits by then has been sent before that report.
    (When the bound lies inside a record whose end is not flushed yet, see
    :meth:`PgServer.head`, that takes until the server flushes it: at the latest when its
    background writer logs the next standby snapshot, every 15 seconds while WAL is written,
    which the WAL writer then flushes.)

    The session's application_name names the pipeline and the run's lease epoch
    (``Slot.holder``): a later run that finds this one stalled while it holds the slot
    terminates its WAL sender and takes the slot over (``Slot.take_over``).

    Nothing is ever confirmed to the server, so reading never moves the slot: the session
    runs with ``wal_sender_timeout=0`` (the server never asks for a status reply) and
    psycopg2's periodic status messages are off. (psycopg2 would otherwise report the
    position of a keepalive that arrives before the first change as flushed.) Releasing the
    slot stays :meth:`Slot.release`. Closing the iterator closes the session, and waits until
    the server has let go of the slot, so the next statement on it does not find it busy.
    """
    slot.take_over()  # a stalled older run of the pipeline may still hold the slot
    conn = server.connect_replication(slot.session_options(session), slot.holder)
    pid = conn.get_backend_pid()
    try:
        cur = conn.cursor()
        try:
            cur.start_replication(slot_name=slot.name, start_lsn=0, decode=False, options=options,
                                  status_interval=_NO_FEEDBACK_S)
            read = cur.read_message
            bound = upto.lsn.value
            # A server that hangs keeps the session open and silent: the read gives up when
            # nothing at all (no change, no keepalive moving wal_end) came for the timeout.
            timeout = read_timeout_s()
            heard, quiet_since, wal_end = False, time.monotonic(), cur.wal_end
            while True:
                msg = read()
                if msg is None:
                    if cur.wal_end >= bound:
                        return
                    if heard or cur.wal_end != wal_end:
                        heard, quiet_since, wal_end = False, time.monotonic(), cur.wal_end
                    elif time.monotonic() - quiet_since > timeout:
                        raise SourceError(
                            f"{server.conn} sent nothing for {timeout:g}s ({READ_TIMEOUT_ENV}) while "
                            f"streaming slot {slot.name!r} up to {upto.lsn}: the server hangs, or the "
                            f"network drops packets. Raise {READ_TIMEOUT_ENV} if it is only slow")
                    select.select([cur], [], [], _WAIT_S)
                elif with_lsn:
                    heard = True
                    yield msg.data_start, msg.payload
                else:
                    heard = True
                    yield msg.payload
        except psycopg2.Error as exc:
            raise slot.read_error(exc) from None
    finally:
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - closing must not hide the read's own error
            pass
        slot.wait_released(pid)


# ---------------------------------------------------------------------- message format


class Column(msgspec.Struct, gc=False):
    name: str
    type: str
    value: Any = None


class KeyColumn(msgspec.Struct, gc=False):
    name: str
    type: str


class Message(msgspec.Struct, gc=False):
    """One wal2json format-version 2 message: B(egin), C(ommit), I/U/D (row changes),
    T(runcate), M(essage). Fields a message does not carry stay None; others are ignored."""

    action: str
    xid: int | None = None
    timestamp: str | None = None
    lsn: str | None = None
    nextlsn: str | None = None
    schema: str | None = None
    table: str | None = None
    columns: list[Column] | None = None
    identity: list[Column] | None = None
    pk: list[KeyColumn] | None = None


class _Boundary(msgspec.Struct, gc=False):
    action: str
    nextlsn: str | None = None
    schema: str | None = None
    table: str | None = None


MESSAGE = msgspec.json.Decoder(Message, float_hook=Decimal)
_BOUNDARY = msgspec.json.Decoder(_Boundary, float_hook=Decimal)


def has_changes(server: PgServer, slot: Slot, tables: frozenset[tuple[str, str]], start_lsn: Lsn,
                upto: PgPosition, limit: int) -> bool | None:
    """Peek at most ``limit`` decoded messages of the slot for a row change of the pipeline's
    tables committed in (start, upto]: True, False, or None when the look was cut off by
    ``limit`` before it met one (there may be work). The peek's own limit counts changes but
    returns whole transactions, so the rows sent back are capped too (``LIMIT``): the first
    transaction of a 5M-row migration would otherwise come back whole, several GiB in this
    process."""
    table_options = table_list(tables)
    args: list[Any] = [slot.name, str(upto.lsn), limit, *table_options.values(), limit]
    try:
        rows = server.query(peek_sql(table_options, limited=True) + " LIMIT %s", tuple(args))
    except psycopg2.Error as exc:
        raise slot.read_error(exc) from None
    counts = False
    for (data,) in rows:
        m = _BOUNDARY.decode(data)
        a = m.action
        if a == "B":
            end = Lsn.parse(m.nextlsn)
            counts = start_lsn < end <= upto.lsn
        elif counts and a in ("I", "U", "D", "T") and (not tables or (m.schema, m.table) in tables):
            return True
    return None if len(rows) >= limit else False


# ---------------------------------------------------------------------- the read path


class TxCounts:
    """A transaction's event counts: per LSN (an event's id), in all (``total_order``) and per
    table (``data_collection_order``). The compiled path (tidegate.native.rowcodec.Wal2JsonRows)
    keeps them itself, with the same methods, for the events of both paths.

    Logical decoding hands a transaction's changes on in LSN order, and the rows of one WAL record
    (a multi-insert: COPY, INSERT ... SELECT) one after another: the count at an LSN needs only
    the last LSN, not one entry per change (a 5M-row transaction held 5M of them)."""

    def begin(self, tx_id: str, commit: str, xid: int | None, ts_ms: int, ts_us: int | None) -> None:
        self.total = 0
        self.per_table: dict[tuple[str, str], int] = {}
        self.last_lsn, self.at_lsn = "", 0

    def next(self, tkey: tuple[str, str], lsn: str) -> tuple[int, int, int]:
        """(index among the events at ``lsn``, total order, order within the table) of the next event."""
        if lsn == self.last_lsn:
            n = self.at_lsn
            self.at_lsn += 1
        else:
            n, self.last_lsn, self.at_lsn = 0, lsn, 1
        self.total += 1
        k = self.per_table.get(tkey, 0) + 1
        self.per_table[tkey] = k
        return n, self.total, k

    def extra(self, tkey: tuple[str, str]) -> None:
        """One more event of ``tkey`` (the second event of a primary-key change)."""
        self.total += 1
        self.per_table[tkey] += 1


def compiled_applies(host: Any) -> bool:
    """Whether a read of ``host`` can take the compiled row path (tidegate.native): not where it
    is not built or switched off (``TIDEGATE_NATIVE=0``), nor with column filters, which work on
    the values the compiled path never makes."""
    return rowcodec is not None and getattr(host, "column_filters", None) is None


def compiled_rows(host: ReadHost, plugin: str = "wal2json") -> Any:
    """The compiled row path for a read of ``host`` through ``plugin``, or None where it does not
    apply (:func:`compiled_applies`)."""
    if not compiled_applies(host):
        return None
    spec = host.spec
    rows = rowcodec.PgOutputRows if plugin == "pgoutput" else rowcodec.Wal2JsonRows
    return rows(spec.tenant, spec.pipeline, host.tables, ShippedEvent)


class Wal2JsonDecoder:
    """One bounded pass: the transactions that end in (``start_lsn``, ``upto``]."""

    use_compiled = True  # False: every message through the Python path (a subclass's choice)

    @staticmethod
    def messages(source: Any, upto: PgPosition) -> Iterator[bytes]:
        """The messages a read of ``source`` up to ``upto`` runs on: streamed (replication protocol)."""
        return stream_messages(source.server, source.replication_slot, upto, source.tables)

    def __init__(self, host: ReadHost, start_lsn: Lsn, upto: PgPosition):
        self.host = host
        self.start_lsn = start_lsn
        self.upto = upto
        self.flag = [False]  # set by a row plan that met a float orjson writes differently
        self.plans: dict[tuple[str, str, int], RowPlan] = {}
        self.plan: RowPlan | None = None  # the plan of the last conversion

    # Whether a row's signature (:attr:`plan`) names every column of the table even when the row
    # leaves unchanged TOAST values out: wal2json's does not say which it left out, pgoutput's does
    whole_rows = False

    def _complete(self, after: dict[str, Any], before: dict[str, Any] | None,
                  table_columns: Callable[[], list[str]]) -> dict[str, Any]:
        """An UPDATE's new row with the unchanged TOAST values it left out filled in."""
        return complete_after(after, before, table_columns)

    def _convert(self, schema: str, table: str, cols: list[Column]) -> dict[str, Any]:
        """A row's final values: through the plan of its signature (made on first use)."""
        k = (schema, table, len(cols))
        plan = self.plan = self.plans.get(k)
        if plan is not None:
            row = plan.convert(cols)
            if row is not None:
                return row
        # A new table, or another signature (DDL in range, unchanged TOAST left out): one plan
        # per (table, column count), replaced when the signature changes.
        if len(self.plans) >= _PLAN_CACHE_MAX:
            self.plans.clear()
        plan = self.plan = self.plans[k] = RowPlan(tuple((c.name, c.type) for c in cols), self.flag)
        row = plan.convert(cols)
        assert row is not None  # the plan was made from these columns
        return row

    def run(self, messages: Iterator[str | bytes]) -> Iterator[SourceItem]:
        """The items of the slot's wal2json ``messages``: row changes through the compiled path
        where it applies (:func:`compiled_rows`), the rest decoded here."""
        compiled = compiled_rows(self.host) if self.use_compiled else None
        if compiled is None:
            return self.items(map(MESSAGE.decode, messages))
        return self.items(messages, compiled)

    def items(self, messages: Iterator[Any], compiled: Any = None,
              decode: Callable[[Any], Any] = MESSAGE.decode) -> Iterator[SourceItem]:
        """The items of decoded messages (:class:`Message`, or objects with its fields whose
        ``columns`` and ``identity`` :meth:`_convert` takes: the pgoutput reader's); with
        ``compiled`` (:func:`compiled_rows`), of raw messages, each row change first offered to
        the compiled path and, where it declines, made a message by ``decode``."""
        host = self.host
        spec = host.spec
        tenant, pipeline = spec.tenant, spec.pipeline
        tables = host.tables
        sysid, tl = host.server.system_and_timeline()
        upto_lsn, start_lsn = self.upto.lsn, self.start_lsn
        tracker = host.column_tracker(PgPosition(start_lsn, sysid, tl))

        def columns_of(schema: str, table: str) -> list[str]:
            """What an UPDATE that left out unchanged TOAST values really holds."""
            return tracker.names(schema, table) or host.table_columns(schema, table)

        seen: dict[tuple[str, str], tuple] = {}  # per table: the last new tuple's signature
        native = ChangeEvent.native
        convert = self._convert
        flag = self.flag
        ops = _OPS
        last_end: Lsn | None = None
        pending: ChangeEvent | ControlMessage | None = None
        skip = True
        tx_id = ""
        xid: int | None = None
        commit: str | None = None
        ts_ms, ts_us = 0, None
        counts = compiled if compiled is not None else TxCounts()
        end: Lsn | None = None
        for m in messages:
            if compiled is not None:
                if not skip:
                    ev = compiled.row(m, seen)
                    if ev is not None:
                        if pending is not None:
                            yield pending
                        pending = ev
                        continue
                m = decode(m)
            a = m.action
            if a == "B":
                end = Lsn.parse(m.nextlsn)
                if end > upto_lsn:
                    break  # commits after the bound (a peek may return one such transaction)
                skip = end <= start_lsn
                xid, commit = m.xid, m.lsn
                tx_id = f"{xid}:{commit}"
                ts_ms, ts_us = commit_time(m.timestamp)
                counts.begin(tx_id, commit, xid, ts_ms, ts_us)
                pending = None
                continue
            if skip:
                continue
            if a == "C":
                if pending is not None:  # an empty transaction yields nothing
                    last_end = end
                    ev, pending = pending.ending(PgPosition(end, sysid, tl)), None
                    yield ev
                continue
            schema, table = m.schema, m.table
            tkey = (schema, table)
            if tables and tkey not in tables:
                continue
            op = ops.get(a)
            if op is None:
                if a == "T":
                    if pending is not None:
                        yield pending
                    pending = tracker.truncate_message(
                        schema, table, lsn=m.lsn, position={"lsn": m.lsn, "commit_lsn": commit, "xid": xid},
                        ts_ms=ts_ms, tx_id=tx_id, end=PgPosition(end, sysid, tl), commit_us=ts_us)
                continue  # M (logical messages)
            lsn = m.lsn
            n, total, k = counts.next(tkey, lsn)
            flag[0] = False
            ident = m.identity
            before = convert(schema, table, ident) if ident is not None else None
            if op == "d":
                after = None
            else:
                old_sig = self.plan.signature if before is not None else None
                cols = m.columns
                after = convert(schema, table, cols) if cols is not None else None
                if after is not None:
                    sig = self.plan.signature
                    last = seen.get(tkey)
                    if last is not sig and last != sig:  # a new shape of this table's rows
                        seen[tkey] = sig
                        # a row that names every column tells the set as an INSERT does
                        change = tracker.observe(schema, table, "c" if self.whole_rows else op, sig, old_sig,
                                                 PgPosition(end, sysid, tl))
                        if change is not None:
                            if pending is not None:
                                yield pending
                            pending = tracker.columns_message(
                                schema, table, change, event_id=f"{lsn}:{n}:columns",
                                position={"lsn": lsn, "commit_lsn": commit, "xid": xid}, ts_ms=ts_ms,
                                tx_id=tx_id, end=PgPosition(end, sysid, tl))
                if op == "u" and after is not None:
                    after = self._complete(after, before, lambda s=schema, t=table: columns_of(s, t))
            image = after if after is not None else before
            pk = m.pk
            if pk and image:
                if len(pk) == 1:
                    name = pk[0].name
                    key = {name: image.get(name)}
                else:
                    key = {c.name: image.get(c.name) for c in pk}
            else:
                key = None
            ev = native(tenant, pipeline, "postgresql", schema, schema, table, op, before, after, key,
                        tx_id, f"{lsn}:{n}", {"lsn": lsn, "commit_lsn": commit, "xid": xid}, ts_ms,
                        total, k, False, False, None, not flag[0], ts_us)
            if op == "u" and key is not None and before and (old := old_key(before, key)) is not None:
                if pending is not None:
                    yield pending
                pending, ev = split_key_change(ev, old)  # the key changed: a delete (held), a create
                counts.extra(tkey)
            if pending is not None:
                yield pending
            pending = ev
        if last_end is None or last_end < upto_lsn:
            yield PositionMark(self.upto)
