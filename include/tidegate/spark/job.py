"""The Spark job's body: one bounded run whose read plan is read by Spark tasks.

A spark-submit driver submits the run's job as a Connect client does (delivery.py: one task
delivers, a task per parallel part reads it), and waits. Here is the other shape, for a run with
a sink that writes through Spark itself (a Delta sink, whose writes are jobs a task cannot
start) or under ``spark.tidegate.delivery: client``: the driver delivers.
:class:`SparkReader` is the run's :class:`~tidegate.reading.Reader` in a Spark driver: a
snapshot's chunks are read by Spark tasks (chunks.py), the log's slices too (slices.py), each a
few at once and handed over in plan order; a slice too large for one task's result, and a log
of one slice (nothing to decode in parallel), are read on the driver, streaming, in a reader
process (reader_process.py). In this shape delivery stays on the driver: it is ordered and
transactional.
"""

from __future__ import annotations

import logging
import os
import resource
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..reader_process import ReaderProcess
from ..reading import SegmentRead
from ..runner import run_pipeline
from ..segments import Chunk, Slice, SnapshotEnd, log_runs
from ..snapshot import snapshot_record
from ..store import default_url
from .chunks import read_chunks
from .delivery import deliver_on_executor, on_executor
from .session import LazySession
from .slices import max_task_slice_bytes, read_range
from .windows import partitions_in_flight

if TYPE_CHECKING:
    from ..run import PlannedRun, RunContext
    from ..sources.base import Source
    from ..spec import PipelineSpec

log = logging.getLogger(__name__)


class SparkReader:
    """Reads a run's segments in Spark tasks (see the module docstring)."""

    def __init__(self, spark: Any, connection: Any, store_url: str | None = None):
        # ``spark``: a session, or a :class:`~.session.LazySession` (opened when a Spark task is
        # first needed: a log of one slice needs none).
        self._spark, self.connection = spark, connection
        self.streaming = ReaderProcess(store_url)  # what the driver reads itself

    @property
    def spark(self) -> Any:
        return self._spark.get() if isinstance(self._spark, LazySession) else self._spark

    def __call__(self, run: RunContext, source: Source, segments: Sequence[Any]) -> Iterator[SegmentRead]:
        spec, chunks = run.spec, [s for s in segments if isinstance(s, Chunk)]
        for snapshot_id in dict.fromkeys(c.snapshot_id for c in chunks):
            rec = snapshot_record(run.store, spec.pipeline, snapshot_id)
            mine = [c for c in chunks if c.snapshot_id == snapshot_id]
            yield from read_chunks(self.spark, spec, self.connection, rec, mine, source.hash_salt)
        yield from (SegmentRead(s, ()) for s in segments if isinstance(s, SnapshotEnd))
        slices = [s for s in segments if isinstance(s, Slice)]
        if slices:
            yield from self.read_log(spec, source, slices)

    def ahead(self, source: Source, segments: Sequence[Any]) -> None:
        """A plan of one slice is read on the driver (:meth:`read_log`): its reader process may
        start on it while the sinks open."""
        if len(segments) == 1:
            self.streaming.ahead(source, segments)

    def close(self) -> None:
        """Stop a reader process that :meth:`ahead` started and the run never read."""
        self.streaming.close()

    def read_log(self, spec: PipelineSpec, source: Source, slices: list[Slice]) -> Iterator[SegmentRead]:
        # A task's result reaches the driver in one piece: a slice too large for that is read
        # by the driver, streaming (finer slices of a binlog file need the source's help).
        limit = max_task_slice_bytes(self.spark) if len(slices) > 1 else 0
        local = frozenset(i for i, s in enumerate(slices)
                          if s.start is not None and (s.start.bytes_to(s.end) or 0) > limit)
        first, last = slices[0], slices[-1]
        if len(slices) - len(local) <= 1:
            why = ("one slice" if len(slices) <= 1 else
                   f"{len(slices)} slices, {len(local)} of them over {limit} bytes of log")
            log.info("pipeline %s: (%s, %s] is %s: the driver reads it, streaming", spec.pipeline,
                     first.start, last.end, why)
            for run in log_runs(slices):
                yield SegmentRead(run, self.streaming.read_log(source, run))
            return
        window = partitions_in_flight(self.spark)
        log.info("pipeline %s: reading (%s, %s] as %d slices, %d in Spark tasks (%d in flight), %d over "
                 "%d bytes on the driver", spec.pipeline, first.start, last.end, len(slices),
                 len(slices) - len(local), window, len(local), limit)
        bounds = [(s.start, s.end) for s in slices]
        items = read_range(self.spark, spec, bounds, self.connection, window, local=local,
                           read_local=lambda i: source.read_slice(bounds[i][0], bounds[i][1], i),
                           hash_salt=source.hash_salt)
        yield SegmentRead(Slice(first.start, last.end), items)


def deliver(spark: Any, run: PlannedRun) -> dict[str, Any]:
    """One bounded run as one Spark job whose task delivers, as through a Connect server
    (delivery.py); where delivery.on_executor says no (a Delta sink,
    ``spark.tidegate.delivery: client``), delivered here, its segments read by Spark
    tasks. Returns the run report."""
    if on_executor(run, run.spec.spark.conf):
        return deliver_on_executor(spark, run, default_url())
    return deliver_here(spark, run)


def deliver_here(spark: Any, run: PlannedRun) -> dict[str, Any]:
    """The run delivered by this driver, its segments read by Spark tasks."""
    reader = SparkReader(spark, run.parts.connection(run.spec.source.conn_id), default_url())
    # What the run costs the driver's side, its start-up left out (benchmarks/cluster.py): with
    # executors on cores of their own, the driver's delivery is what bounds a run.
    t0, cpu0, jvm0 = time.monotonic(), cpu_seconds(), cpu_seconds(os.getppid())
    try:
        report = run_pipeline(run, reader=reader)
    finally:
        reader.close()
    report["driver_run_seconds"] = round(time.monotonic() - t0, 3)
    report["driver_peak_rss_bytes"] = _peak_rss()
    report["driver_jvm_peak_rss_bytes"] = _peak_rss(os.getppid())
    report["driver_cpu_seconds"] = _spent(cpu0, cpu_seconds())
    report["driver_jvm_cpu_seconds"] = _spent(jvm0, cpu_seconds(os.getppid()))
    return report


def _spent(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else round(after - before, 2)


def cpu_seconds(pid: int | None = None) -> float | None:
    """CPU seconds (user + system) this process, or process ``pid`` (the driver's JVM, its
    parent in client mode), has used so far, where /proc tells it."""
    if pid is None:
        t = os.times()
        return round(t.user + t.system, 2)
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)
    except (OSError, ValueError, IndexError):
        return None


def _peak_rss(pid: int | None = None) -> int | None:
    """Peak resident memory of this process (the Python driver), or of process ``pid`` (its
    parent, the driver's JVM, in client mode) where /proc tells it."""
    try:
        if pid is None:
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (ImportError, OSError, ValueError):
        pass
    return None


__all__ = ["SparkReader", "cpu_seconds", "deliver"]
