"""A source transaction too large for memory, kept on local disk while a run delivers it.

A sub-batch never splits a source transaction (``respect_source_tx: true``), so a transaction
with more rows than ``batch.max_events`` or more bytes than ``batch.max_bytes`` is one sub-batch
on its own. Held as a tuple, a 5M-row migration UPDATE would need several GiB. Once a
transaction passes either limit, its rows go to a :class:`SpilledEvents`: an unlinked temporary
file of pickled frames, read back frame by frame by each sink (each reader has its own offsets,
so sinks delivering concurrently and a retried delivery all read it again from the start).
Memory then holds one frame per reader; the file goes when the sub-batch does (and the system
drops it when the process dies: it has no name).

The directory is ``TIDEGATE_SPILL_DIR``, else the system's temporary directory. A spilled
transaction needs about its own size in bytes there.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections import Counter
from collections.abc import Iterator
from typing import Any

from .errors import RunError, TidegateError
from .events import is_control

FRAME_EVENTS = 2000  # events per pickled frame: one frame is what a reader holds at a time


def spill_dir() -> str | None:
    return os.environ.get("TIDEGATE_SPILL_DIR") or None


class SpilledEvents:
    """An append-only sequence of events on disk. ``len``, iteration, ``byte_size`` (the sum
    of the events' ``value`` lengths) and ``table_counts`` (row events per (db, schema, table),
    counted on the way in) answer without reading the file back."""

    def __init__(self, events: list[Any]) -> None:
        where = spill_dir()
        try:
            self._file = tempfile.TemporaryFile(prefix="tidegate-tx-", dir=where)  # noqa: SIM115 - owned
        except OSError as exc:
            raise RunError(f"a source transaction past the sub-batch limits is kept on local disk, but no "
                           f"file can be made in {where or tempfile.gettempdir()!r} ({exc.strerror}): set "
                           f"TIDEGATE_SPILL_DIR to a writable directory with room for about 0.75 KB "
                           f"per change of the transaction") from None
        self._frames: list[tuple[int, int]] = []  # (offset, length) of each pickled frame
        self._end = 0
        self._pending: list[Any] = []
        self._count = 0
        self.byte_size = 0
        self.table_counts: Counter = Counter()
        for event in events:
            self.append(event)

    def append(self, event: Any) -> None:
        self._pending.append(event)
        self._count += 1
        self.byte_size += len(event.value)  # serialized once and kept: no second serialization
        if not is_control(event):
            self.table_counts[(event.db, event.schema, event.table)] += 1
        if len(self._pending) >= FRAME_EVENTS:
            self._write_frame()

    def _write_frame(self) -> None:
        data = pickle.dumps(self._pending, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            os.pwrite(self._file.fileno(), data, self._end)
        except OSError as exc:  # a full disk, say: a later attempt may find room
            raise TidegateError(f"writing a source transaction past the sub-batch limits to local disk "
                                f"({self._count} changes, {self._end + len(data)} bytes so far) in "
                                f"{spill_dir() or tempfile.gettempdir()!r} failed: {exc.strerror}; give "
                                f"TIDEGATE_SPILL_DIR room for about 0.75 KB per change") from None
        self._frames.append((self._end, len(data)))
        self._end += len(data)
        self._pending = []

    def seal(self) -> SpilledEvents:
        """Write what is pending: the sequence is complete and may be read."""
        if self._pending:
            self._write_frame()
        return self

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __iter__(self) -> Iterator[Any]:
        for frame in self.frames():
            yield from frame

    def frames(self) -> Iterator[list[Any]]:
        """The events in frames of up to :data:`FRAME_EVENTS`, each read when it is asked for."""
        if self._pending:
            raise RuntimeError("a spilled transaction is read before it is sealed")
        fd = self._file.fileno()
        for offset, length in self._frames:
            yield pickle.loads(os.pread(fd, length, offset))  # noqa: S301 - our own file, this process

    def __del__(self) -> None:
        try:
            self._file.close()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown
            pass

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"SpilledEvents({self._count} events, {self._end} bytes on disk)"
