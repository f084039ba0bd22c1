"""The Spark side of a snapshot: one Spark task per primary-key chunk, delivered in chunk order.

A Python Data Source (task_source.py) has one partition per chunk. Its task opens a
source connection of its own, reads the chunk (one short transaction, no lock:
``SnapshotReads.open_chunk``) and turns every row into its serialized envelope right there
(``snapshot.read_chunk``), so the executors do the data work: reading, converting and
serializing; the chunk's upper bound travels as the first row. The task hands Spark Arrow
record batches of one binary column, each value a pickled batch of rows in the one row format
every reader ships (shipped.py): Spark moves a few large values per chunk instead of converting
every row between Arrow and its own format twice, and the driver never parses an envelope again.

The remaining chunks are one DataFrame, planned once, with one partition per chunk. The driver
runs one Spark job per partition through a bounded window, as for the log's slices
(``windows.partitions_in_order``): ``snapshot.parallelism`` chunks are read at once and the coordinator
takes them in chunk order; when it takes chunk ``i``, chunk ``i + parallelism`` starts. The
driver holds at most ``parallelism + 1`` chunks (those being read and the one being delivered),
so its memory is bounded by chunks, not by the table.

Why a Python Data Source and not Spark's JDBC source: a row's values must have exactly the JSON
form the log path gives the same column (DECIMAL(65,30), unsigned BIGINT, BIT, SET, TIME beyond
24 h, time zones, PostgreSQL arrays and numerics), which the Python drivers and the log path's
own converters give and Spark's JDBC type mapping does not (DecimalType stops at 38 digits,
unsigned and BIT types are widened or lost); JDBC partitions split one numeric column, not a
composite key; and it would need the JDBC driver jars on every cluster. The data source reuses
the source's own reads, with one connection per task, and needs nothing beyond ``tidegate``.

Measured (benchmarks/snapshot.py, a 1M-row MariaDB table in 50k-row chunks, on this project's
2-vCPU machine shared with the database): one in-process reader 35-37k rows/s at about 28
CPU-us a row; two Spark tasks at once on ``local[2]`` 28-31k rows/s (0.79-0.88x) at 57-64
CPU-us a row. Neither the JVM's JIT nor the per-chunk planning nor the per-row Arrow
conversion explains the gap (each was removed in turn and the figures moved within the noise):
the two tasks run the same Python code as the one reader, each at about half its speed, beside
the database server on two vCPUs. The parallel read pays off where executors have cores of
their own.

What the tasks need (the spec, the source connection, the driver's, resolved by the run's parts,
the salt and the snapshot's record) travels pickled inside the data source's class
(task_source.py), never as an option string.
"""

from __future__ import annotations

import itertools
import logging
import pickle
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..connections import Connection
from ..events import ChangeEvent
from ..parts import fixed_connection
from ..reading import SegmentRead
from ..segments import Chunk
from ..shipped import item_to_row, row_to_item
from ..snapshot import read_chunk
from ..spec import PipelineSpec
from ..store.records import SnapshotRecord
from .task_source import register_task_source
from .windows import frames_in_order, is_connect, partitions_in_order

log = logging.getLogger(__name__)

# One Spark row per batch of events: a pickled list of shipped rows. Spark converts every row
# between Arrow and its own format twice on the way to the driver; with one row per event that
# conversion cost more CPU than reading the rows from the database.
ROW_SCHEMA = "batch BINARY"
BATCH_ROWS = 2000


def chunk_batches(payload: tuple, index: int) -> Iterator[Any]:
    """The Spark task of chunk ``index`` (of the payload's chunks): one chunk, read with a source
    connection of its own; the chunk's upper bound is its first row."""
    spec, connection, hash_salt, rec, numbers = payload
    source = fixed_connection(connection, hash_salt).source(spec)
    try:
        read = read_chunk(spec, source, rec, numbers[index])
        yield from arrow_batches(read.events, header=("upper", read.upper))
    finally:
        source.close()


def arrow_batches(events: Iterable[ChangeEvent], rows: int = BATCH_ROWS, header: tuple | None = None
                  ) -> Iterator[Any]:
    """Events as Arrow record batches of :data:`ROW_SCHEMA`, ``rows`` events to a Spark row
    (a task yielding Arrow is taken as it is; yielding tuples would convert every value).
    ``header``, if given, is the first row of the first batch (a chunk's upper bound)."""
    rows_of = map(item_to_row, events)
    return pack_batches(rows_of if header is None else itertools.chain([header], rows_of), rows)


def pack_batches(shipped: Iterable[tuple], rows: int = BATCH_ROWS) -> Iterator[Any]:
    """Shipped rows as Arrow record batches of :data:`ROW_SCHEMA`, ``rows`` to a Spark row."""
    import pyarrow as pa  # in the Spark task that packs; a driver importing this module needs none

    schema = pa.schema([("batch", pa.binary())])
    batch: list[tuple] = []
    for row in shipped:
        batch.append(row)
        if len(batch) >= rows:
            yield pa.RecordBatch.from_arrays([pa.array([_pack(batch)], pa.binary())], schema=schema)
            batch = []
    if batch:
        yield pa.RecordBatch.from_arrays([pa.array([_pack(batch)], pa.binary())], schema=schema)


def _pack(batch: list[tuple]) -> bytes:
    return pickle.dumps(batch, pickle.HIGHEST_PROTOCOL)


def unpack_rows(blobs: Iterable[bytes]) -> list[tuple]:
    """The rows of a chunk, from its batches in order."""
    rows: list[tuple] = []
    for blob in blobs:
        rows += pickle.loads(blob)
    return rows


def read_chunks(spark: Any, spec: PipelineSpec, connection: Connection, rec: SnapshotRecord,
                chunks: Sequence[Chunk], hash_salt: bytes | None = None) -> Iterator[SegmentRead]:
    """The chunks of one snapshot read by Spark tasks, at most ``snapshot.parallelism`` at once,
    handed over in chunk order. The chunks are one data frame, planned once (one partition per
    chunk); the driver runs one Spark job per partition in a window, as for the log's slices."""
    if not chunks:
        return
    window = max(1, min(spec.snapshot.parallelism, len(chunks)))
    log.info("pipeline %s: snapshot %s: %d chunk(s) as Spark tasks, %d at a time", spec.pipeline,
             rec.snapshot_id, len(chunks), window)
    name = f"tidegate-snapshot-{rec.snapshot_id}"
    numbers = [c.number for c in chunks]
    # What the tasks need travels inside the data source's pickled class (task_source.py).
    source = register_task_source(spark, (spec, connection, hash_salt, rec, numbers), chunk_batches,
                                  ROW_SCHEMA, len(chunks))
    if is_connect(spark):  # no RDDs: a data frame per chunk
        parts = frames_in_order(spark, lambda i: spark.read.format(source).option("index", str(i)).load(),
                                len(chunks), window, name)
        blobs_of: Any = lambda rows: rows  # noqa: E731 - the frames' rows are the blobs already
    else:  # one data frame, a partition per chunk
        frame = spark.read.format(source).load()
        parts = partitions_in_order(spark.sparkContext, frame.rdd, len(chunks), window, name)
        blobs_of = lambda rows: (r[0] for r in rows)  # noqa: E731
    for index, rows in parts:
        (_, upper), *events = unpack_rows(blobs_of(rows))  # the task's header comes first
        yield SegmentRead(chunks[index], map(row_to_item, events), upper)


__all__ = ["arrow_batches", "chunk_batches", "pack_batches", "read_chunks", "unpack_rows"]
