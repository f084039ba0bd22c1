"""Transactions and sub-batches: the unit a run delivers and checkpoints.

A run's range is cut into sub-batches at transaction boundaries. Each sub-batch ends at a
transaction boundary, so its ``end_position`` is a valid checkpoint for every sink that
acknowledged it.

``respect_source_tx`` (BatchSpec):

* ``True`` (default): a source transaction is never split. Whole transactions are packed into
  a sub-batch until the next one would pass ``max_events``/``max_bytes``; a transaction larger
  than the limits is one oversized sub-batch on its own, whose rows are kept on local disk from
  the moment the transaction passes a limit (:mod:`tidegate.spill`), so memory holds at most
  about one sub-batch's worth of it. Sinks read such a sub-batch back in frames
  (:meth:`SubBatch.chunks`).
* ``False``: a transaction larger than the limits may be split into consecutive sub-batches,
  so memory and sink transactions stay within the limits. Checkpoints still only ever sit at
  transaction boundaries: a split part is a ``partial`` :class:`Transaction` whose
  ``end_position`` is the boundary *before* the transaction, so delivering it never moves a
  checkpoint; only the part holding the last row carries the commit position. A crash inside
  a split transaction re-delivers the whole transaction (at-least-once; consumers dedup by
  ``idempotency_key``), and Kafka read_committed consumers may see its parts in separate Kafka
  transactions. A transaction is only split once the boundary before it is known (i.e. not
  the very first transaction of a run that starts from the pipeline's beginning).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, filterfalse
from operator import attrgetter
from typing import NamedTuple

from .events import ChangeEvent, PositionMark, cached, is_control
from .positions import Position
from .spill import SpilledEvents


class TableRef(NamedTuple):
    """A source table as a sink names its target from it (``{db}``, ``{schema}``, ``{table}``):
    it has the three attributes a sink's naming reads from an event."""

    db: str
    schema: str
    table: str


_table_of = attrgetter("db", "schema", "table")


@dataclass(frozen=True)
class Transaction:
    """All rows of one source transaction, in source order, and the position after its commit.
    ``events`` may be empty: a position the reader passed with nothing to deliver."""

    tx_id: str | None
    end_position: Position
    events: tuple[ChangeEvent, ...] | SpilledEvents  # SpilledEvents: larger than the limits
    # A leading part of a split transaction (respect_source_tx=False); end_position is then the
    # boundary before the transaction, so it is never a checkpoint past the transaction.
    partial: bool = False

    def needed_after(self, position: Position) -> bool:
        """Does a sink whose checkpoint is ``position`` still need this transaction?"""
        if self.partial:  # the sink needs the whole transaction iff it stands at/before its start
            return self.end_position >= position
        return self.end_position > position

    @cached  # functools.cached_property takes a lock shared by all transactions on every first read
    def byte_size(self) -> int:
        if type(self.events) is SpilledEvents:
            return self.events.byte_size
        return sum(len(e.value) for e in self.events)


@dataclass(frozen=True)
class SubBatch:
    """Whole transactions in source order. ``seq`` counts sub-batches within a run from 1."""

    seq: int
    transactions: tuple[Transaction, ...]

    @property
    def end_position(self) -> Position:
        return self.transactions[-1].end_position

    @property
    def events(self) -> Iterator[ChangeEvent]:
        for tx in self.transactions:
            yield from tx.events

    @property
    def event_count(self) -> int:
        return sum(len(tx.events) for tx in self.transactions)

    @property
    def byte_size(self) -> int:
        return sum(tx.byte_size for tx in self.transactions)

    @property
    def spilled(self) -> bool:
        """Does a transaction of this sub-batch live on disk (larger than the limits)?"""
        return any(type(tx.events) is SpilledEvents for tx in self.transactions)

    def chunks(self) -> Iterator[list[ChangeEvent]]:
        """The events in source order, as lists: one list when every transaction is in memory,
        else frames of a spilled transaction read back one at a time (what a sink that must
        not hold the whole sub-batch iterates)."""
        if not self.spilled:
            yield list(self.events)
            return
        held: list[ChangeEvent] = []
        for tx in self.transactions:
            if type(tx.events) is not SpilledEvents:
                held += tx.events
                continue
            if held:
                yield held
                held = []
            yield from tx.events.frames()
        if held:
            yield held

    @cached  # counted once per sub-batch: every sink that gets all of it shares the count
    def table_counts(self) -> dict[TableRef, int]:
        """Row events per source table (control messages are no table's)."""
        in_memory = (tx.events for tx in self.transactions if type(tx.events) is not SpilledEvents)
        rows = filterfalse(is_control, chain.from_iterable(in_memory))
        counts = Counter(map(_table_of, rows))
        for tx in self.transactions:
            if type(tx.events) is SpilledEvents:  # counted as it was written
                counts.update(tx.events.table_counts)
        return {TableRef(*k): n for k, n in counts.items()}

    def after(self, position: Position | None) -> SubBatch:
        """The part of this sub-batch a sink at ``position`` still needs: the transactions that
        end after it. A sink that is ahead gets an empty (but still positioned) sub-batch."""
        if position is None or self.transactions[0].needed_after(position):
            return self  # transactions end in source order: if the first is needed, all are
        keep = tuple(tx for tx in self.transactions if tx.needed_after(position))
        # Keep a positioned, event-less tail so the caller still knows where this batch ends.
        tail = Transaction(None, self.end_position, ())
        return SubBatch(self.seq, keep or (tail,))

    def until(self, position: Position | None) -> SubBatch:
        """The part of this sub-batch that ends at or before ``position`` (a replay delivers a
        past run's range and nothing beyond it)."""
        if position is None or self.end_position <= position:
            return self
        keep = tuple(tx for tx in self.transactions if tx.end_position <= position)
        return SubBatch(self.seq, keep or (Transaction(None, self.end_position, ()),))


# --------------------------------------------------------------------------- cutting


def cut_sub_batches(items: Iterable[ChangeEvent | PositionMark], *, max_events: int, max_bytes: int,
                    respect_source_tx: bool = True) -> Iterator[SubBatch]:
    """Cut a source stream (see ``sources.base``) into sub-batches, lazily.

    Rows are grouped into transactions (a transaction ends at the row with ``tx_end=True``; a
    :class:`PositionMark` becomes an event-less transaction, consecutive marks merge into the
    last one). Whole transactions are packed in source order until the next would pass a
    limit. At most one sub-batch (plus one transaction being assembled) is held in memory.
    """
    if max_events < 1 or max_bytes < 1:
        raise ValueError("max_events and max_bytes must be at least 1")
    txs = _transactions(items, (max_events, max_bytes), split=not respect_source_tx)
    return _pack(txs, max_events, max_bytes)


def _pack(txs: Iterator[Transaction], max_events: int, max_bytes: int) -> Iterator[SubBatch]:
    buf: list[Transaction] = []
    n = size = 0
    seq = 0
    for tx in txs:
        tx_n, tx_size = len(tx.events), tx.byte_size
        if n and tx_n and (n + tx_n > max_events or size + tx_size > max_bytes):
            seq += 1
            yield SubBatch(seq, tuple(buf))
            buf, n, size = [], 0, 0
        if not tx_n and buf and not buf[-1].events and not buf[-1].partial:
            buf[-1] = tx  # merge consecutive position marks: only the last one matters
        else:
            buf.append(tx)
        n, size = n + tx_n, size + tx_size
        if n >= max_events or size >= max_bytes:  # full (or one oversized transaction)
            seq += 1
            yield SubBatch(seq, tuple(buf))
            buf, n, size = [], 0, 0
    if buf:
        yield SubBatch(seq + 1, tuple(buf))


def _transactions(items: Iterable[ChangeEvent | PositionMark], limits: tuple[int, int], *,
                  split: bool) -> Iterator[Transaction]:
    """Group rows into transactions. A transaction that grows past ``limits`` (events, bytes) is
    emitted in partial parts with ``split``, else spilled to disk (see the module docstring)."""
    rows: list[ChangeEvent] | SpilledEvents = []
    rows_bytes = 0
    boundary: Position | None = None  # the last transaction boundary seen
    max_events, max_bytes = limits
    item_tx: str | None = None  # the open transaction's id (for messages)
    for item in items:
        if isinstance(item, PositionMark):
            if rows:
                raise ValueError(f"source yielded a position mark at {item.position} inside a "
                                 f"transaction ({item_tx}): marks only go between transactions")
            boundary = item.position
            yield Transaction(None, item.position, ())
            continue
        item_tx = item.tx_id
        rows_bytes += len(item.value)
        rows.append(item)
        if item.tx_end:
            events = rows.seal() if type(rows) is SpilledEvents else tuple(rows)
            yield Transaction(item.tx_id, item.end_position, events)
            boundary, rows, rows_bytes = item.end_position, [], 0
        elif type(rows) is list and (len(rows) >= max_events or rows_bytes >= max_bytes):
            if split and boundary is not None:
                yield Transaction(item.tx_id, boundary, tuple(rows), partial=True)
                rows, rows_bytes = [], 0
            else:  # kept whole (or split, but with no boundary to split at yet): on disk
                rows = SpilledEvents(rows)
    if rows:
        raise ValueError(f"source stream ended inside transaction {item_tx}: "
                         f"a source must yield whole transactions")
