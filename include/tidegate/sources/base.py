"""The source interface: everything the engine, the guards and the Spark job ask of a source.

MySQL/MariaDB (binlog) and Postgres (wal2json) implement it; nothing outside this package
switches on the source kind or probes for optional methods.

``read(start, upto)`` yields, in source order, :class:`ChangeEvent` rows, ``schema_change``
:class:`ControlMessage` items where the log changes a captured table's definition (inside the
transaction that changes it, like a row; the last item of each transaction has
``tx_end=True`` and ``end_position``) and :class:`PositionMark` records for ranges with
nothing to deliver. It covers exactly the transactions that commit after
``start`` and at or before ``upto``, never blocks waiting for new changes, and streams in
bounded memory. When the range is exhausted it yields a final ``PositionMark(upto)`` if the
last transaction ended before ``upto``, so checkpoints can reach the run's upper bound.

Continuity (docs/architecture.md, "Continuity"): :meth:`Source.check_retention` raises a
:class:`~tidegate.errors.ChangesLostError` when the log no longer holds what a checkpoint
needs; :meth:`Source.restart_stream` makes the log readable again after an operator accepted
such a loss; :meth:`Source.translate` places a checkpoint of another server of
the same replication topology on this one (only where :attr:`Source.translates_positions`).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Any

from ..errors import CannotTranslateError
from ..events import ChangeEvent, ControlMessage, PositionMark
from ..positions import Position
from ..store.base import CheckpointStore
from ..store.records import CheckpointRecord
from .preflight import Problem

SourceItem = ChangeEvent | ControlMessage | PositionMark


class Source(abc.ABC):
    kind: str = ""
    # Whether a checkpoint taken on another server can be placed on this one by its GTID set
    # (MySQL/MariaDB with GTIDs); Postgres positions never survive a change of cluster/timeline.
    translates_positions: bool = False

    # ------------------------------------------------------------------ identity and positions

    @abc.abstractmethod
    def identity(self) -> dict[str, Any]:
        """What identifies the server (compared by the failover guard); its ``kind``, and the
        fields that make the lineage of the positions it writes."""

    @abc.abstractmethod
    def head(self) -> Position:
        """The current end of the change log: a run's upper bound."""

    @abc.abstractmethod
    def earliest(self) -> Position:
        """The earliest position the log can still be read from."""

    def log_sizes(self) -> dict[str, int] | None:
        """The size of each log segment still on the server, for lag arithmetic across
        segments (``Position.bytes_to``); None where positions need none (an LSN)."""
        return None

    # ------------------------------------------------------------------ reading

    @abc.abstractmethod
    def read(self, start: Position | None, upto: Position) -> Iterator[SourceItem]:
        """Changes committed in (start, upto], in source order."""

    def has_changes(self, start: Position | None, upto: Position) -> bool:
        """Whether (start, upto] holds anything to deliver (a row or a schema change). The head
        also moves for changes a pipeline does not carry (other tables, empty transactions, WAL
        housekeeping); a run then has nothing to deliver and need not start Spark. Default: read
        until the first such item."""
        return any(not isinstance(item, PositionMark) for item in self.read(start, upto))

    def slices(self, start: Position | None, upto: Position) -> list[tuple[Position | None, Position]]:
        """(start, upto] cut into ranges :meth:`read_slice` can read independently (in parallel
        Spark tasks); concatenated in order they equal :meth:`read`. Default: one slice."""
        return [(start, upto)]

    def read_slice(self, start: Position | None, end: Position, reader: int = 0) -> Iterator[SourceItem]:
        """Read one slice of :meth:`slices`; ``reader`` tells concurrent readers apart."""
        return self.read(start, end)

    # ------------------------------------------------------------------ continuity

    @abc.abstractmethod
    def check_retention(self, checkpoint: Position | None, *, first_run: bool) -> dict[str, Any]:
        """Whether the log still holds everything after ``checkpoint`` (the lowest sink
        checkpoint). Raises :class:`~tidegate.errors.ChangesLostError` (its ``kind`` names the
        incident) when it does not. On a pipeline's ``first_run`` a source may create what
        reading needs (the Postgres slot). Returns facts for the log."""

    @abc.abstractmethod
    def restart_stream(self) -> Position:
        """After an operator accepted lost changes: make the log readable again (Postgres:
        replace the slot) and return the position changes are delivered from, from now on."""

    def translate(self, checkpoint: Position) -> Position:
        """The position on this server where a checkpoint taken on another server of the same
        replication topology resumes, with nothing lost and nothing repeated. Raises
        :class:`~tidegate.errors.CannotTranslateError` (or another SourceError) when it cannot."""
        raise CannotTranslateError(f"a {self.kind} source cannot place a checkpoint of another server "
                                   f"on this one")

    def describe_change(self, old_identity: dict[str, Any]) -> str:
        """What changed behind the connection since ``old_identity``, in words an operator can
        act on."""
        return f"the source identity changed from {old_identity} to {self.identity()}"

    def release(self, position: Position) -> None:  # noqa: B027 - optional hook
        """Tell the server it may recycle the log up to ``position`` (Postgres slot advance)."""

    # ------------------------------------------------------------------ settings

    @abc.abstractmethod
    def preflight(self, checkpoint: CheckpointRecord | None = None) -> list[Problem]:
        """Settings, privileges and retention headroom against the oldest sink checkpoint (its
        position and when it was written), one :class:`Problem` per problem."""

    # ------------------------------------------------------------------ memory between runs

    def use_store(self, store: CheckpointStore) -> None:  # noqa: B027 - optional hook
        """The checkpoint store, for facts about its log a source keeps between runs (Postgres:
        the column set of each table as of a position). Given where a run reads (the runner's
        process); a source without it keeps those facts for one read only."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Must not raise."""
