"""Spark jobs in a window: a run's partitions (log slices, snapshot chunks) computed a few at
once, one Spark job each, and handed to the driver strictly in partition order, so every
executor core decodes while the coordinator delivers, and the driver holds at most the window
plus the partition it is delivering."""

from __future__ import annotations

import collections
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

# Spark setting that overrides how many partitions are computed ahead of the one being delivered.
IN_FLIGHT_CONF = "spark.tidegate.partitionsInFlight"


def partitions_in_flight(spark: Any) -> int:
    """How many partitions are computed ahead of the one being delivered: the Spark setting
    :data:`IN_FLIGHT_CONF`, else the executors' cores (at least 2)."""
    sc = spark.sparkContext
    configured = sc.getConf().get(IN_FLIGHT_CONF)
    if configured:
        return max(1, int(configured))
    return max(2, int(sc.defaultParallelism))


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


__all__ = ["IN_FLIGHT_CONF", "partitions_in_flight", "partitions_in_order"]
