"""The Spark side of a run: decode the range's slices in parallel Spark tasks, deliver in order.

The range (lowest sink checkpoint, upper bound] is cut into slices the source can read
independently (``Source.slices``: MySQL/MariaDB one per binlog file; Postgres one, the slot is
a single stream). Each slice is one partition of an RDD whose tasks read the slice, build every
envelope and serialize it (``ChangeEvent.value``, ``key_bytes``) where they run. The driver keeps
a window of partitions in flight (windows.py) and consumes the finished ones strictly in slice
order. This is the shape where the driver delivers (job.py: a run with a Delta sink, or under
``spark.tidegate.delivery: client``); every other run is delivered by one Spark task
(delivery.py).

Rows travel as flat tuples (shipped.py) through Spark's pickled Python RDD path: the JVM
carries them as opaque bytes and nothing parses an envelope again; ``value`` is the bytes the
task serialized, rebuilt on the driver as a :class:`~tidegate.shipped.ShippedEvent`.

A range of one slice (Postgres, or a MySQL range inside one binlog file) has nothing to decode
in parallel: the driver reads it, streaming, as ``tidegate run`` does (in a reader process of
its own, reader_process.py), instead of waiting for one task to decode the whole range and ship
it back in one piece.

What the tasks need travels inside the job, never through a worker's disk or argv: the spec
(parsed on the driver from the run's record) and the source connection (from the
driver's ``AIRFLOW_CONN_<ID>`` environment) reach the executors inside the task's pickled
closure, over Spark's own channel, and the code in the ``--py-files`` zip (docs/operations.md,
"Spark"). Each task ends its rows with a note, which the driver logs (and the task prints to the
executor's stderr): what it read, where it imported ``tidegate`` from and which
``AIRFLOW_CONN_*``/``TIDEGATE_*`` variables its environment holds (none on a cluster). The note
travels with the rows because an executor's own log may lose its last lines when the
application ends.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import tidegate

from ..connections import Connection, get_connection
from ..events import ChangeEvent, PositionMark
from ..parts import fixed_connection
from ..positions import Position
from ..reading import MAX_SLICE_CONF, MAX_TASK_SLICE_BYTES
from ..shipped import item_to_row, row_to_item
from ..spec import PipelineSpec
from .chunks import ROW_SCHEMA, pack_batches, unpack_rows
from .task_source import register_task_source
from .windows import frames_in_order, is_connect, partitions_in_flight, partitions_in_order

log = logging.getLogger(__name__)

# A Spark task's result reaches the driver whole (and must fit spark.driver.maxResultSize): a
# slice of more source log bytes than MAX_TASK_SLICE_BYTES (reading.py, which cuts the plan's
# slices under it) is read by the driver instead. Serialized envelopes take several times the
# binlog bytes of their rows (about 6x for an 11-column table).
NOTE = "note"  # the kind of a task's last row: its note, logged by the driver


# --------------------------------------------------------------------------- the tasks


def slice_task(spec: PipelineSpec, connection: Connection, slices: list[tuple[Position | None, Position]],
               hash_salt: bytes | None = None) -> Callable[[int, Iterator[Any]], Iterator[tuple]]:
    """The function a Spark task runs for partition ``index``: read that slice and yield its rows,
    then its note. Its closure (the parsed spec, the source connection and the salt of hashed
    columns, the slice bounds) is all the executors receive; they read no file and no environment
    variable of their own."""

    def read_partition(index: int, _ignored: Iterator[Any]) -> Iterator[tuple]:
        t0 = time.monotonic()
        source = fixed_connection(connection, hash_salt).source(spec)
        events = 0
        try:
            start, end = slices[index]
            for item in source.read_slice(start, end, index):
                if not isinstance(item, PositionMark):
                    events += 1
                yield item_to_row(item)
        finally:
            source.close()
        yield (NOTE, executor_note(spec.pipeline, index, len(slices), events, time.monotonic() - t0))

    return read_partition


def executor_note(pipeline: str, index: int, count: int, events: int, seconds: float) -> str:
    """What the task read, where its code came from, and that its environment holds no
    connection and no tidegate setting (they travel inside the job); also printed to the
    executor's stderr."""
    found = sorted(k for k in os.environ if k.startswith(("AIRFLOW_CONN_", "TIDEGATE_")))
    code = os.path.abspath(os.path.dirname(tidegate.__file__))
    note = (f"tidegate: pipeline {pipeline} slice {index + 1}/{count}: {events} events in {seconds:.2f}s "
            f"(pid {os.getpid()}); tidegate imported from {code}; "
            f"AIRFLOW_CONN_*/TIDEGATE_* in the environment: {', '.join(found) or 'none'}")
    print(note, file=sys.stderr, flush=True)
    return note


def slice_batches(task: Callable[[int, Iterator[Any]], Iterator[tuple]], index: int) -> Iterator[Any]:
    """A slice task's rows as Arrow record batches of pickled rows (chunks.py), for a data
    source: how a Spark Connect session reads a slice."""
    return pack_batches(task(index, iter(())))


# --------------------------------------------------------------------------- the driver


def max_task_slice_bytes(spark: Any) -> int:
    """The largest slice (in source log bytes) a Spark task decodes: the Spark setting
    :data:`MAX_SLICE_CONF`, else :data:`MAX_TASK_SLICE_BYTES`."""
    if is_connect(spark):
        configured = spark.conf.get(MAX_SLICE_CONF, None)
    else:
        configured = spark.sparkContext.getConf().get(MAX_SLICE_CONF)
    return int(configured) if configured else MAX_TASK_SLICE_BYTES


def read_range(spark: Any, spec: PipelineSpec, slices: list[tuple[Position | None, Position]],
               connection: Connection | None = None, window: int | None = None, *,
               local: frozenset[int] = frozenset(),
               read_local: Callable[[int], Iterator[ChangeEvent | PositionMark]] | None = None,
               hash_salt: bytes | None = None) -> Iterator[ChangeEvent | PositionMark]:
    """The range's items in source order, each slice decoded by a Spark task, up to ``window``
    slices at once (default :func:`~.windows.partitions_in_flight`). The slices whose index is
    in ``local`` are read on the driver instead, with ``read_local(index)``, in their turn."""
    if not slices:  # nothing in range
        return
    if connection is None:
        connection = get_connection(spec.source.conn_id)
    window = window or partitions_in_flight(spark)
    task = slice_task(spec, connection, slices, hash_salt)
    name = f"tidegate-{spec.pipeline}"
    if is_connect(spark):  # no RDDs: each slice is a data frame of a data source (connect.py)
        source = register_task_source(spark, task, slice_batches, ROW_SCHEMA)
        frames = frames_in_order(spark, lambda i: spark.read.format(source).option("index", str(i)).load(),
                                 len(slices), window, name, local)
        parts: Iterator[tuple[int, list | None]] = (
            (i, None if blobs is None else unpack_rows(blobs)) for i, blobs in frames)
    else:
        sc = spark.sparkContext
        rdd = sc.parallelize(range(len(slices)), len(slices)).mapPartitionsWithIndex(task)
        parts = partitions_in_order(sc, rdd, len(slices), window, name, local)
    for index, rows in parts:
        if rows is None:
            yield from read_local(index)
            continue
        *items, (_, note) = rows  # the task's note comes last
        log.info("%s", note)
        del rows
        for row in items:
            yield row_to_item(row)
        del items


__all__ = ["MAX_SLICE_CONF", "MAX_TASK_SLICE_BYTES", "max_task_slice_bytes", "read_range", "slice_batches",
           "slice_task"]
