"""Transaction assembly for a bounded binlog read, shared by both log readers.

The readers (``decoder.py``; the reference in tests/reference_decoders) decode events
their own way; what a transaction is, what it is called, where it ends and what a read yields when it ends is
decided here, once, by :class:`TransactionAssembler` (the rules are the "Positions, ids and
boundaries" of ``sources/mysql/__init__.py``):

* a transaction opens at a GTID event or a ``BEGIN`` query and closes at ``XID`` or a
  ``COMMIT``/``ROLLBACK`` query; a DDL statement outside one (or a MariaDB standalone GTID
  group) is a transaction of its own;
* the reader hands over every row event as a built :class:`ChangeEvent`; the assembler holds
  the latest one back until it knows whether the next item closes the transaction, and then
  marks it as the transaction's last row with its ``end_position``;
* statement-logged DML that may touch a captured table and XA transactions are refused; a DDL
  statement is recorded as a :class:`SchemaChange` through the read's host, which answers with
  the ``schema_change`` control messages it makes (one per captured table the statement
  changes); they take the statement's place in the stream, inside its transaction, and are
  held back like rows, so the last item of a transaction carries its end whatever it is;
* at the end of the read it checks that no transaction was cut and yields the final
  :class:`PositionMark`.

:class:`GtidState` follows the executed GTID set while the read moves forward, so every end
position carries the set a checkpoint needs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from ...errors import SourceError, SourceSettingError
from ...events import ChangeEvent, ControlMessage, PositionMark
from ...spec import PipelineSpec
from ..base import SourceItem
from .position import BinlogPosition, GtidSet, merge_intervals

_DML_PREFIXES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "LOAD DATA")


@dataclass(frozen=True)
class SchemaChange:
    """A DDL statement read from the binlog, at ``position`` (the query event's start) and
    ending at ``end_position`` (the end of the query event; a transaction boundary unless the
    statement is part of a larger event group, as ``CREATE TABLE ... SELECT`` is). ``db`` is the
    statement's default database, ``gtid`` its transaction's GTID (None without GTIDs)."""

    position: BinlogPosition
    end_position: BinlogPosition
    tx_id: str
    db: str
    query: str
    ts_ms: int
    gtid: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"position": self.position.to_json(), "end_position": self.end_position.to_json(),
                "tx_id": self.tx_id, "db": self.db, "query": self.query, "ts_ms": self.ts_ms,
                "gtid": self.gtid}


class ReadHost(Protocol):
    """What a log reader asks of the source it reads for: the pipeline, its table filter, the
    server's flavor, positions on this server, and where schema changes go."""

    spec: PipelineSpec
    tables: frozenset[tuple[str, str]]
    dbs: frozenset[str]
    conn: Any

    @property
    def is_mariadb(self) -> bool: ...

    def position(self, file: str, pos: int, gtid_set: GtidSet | None) -> BinlogPosition: ...

    def record_schema_change(self, change: SchemaChange) -> list[ControlMessage]: ...


def file_seq(name: str) -> int:
    """The sequence number of a binlog file name (``mysql-bin.000042`` → 42)."""
    return int(name.rsplit(".", 1)[1])


class GtidState:
    """The executed GTID set while reading forward (updated per GTID event). MySQL's is kept as
    merged intervals per server UUID, extended in place by each transaction's number: the set
    taken at every transaction's end is copied from them, not parsed from its text (8.5 µs per
    transaction with one UUID and 62 with twenty, that way; benchmarks/gtid_state.py)."""

    def __init__(self, seed: GtidSet | None, flavor: str):
        self.flavor = flavor
        self.mariadb: dict[int, tuple[int, int]] = {}
        self.mysql: dict[str, list[tuple[int, int]]] = {}
        self.known = seed is not None or flavor == "mariadb"
        if seed is not None:
            for d, s, n in seed.mariadb:
                self.mariadb[d] = (s, n)
            for u, iv in seed.mysql:
                self.mysql[u] = list(iv)
        self._cache: GtidSet | None = seed

    def add_mariadb(self, domain: int, server: int, seq: int) -> None:
        self.mariadb[domain] = (server, seq)
        self._cache = None

    def add_mysql(self, gtid: str) -> None:
        uuid, _, n = gtid.rpartition(":")
        k, uuid = int(n), uuid.lower()
        intervals = self.mysql.get(uuid)
        if intervals is None:
            self.mysql[uuid] = [(k, k)]
        elif intervals[-1][1] + 1 == k:  # the server's next number: the usual case
            intervals[-1] = (intervals[-1][0], k)
        else:
            self.mysql[uuid] = list(merge_intervals([*intervals, (k, k)]))
        self._cache = None

    def current(self) -> GtidSet | None:
        if self._cache is None:
            if self.flavor == "mariadb":
                if not self.mariadb:
                    return None
                self._cache = GtidSet("mariadb", mariadb=tuple(sorted((d, s, n) for d, (s, n)
                                                                      in self.mariadb.items())))
            else:
                if not self.known or not self.mysql:
                    return None
                self._cache = GtidSet("mysql", mysql=tuple((u, tuple(iv))
                                                           for u, iv in sorted(self.mysql.items())))
        return self._cache


class TransactionAssembler:
    """The transaction state of one bounded read from ``start`` to ``upto``. The reader keeps
    :attr:`file` current (rotate events) and calls :meth:`begin`, :meth:`hold`, :meth:`end`,
    :meth:`statement` and, when the stream is done, :meth:`finish`."""

    def __init__(self, host: ReadHost, start: BinlogPosition, upto: BinlogPosition, gtids: GtidState):
        self.host = host
        self.start = start
        self.upto = upto
        self.gtids = gtids
        self.mariadb = host.is_mariadb
        self.file = start.file
        self.in_tx = False
        self.standalone = False
        self.tx_id: str | None = None
        self.tx_gtid: str | None = None
        self.total = 0  # rows of the open transaction so far
        self.per_table: dict[tuple[str, str], int] = {}  # rows per table of the open transaction
        self.pending: ChangeEvent | ControlMessage | None = None  # the latest item, held back (see hold)
        self.last_end: BinlogPosition | None = None  # end of the last transaction yielded

    def begin(self, pos: int, gtid: str | None, standalone: bool) -> None:
        if self.in_tx:
            raise SourceError(f"binlog event group at {self.file}:{pos} starts inside transaction "
                              f"{self.tx_id}: the binlog is not in the expected form")
        self.in_tx = True
        self.standalone = standalone
        self.tx_gtid = gtid
        self.tx_id = gtid or f"{self.file}:{pos}"
        self.total = 0
        self.per_table = {}
        self.pending = None

    def hold(self, ev: ChangeEvent | ControlMessage) -> ChangeEvent | ControlMessage | None:
        """Hold ``ev`` back; return the item held before it, which is now safe to yield (it is
        not the transaction's last)."""
        prev, self.pending = self.pending, ev
        return prev

    def end(self, end_pos: int) -> Iterator[SourceItem]:
        """Close the open transaction at ``end_pos`` (the end of its commit event)."""
        self.in_tx = False
        if self.pending is not None:  # a transaction with nothing to deliver yields nothing
            end = self.host.position(self.file, end_pos, self.gtids.current())
            ev, self.pending = self.pending.ending(end), None
            self.last_end = end
            yield ev

    def past_upto(self) -> None:
        """The read met the first event at or after ``upto``: it must be between transactions."""
        if self.in_tx:
            raise SourceError(f"the upper bound {self.upto} is inside transaction {self.tx_id}: "
                              f"bounds must be transaction boundaries (use head())")

    def statement(self, db: str, q: str, pos: int, end_pos: int, ts: int) -> Iterator[SourceItem]:
        """A query event (``q`` stripped, ``db`` its default database) at ``pos``..``end_pos``."""
        head = q[:16].upper()
        if head == "BEGIN" or head.startswith("BEGIN "):
            if not self.in_tx:
                self.begin(pos, None, False)
            return
        if head.startswith(("COMMIT", "ROLLBACK")) and not head.startswith("ROLLBACK TO"):
            if self.in_tx:
                yield from self.end(end_pos)
            return
        if head.startswith(("SAVEPOINT", "ROLLBACK TO", "RELEASE SAVEPOINT")):
            return
        if head.startswith("XA "):
            raise SourceError(f"XA transaction at {self.file}:{pos} ({q[:40]}): XA transactions are "
                              f"not supported by the binlog source")
        if head.startswith(_DML_PREFIXES):
            if not self._may_touch_captured(db, q):
                return  # statement DML of databases this pipeline does not capture
            raise SourceSettingError(
                f"statement-logged DML at {self.file}:{pos} ({q[:60]!r}): CDC needs "
                f"binlog_format=ROW (SET GLOBAL binlog_format=ROW, and in the server config; "
                f"sessions must not override it)")
        # DDL (or another statement that is its own event group)
        if not self.in_tx:
            self.begin(pos, None, True)
        ends = self.standalone or self.tx_gtid is None or not self.mariadb
        end = self.host.position(self.file, end_pos, self.gtids.current())
        messages = self.host.record_schema_change(SchemaChange(
            position=self.host.position(self.file, pos, None), end_position=end,
            tx_id=self.tx_id or "", db=db, query=q, ts_ms=ts * 1000, gtid=self.tx_gtid))
        for message in messages:
            ready = self.hold(message)
            if ready is not None:
                yield ready
        if ends:
            yield from self.end(end_pos)

    def _may_touch_captured(self, db: str, q: str) -> bool:
        """Whether a statement-logged DML may change a captured table: always without a table
        filter; otherwise when its default database or the text names a captured database."""
        dbs = self.host.dbs
        if not dbs:
            return True
        return db in dbs or any(d.lower() in q.lower() for d in dbs)

    def finish(self) -> Iterator[SourceItem]:
        """The stream is done (at ``upto`` or at the server's end of binlog)."""
        if self.in_tx:
            raise SourceError(f"the binlog of {self.host.conn} ended inside transaction {self.tx_id} "
                              f"before {self.upto}")
        if self.last_end is None or self.last_end < self.upto:
            mark = self.upto
            if self.gtids.current() is not None and self.upto.gtid_set is None:
                mark = self.host.position(self.upto.file, self.upto.pos, self.gtids.current())
            yield PositionMark(mark)
