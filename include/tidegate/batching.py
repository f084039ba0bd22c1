"""Transactions and sub-batches: the unit a run delivers and checkpoints.

A run's range is cut into sub-batches at transaction boundaries. Each sub-batch ends at a
transaction boundary, so its ``end_position`` is a valid checkpoint for every sink that
acknowledged it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from .events import ChangeEvent
from .positions import Position


@dataclass(frozen=True)
class Transaction:
    """All rows of one source transaction, in source order, and the position after its commit.
    ``events`` may be empty: a position the reader passed with nothing to deliver."""

    tx_id: str | None
    end_position: Position
    events: tuple[ChangeEvent, ...]

    @property
    def byte_size(self) -> int:
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

    def after(self, position: Position | None) -> "SubBatch":
        """The part of this sub-batch a sink at ``position`` still needs: the transactions that
        end after it. A sink that is ahead gets an empty (but still positioned) sub-batch."""
        if position is None:
            return self
        keep = tuple(tx for tx in self.transactions if tx.end_position > position)
        if len(keep) == len(self.transactions):
            return self
        # Keep a positioned, event-less tail so the caller still knows where this batch ends.
        tail = Transaction(None, self.end_position, ())
        return SubBatch(self.seq, keep or (tail,))
