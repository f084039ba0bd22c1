"""The Spark side of a run: decode the range's slices in parallel Spark tasks, deliver in order.

The range (lowest sink checkpoint, upper bound] is cut into slices the source can read
independently (``Source.slices``: MySQL/MariaDB one per binlog file; Postgres one, the slot is
a single stream). Each slice is one partition of an RDD whose tasks read the slice, build every
envelope and serialize it (``ChangeEvent.value``, ``key_bytes``) where they run. The driver keeps
a window of partitions in flight, one Spark job per partition (``partitions_in_flight``, by
default the executors' cores), and consumes the finished ones strictly in slice order, so every
executor core decodes while the coordinator delivers, and the driver holds at most the window
plus the partition it is delivering. Delivery stays on the driver: it is ordered and
transactional.

Rows travel as flat tuples (shipped.py) through Spark's pickled Python RDD path: the JVM
carries them as opaque bytes and nothing parses an envelope again; ``value`` is the bytes the
task serialized, rebuilt on the driver as a :class:`~tidegate.shipped.ShippedEvent`.

A range of one slice (Postgres, or a MySQL range inside one binlog file) has nothing to decode
in parallel: the driver reads it, streaming, as ``tidegate run`` does (in a reader process of
its own, child_reader.py), instead of waiting for one task to decode the whole range and ship
it back in one piece.

What the tasks need travels inside the job, never through a worker's disk or argv: the spec
(parsed on the driver from the text spark-submit received) and the source connection (from the
driver's ``AIRFLOW_CONN_<ID>`` environment) reach the executors inside the task's pickled
closure, over Spark's own channel, and the code in the ``--py-files`` zip (docs/operations.md,
"Spark"). Each task logs one line to the executor's stderr saying where it imported ``tidegate``
from and which ``AIRFLOW_CONN_*``/``TIDEGATE_*`` variables its environment holds (none on a
cluster).
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .connections import Connection
from .events import ChangeEvent, PositionMark
from .positions import Position
from .run import RunContext
from .shipped import item_to_row, row_to_item
from .spec import PipelineSpec

log = logging.getLogger(__name__)

# Spark setting that overrides how many partitions are computed ahead of the one being delivered.
IN_FLIGHT_CONF = "spark.tidegate.partitionsInFlight"
# A Spark task's result reaches the driver whole (and must fit spark.driver.maxResultSize): a
# slice of more source log bytes than this is read by the driver instead. Serialized envelopes
# take several times the binlog bytes of their rows (about 6x for an 11-column table).
MAX_TASK_SLICE_BYTES = 16 * 1024 * 1024
MAX_SLICE_CONF = "spark.tidegate.maxTaskSliceBytes"


# --------------------------------------------------------------------------- the tasks


def slice_reader(spec: PipelineSpec, connection: Connection, slices: list[tuple[Position | None, Position]]
                 ) -> Callable[[int, Iterator[Any]], Iterator[tuple]]:
    """The function a Spark task runs for partition ``index``: read that slice and yield its rows.
    Its closure (the parsed spec, the source connection, the slice bounds) is all the executors
    receive; they read no file and no environment variable of their own."""

    def read_partition(index: int, _ignored: Iterator[Any]) -> Iterator[tuple]:
        from .parts import fixed_connection

        t0 = time.monotonic()
        source = fixed_connection(connection).source(spec)
        events = 0
        try:
            start, end = slices[index]
            for item in source.read_slice(start, end, index):
                if not isinstance(item, PositionMark):
                    events += 1
                yield item_to_row(item)
        finally:
            source.close()
        _executor_note(spec.pipeline, index, len(slices), events, time.monotonic() - t0)

    return read_partition


def _executor_note(pipeline: str, index: int, count: int, events: int, seconds: float) -> None:
    """One line in the executor's log: what the task read, where its code came from, and that
    its environment holds no connection and no tidegate setting (they travel inside the job)."""
    import tidegate

    found = sorted(k for k in os.environ if k.startswith(("AIRFLOW_CONN_", "TIDEGATE_")))
    code = os.path.abspath(os.path.dirname(tidegate.__file__))
    print(f"tidegate: pipeline {pipeline} slice {index + 1}/{count}: {events} events in {seconds:.2f}s "
          f"(pid {os.getpid()}); tidegate imported from {code}; "
          f"AIRFLOW_CONN_*/TIDEGATE_* in the environment: {', '.join(found) or 'none'}",
          file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the driver


def partitions_in_flight(spark: Any) -> int:
    """How many partitions are computed ahead of the one being delivered: the Spark setting
    :data:`IN_FLIGHT_CONF`, else the executors' cores (at least 2)."""
    sc = spark.sparkContext
    configured = sc.getConf().get(IN_FLIGHT_CONF)
    if configured:
        return max(1, int(configured))
    return max(2, int(sc.defaultParallelism))


def max_task_slice_bytes(spark: Any) -> int:
    """The largest slice (in source log bytes) a Spark task decodes: the Spark setting
    :data:`MAX_SLICE_CONF`, else :data:`MAX_TASK_SLICE_BYTES`."""
    configured = spark.sparkContext.getConf().get(MAX_SLICE_CONF)
    return int(configured) if configured else MAX_TASK_SLICE_BYTES


def read_range(spark: Any, spec: PipelineSpec, slices: list[tuple[Position | None, Position]],
               connection: Connection | None = None, window: int | None = None, *,
               local: frozenset[int] = frozenset(),
               read_local: Callable[[int], Iterator[ChangeEvent | PositionMark]] | None = None
               ) -> Iterator[ChangeEvent | PositionMark]:
    """The range's items in source order, each slice decoded by a Spark task, up to ``window``
    slices at once (default :func:`partitions_in_flight`). The slices whose index is in
    ``local`` are read on the driver instead, with ``read_local(index)``, in their turn."""
    if not slices:  # nothing in range
        return
    if connection is None:
        from .connections import get_connection

        connection = get_connection(spec.source.conn_id)
    window = window or partitions_in_flight(spark)
    sc = spark.sparkContext
    rdd = sc.parallelize(range(len(slices)), len(slices)).mapPartitionsWithIndex(
        slice_reader(spec, connection, slices))
    for index, rows in partitions_in_order(sc, rdd, len(slices), window, f"tidegate-{spec.pipeline}", local):
        if rows is None:
            yield from read_local(index)
            continue
        for row in rows:
            yield row_to_item(row)
        del rows


def partitions_in_order(sc: Any, rdd: Any, count: int, window: int, name: str,
              local: frozenset[int] = frozenset()) -> Iterator[tuple[int, list | None]]:
    """``(index, rows)`` of each partition, in partition order, computing up to ``window``
    partitions at once (one Spark job each, so a finished partition is handed over while later
    ones still run). A partition in ``local`` is not computed: it comes as ``(index, None)`` in
    its turn, for the caller to read, while the window keeps working. Stopping early cancels
    the jobs still running."""
    group = f"{name}-{uuid.uuid4().hex[:8]}"
    stopped = threading.Event()

    def job(index: int) -> list:
        if stopped.is_set():
            return []
        # Job properties are per thread: the group lets a stop cancel what is still running.
        sc.setJobGroup(group, f"{name}: slice {index + 1} of {count}", interruptOnCancel=True)
        return sc.runJob(rdd, lambda rows: rows, [index])

    queue: collections.deque[tuple[int, Future | None]] = collections.deque()
    following = in_flight = 0
    with ThreadPoolExecutor(max_workers=window, thread_name_prefix="tidegate-slice") as pool:

        def fill() -> None:
            nonlocal following, in_flight
            while following < count and in_flight < window:
                if following in local:
                    queue.append((following, None))
                else:
                    queue.append((following, pool.submit(job, following)))
                    in_flight += 1
                following += 1

        try:
            fill()
            while queue:
                index, fut = queue.popleft()
                rows = None
                if fut is not None:
                    rows = fut.result()
                    in_flight -= 1
                fill()
                yield index, rows
                del rows
        finally:
            if any(fut is not None for _, fut in queue):
                stopped.set()
                sc.cancelJobGroup(group)
                for _, fut in queue:
                    if fut is not None:
                        fut.cancel()


def deliver(spark: Any, run: RunContext) -> dict[str, Any]:
    """The Spark job's body: one bounded run whose range is decoded by Spark tasks."""
    from .child_reader import child_reader
    from .runner import run_pipeline
    from .store import default_url

    spec = run.spec
    connection = run.parts.connection(spec.source.conn_id)

    def spark_reader(source: Any, start: Position | None, bound: Position):
        limit = max_task_slice_bytes(spark)
        # Slices a little under the limit: the source cuts at transaction boundaries at or
        # past its target, so a slice holds the target plus at most one transaction.
        slices = source.slices(start, bound, max_bytes=limit * 3 // 4)
        # A task's result reaches the driver in one piece: a slice too large for that is read
        # by the driver, streaming (finer slices of a binlog file need the source's help).
        local = frozenset(i for i, (a, b) in enumerate(slices)
                          if a is not None and (a.bytes_to(b) or 0) > limit)
        if len(slices) - len(local) <= 1:
            why = ("one slice" if len(slices) <= 1 else
                   f"{len(slices)} slices, {len(local)} of them over {limit} bytes of log")
            log.info("pipeline %s: (%s, %s] is %s: the driver reads it, streaming", spec.pipeline, start,
                     bound, why)
            return child_reader(default_url())(source, start, bound)
        window = partitions_in_flight(spark)
        log.info("pipeline %s: reading (%s, %s] as %d slices, %d in Spark tasks (%d in flight), %d over "
                 "%d bytes on the driver", spec.pipeline, start, bound, len(slices), len(slices) - len(local),
                 window, len(local), limit)
        return read_range(spark, spec, slices, connection, window, local=local,
                          read_local=lambda i: source.read_slice(slices[i][0], slices[i][1], i))

    from .spark_snapshot import chunk_reader  # snapshots: one Spark task per chunk

    report = run_pipeline(run, reader=spark_reader, chunk_reader=chunk_reader(spark))
    report["driver_peak_rss_bytes"] = _peak_rss()
    report["driver_jvm_peak_rss_bytes"] = _peak_rss(os.getppid())
    return report


def _peak_rss(pid: int | None = None) -> int | None:
    """Peak resident memory of this process (the Python driver), or of process ``pid`` (its
    parent, the driver's JVM, in client mode) where /proc tells it."""
    try:
        if pid is None:
            import resource

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (ImportError, OSError, ValueError):
        pass
    return None
