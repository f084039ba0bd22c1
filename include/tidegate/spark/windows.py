"""Spark jobs in a window: a run's partitions (log slices, snapshot chunks) computed a few at
once, one Spark job each, and handed to the driver strictly in partition order, so every
executor core decodes while the coordinator delivers, and the driver holds at most the window
plus the partition it is delivering."""

from __future__ import annotations

import collections
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

# Spark setting that overrides how many partitions are computed ahead of the one being delivered.
IN_FLIGHT_CONF = "spark.tidegate.partitionsInFlight"


def partitions_in_flight(spark: Any) -> int:
    """How many partitions are computed ahead of the one being delivered: the Spark setting
    :data:`IN_FLIGHT_CONF`, else the executors' cores (at least 2)."""
    if is_connect(spark):
        # A Connect client cannot ask the server's parallelism: the session's setting, else 2.
        return max(1, int(spark.conf.get(IN_FLIGHT_CONF, None) or 2))
    sc = spark.sparkContext
    configured = sc.getConf().get(IN_FLIGHT_CONF)
    if configured:
        return max(1, int(configured))
    return max(2, int(sc.defaultParallelism))


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect client session (no SparkContext, no RDDs)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def partitions_in_order(sc: Any, rdd: Any, count: int, window: int, name: str,
              local: frozenset[int] = frozenset()) -> Iterator[tuple[int, list | None]]:
    """``(index, rows)`` of each partition, in partition order, computing up to ``window``
    partitions at once (one Spark job each, so a finished partition is handed over while later
    ones still run). A partition in ``local`` is not computed: it comes as ``(index, None)`` in
    its turn, for the caller to read, while the window keeps working. Stopping early cancels
    the jobs still running."""
    group = f"{name}-{uuid.uuid4().hex[:8]}"

    def job(index: int) -> list:
        # Job properties are per thread: the group lets a stop cancel what is still running.
        sc.setJobGroup(group, f"{name}: slice {index + 1} of {count}", interruptOnCancel=True)
        return sc.runJob(rdd, lambda rows: rows, [index])

    yield from in_order(job, lambda: sc.cancelJobGroup(group), count, window, local)


def frames_in_order(spark: Any, frame_of: Callable[[int], Any], count: int, window: int, name: str,
                    local: frozenset[int] = frozenset()) -> Iterator[tuple[int, list | None]]:
    """:func:`partitions_in_order` for a Spark Connect session, which has no RDDs: partition
    ``index`` is the data frame ``frame_of(index)`` (one partition), collected in a thread of its
    own; its rows are the values of the frame's first column. The operations carry a tag that
    a stop interrupts."""
    tag = f"{name}-{uuid.uuid4().hex[:8]}"

    def job(index: int) -> list:
        spark.addTag(tag)  # per thread in a Connect session
        try:
            return [r[0] for r in frame_of(index).collect()]
        finally:
            spark.removeTag(tag)

    yield from in_order(job, lambda: spark.interruptTag(tag), count, window, local)


def in_order(job: Callable[[int], list], cancel: Callable[[], Any], count: int, window: int,
             local: frozenset[int] = frozenset()) -> Iterator[tuple[int, list | None]]:
    """``(index, job(index))`` in index order, up to ``window`` jobs running at once in threads;
    an index in ``local`` comes as ``(index, None)`` in its turn. Stopping early calls
    ``cancel()`` for the jobs still running."""
    stopped = threading.Event()

    def guarded(index: int) -> list:
        return [] if stopped.is_set() else job(index)

    queue: collections.deque[tuple[int, Future | None]] = collections.deque()
    following = in_flight = 0
    with ThreadPoolExecutor(max_workers=window, thread_name_prefix="tidegate-slice") as pool:

        def fill() -> None:
            nonlocal following, in_flight
            while following < count and in_flight < window:
                if following in local:
                    queue.append((following, None))
                else:
                    queue.append((following, pool.submit(guarded, following)))
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
                cancel()
                for _, fut in queue:
                    if fut is not None:
                        fut.cancel()


__all__ = ["IN_FLIGHT_CONF", "frames_in_order", "in_order", "partitions_in_flight", "partitions_in_order"]
