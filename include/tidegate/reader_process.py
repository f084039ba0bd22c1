"""Reading a run's range in a process of its own, so decoding and delivery use two cores.

A run is CPU-bound Python on both sides of the read-ahead queue (coordinator.py): decoding the
log and building each envelope on one side, batching and handing bytes to the sink clients on
the other. Threads share one interpreter lock, so overlapping them in one process gains little.
:class:`ReaderProcess` is a :class:`~tidegate.reading.Reader` that reads the log's slices in a
spawned child process instead: the child builds the source from the spec and the connection it
was sent (never argv or a file), calls the same ``source.read``, serializes every envelope where
it is built and ships the items in packed batches (``shipped.pack``) through a pipe. A
snapshot's chunks are read in the run's process, as :class:`~tidegate.reading.InProcessReader`
does. The run's process rebuilds them as :class:`~tidegate.shipped.ShippedEvent` without
parsing anything again.

What the run sees does not change: the same items in the same order, the source's errors raised
again as themselves (a purged position is still a ``PositionPurgedError``). Memory stays
bounded: the child's sender thread holds at most :data:`SEND_AHEAD` batches and the pipe one,
so the child is at most about 5 MB ahead of what the run has taken. A run that stops early
(a failed sink, a schema-change halt) stops the child.
Small ranges are read in-process: a child costs a Python start-up (about 0.3 s). So is a source
whose decoding costs no more than shipping its items would (``SourceKind.reads_in_process``: a
pgoutput slot's compiled rows), and for a spec that says so up front
(``SourceKind.may_read_in_child``) no child is started early. A caller that
knows a range may come (``tidegate run``, before its guards) starts the child early with
:meth:`ReaderProcess.warm_up`: its interpreter start and imports then overlap the guards and
the bounds, and it waits for the range. The run hands its planned range over before it opens
its sinks (:meth:`ReaderProcess.ahead`), so the source decodes while the sinks open; unused,
:meth:`ReaderProcess.close` stops the child.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import logging
import multiprocessing
import os
import pickle
import queue
import sys
import threading
import traceback
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from .collector import fewer_collections
from .errors import SourceError, TidegateError
from .kinds import source_kind as kind_of
from .parts import fixed_connection
from .positions import Position
from .reading import InProcessReader
from .segments import Segment, Slice, log_runs
from .shipped import pack, unpack
from .sources.base import Source, SourceItem
from .store import open_store

log = logging.getLogger(__name__)

MIN_BYTES = 4 * 1024 * 1024  # ranges of fewer log bytes are read in-process
MIN_BYTES_ENV = "TIDEGATE_READER_PROCESS_MIN_BYTES"  # overrides MIN_BYTES (0: every range)
BATCH_ROWS = 1000  # items per message through the pipe
SEND_AHEAD = 4  # messages the child may have read ahead of the pipe (about 1 MB each)
PIPE_BYTES = 1 << 20
STOP_TIMEOUT_S = 5.0


class ReaderProcess(InProcessReader):
    """Reads each run of touching slices of at least ``min_bytes`` of log (default:
    ``$TIDEGATE_READER_PROCESS_MIN_BYTES``, else :data:`MIN_BYTES`), or of unknown size, in a
    child process. ``store_url``: the checkpoint store the child's source keeps its facts in
    (``Source.use_store``), the run's own store."""

    def __init__(self, store_url: str | None = None, *, min_bytes: int | None = None):
        self.store_url = store_url
        self.min_bytes = int(os.environ.get(MIN_BYTES_ENV) or MIN_BYTES) if min_bytes is None else min_bytes
        self._warm: _Child | None = None
        self._early: tuple[Slice, _Child] | None = None  # a range sent to a child by ahead()

    def warm_up(self, source_kind: str) -> None:
        """Start the child now, importing ``source_kind``'s source; the next range read in a
        child goes to it."""
        if self._warm is None:
            self._warm = _Child.start(source_kind)

    def ahead(self, source: Source, segments: Sequence[Segment]) -> None:
        """A plan that only reads the log, and enough of it for a child, goes to the child now:
        the source decodes (a PostgreSQL WAL sender, a binlog dump) while the run opens its
        sinks. :meth:`read_log` takes that read when the run asks for the same range; asked for
        another (the run planned again: a checkpoint moved back since the bounds), it stops it."""
        runs = log_runs(segments)
        if self._early is not None or len(runs) != 1 or not all(isinstance(s, Slice) for s in segments) \
                or not self._in_child(source, runs[0]):
            return
        child, self._warm = self._warm, None
        self._early = (runs[0], _start_read(source, runs[0].start, runs[0].end, self.store_url, child))

    def read_log(self, source: Source, run: Slice) -> Iterable[SourceItem]:
        early, self._early = self._early, None
        if early is not None:
            if early[0] == run:
                return _items(source, early[1], run.start, run.end)
            # Closing its pipes stops the child at its next send, through the source's own
            # clean-up: a PostgreSQL child lets go of the slot, which the read below needs.
            early[1].stop(terminate=False)
        if not self._in_child(source, run):
            return source.read(run.start, run.end)
        child, self._warm = self._warm, None
        return read_in_child(source, run.start, run.end, self.store_url, child)

    def _in_child(self, source: Source, run: Slice) -> bool:
        if kind_of(source.kind).light_reads(source):
            return False
        size = _log_bytes(source, run.start, run.end)
        return size is None or size >= self.min_bytes

    def close(self) -> None:
        """Stop a child no read went to: warmed up, or started ahead on a range never taken."""
        child, self._warm = self._warm, None
        early, self._early = self._early, None
        for c in (child, early[1] if early is not None else None):
            if c is not None:
                c.stop(terminate=True)

    def __enter__(self) -> ReaderProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _log_bytes(source: Source, start: Position | None, upto: Position) -> int | None:
    if start is None:
        return None
    try:
        return start.bytes_to(upto, source.log_sizes())
    except (TypeError, AttributeError):  # positions of another kind (a snapshot's): unknown
        return None


class _Child:
    """A spawned reader process: the job goes down one pipe, the rows come back up another."""

    def __init__(self, process: Any, jobs: Any, rows: Any):
        self.process, self.jobs, self.rows = process, jobs, rows

    @classmethod
    def start(cls, source_kind: str | None = None) -> _Child:
        ctx = multiprocessing.get_context("spawn")  # a fork would copy the sink clients' threads
        rows_in, rows_out = ctx.Pipe(duplex=False)
        _widen(rows_in)
        jobs_in, jobs_out = ctx.Pipe(duplex=False)
        process = ctx.Process(target=_child_main, name="tidegate-read", daemon=True,
                              args=(source_kind, jobs_in, rows_out))
        process.start()
        rows_out.close()  # the child holds the only writing end: its exit shows as EOF here
        jobs_in.close()
        return cls(process, jobs_out, rows_in)

    def stop(self, *, terminate: bool) -> None:
        """Close the pipes and wait for the child (up to :data:`STOP_TIMEOUT_S`), which ends at
        its next send; or, ``terminate``, terminate it first (the run stopped reading: the rest
        of the range is not needed)."""
        self.jobs.close()
        self.rows.close()
        if terminate and self.process.is_alive():
            self.process.terminate()
        self.process.join(STOP_TIMEOUT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def _widen(pipe: Any) -> None:
    """A 1 MiB pipe (Linux; the most an unprivileged process may set): a message then usually
    goes through in one read, and the run's process, whose threads share one interpreter lock,
    takes the lock once per message rather than once per 64 KiB."""
    with contextlib.suppress(AttributeError, OSError):  # another system, a lower limit: the default
        fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)


def read_in_child(source: Source, start: Position | None, upto: Position,
                  store_url: str | None = None, child: _Child | None = None) -> Iterator[SourceItem]:
    """``source.read(start, upto)``, read by a spawned child process (``child``, when one was
    started ahead)."""
    yield from _items(source, _start_read(source, start, upto, store_url, child), start, upto)


def _start_read(source: Source, start: Position | None, upto: Position, store_url: str | None,
                child: _Child | None) -> _Child:
    """Send the read of (start, upto] to ``child`` (or a new one)."""
    child = child or _Child.start()
    job = (source.spec, source.conn, source.hash_salt, source.lease_epoch, start, upto, store_url)
    try:
        child.jobs.send_bytes(pickle.dumps(job, pickle.HIGHEST_PROTOCOL))
    except OSError:
        pass  # the child is gone: the read says so
    log.info("pipeline %s: reading (%s, %s] in process %d", source.spec.pipeline, start, upto,
             child.process.pid)
    return child


def _items(source: Source, child: _Child, start: Position | None, upto: Position) -> Iterator[SourceItem]:
    """The items ``child`` reads of (start, upto]; the child is stopped when they end or the
    caller stops taking them."""
    finished = False
    try:
        while True:
            try:
                message = _receive(child.rows)
            except EOFError:
                child.process.join(STOP_TIMEOUT_S)
                raise SourceError(f"the reader process of pipeline {source.spec.pipeline!r} ended (exit "
                                  f"code {child.process.exitcode}) before the end of ({start}, {upto}]; "
                                  "its log says why (killed for memory?)") from None
            kind = message[0]
            if kind in ("packed", "rows"):
                yield from unpack(message)
            elif kind == "error":
                raise message[1]
            else:  # "end"
                finished = True
                return
    finally:
        child.stop(terminate=not finished)


def _child_main(source_kind: str | None, jobs: Any, send: Any) -> None:
    """The child's body: import the source kind, wait for the job, read the range, ship it in
    batches, then ``end`` (or the error)."""
    store = None
    sender = _Sender(send)
    try:
        if source_kind:  # the Source class's module ("module:Class"), while the run opens its sinks
            importlib.import_module(kind_of(source_kind).source.partition(":")[0])
        try:
            spec, connection, hash_salt, epoch, start, upto, store_url = pickle.loads(jobs.recv_bytes())
        except EOFError:
            return  # warmed up, then not needed
        finally:
            jobs.close()
        source = fixed_connection(connection, hash_salt).source(spec)
        if epoch is not None:
            source.use_lease(epoch)  # the run's lease: its sessions are named for it
        try:
            if store_url:
                store = open_store(store_url)
                source.use_store(store)
            batch: list[Any] = []
            with fewer_collections():
                for item in source.read(start, upto):
                    batch.append(item)
                    if len(batch) >= BATCH_ROWS:
                        sender.put(_parts(pack(batch)))
                        batch = []
            if batch:
                sender.put(_parts(pack(batch)))
        finally:
            source.close()
            if store is not None:
                store.close()
        sender.put(_parts(("end", None)))
    except (BrokenPipeError, KeyboardInterrupt):
        pass  # the run stopped reading
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the run, as itself
        with contextlib.suppress(OSError):
            sender.put([_error_message(exc)])
    finally:
        sender.close()
        send.close()


def _parts(message: tuple) -> list[bytes]:
    """``message`` as what goes down the pipe: pickled, except a packed batch's bytes, which
    follow the pickled rest as they are (pickle would copy them into its output: 0.5 us per
    event)."""
    if message[0] == "packed":
        _, blob, *rest = message
        return [pickle.dumps(("packed", *rest), pickle.HIGHEST_PROTOCOL), blob]
    return [pickle.dumps(message, pickle.HIGHEST_PROTOCOL)]


def _receive(conn: Any) -> tuple:
    """The next message :func:`_parts` sent."""
    message = pickle.loads(conn.recv_bytes())
    if message[0] == "packed":
        return ("packed", conn.recv_bytes(), *message[1:])
    return message


class _Sender:
    """Sends the child's messages from a thread of its own, so decoding goes on while the run's
    process is not reading: its threads share one interpreter lock, and while one produces to
    the sinks the pipe drains in bursts. At most :data:`SEND_AHEAD` messages wait here."""

    def __init__(self, conn: Any):
        self.conn = conn
        self.queue: queue.Queue = queue.Queue(maxsize=SEND_AHEAD)
        self.failed: OSError | None = None
        self.thread = threading.Thread(target=self._send, name="tidegate-read-send", daemon=True)
        self.thread.start()

    def put(self, message: list[bytes]) -> None:
        """Queue ``message`` (its parts, sent one after the other); the pipe's error
        (BrokenPipeError: the run stopped reading) once a send failed."""
        if self.failed is not None:
            raise self.failed
        self.queue.put(message)

    def _send(self) -> None:
        while (message := self.queue.get()) is not None:
            if self.failed is None:  # after a failure, the rest is taken and dropped: put never blocks
                try:
                    for part in message:
                        self.conn.send_bytes(part)
                except OSError as exc:
                    self.failed = exc

    def close(self) -> None:
        """Send what is queued, then stop the thread."""
        self.queue.put(None)
        self.thread.join()


def _error_message(exc: BaseException) -> bytes:
    if not isinstance(exc, TidegateError):  # unexpected: its traceback goes to the task's log
        traceback.print_exception(exc, file=sys.stderr)
    try:
        data = pickle.dumps(("error", exc))
        pickle.loads(data)  # an exception whose class cannot be rebuilt travels as text
        return data
    except Exception:  # noqa: BLE001
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return pickle.dumps(("error", SourceError(f"reading in a child process failed: {text}")))


__all__ = ["MIN_BYTES", "MIN_BYTES_ENV", "ReaderProcess", "read_in_child"]
