"""The source interface. MySQL/MariaDB (binlog) and Postgres (wal2json) sources implement it.

``read(start, upto)`` yields, in source order, :class:`ChangeEvent` rows (the last row of each
transaction has ``tx_end=True`` and ``end_position``) and :class:`PositionMark` records for
ranges with nothing to deliver. It covers exactly the transactions that commit after
``start`` and at or before ``upto``, never blocks waiting for new changes, and streams in
bounded memory. When the range is exhausted it yields a final ``PositionMark(upto)`` if the
last transaction ended before ``upto``, so checkpoints can reach the run's upper bound.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Any

from ..events import ChangeEvent, PositionMark
from ..positions import Position

SourceItem = ChangeEvent | PositionMark


class Source(abc.ABC):
    kind: str = ""

    @abc.abstractmethod
    def head(self) -> Position:
        """The current end of the change log: a run's upper bound."""

    @abc.abstractmethod
    def identity(self) -> dict[str, Any]:
        """What identifies the server (compared by the failover guard)."""

    @abc.abstractmethod
    def read(self, start: Position | None, upto: Position) -> Iterator[SourceItem]:
        """Changes committed in (start, upto], in source order."""

    def has_changes(self, start: Position | None, upto: Position) -> bool:
        """Whether (start, upto] holds any row to deliver. The head also moves for changes a
        pipeline does not carry (other tables, empty transactions, WAL housekeeping); a run
        then has nothing to deliver and need not start Spark. Default: read until the first row."""
        return any(isinstance(item, ChangeEvent) for item in self.read(start, upto))

    def release(self, position: Position) -> None:  # noqa: B027 - optional hook
        """Tell the server it may recycle the log up to ``position`` (Postgres slot advance)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Must not raise."""
