"""The Spark side of a snapshot: one Spark task per primary-key chunk, delivered in chunk order.

A Python Data Source (``tidegate_snapshot``) has one partition per chunk. Its task opens a
source connection of its own, reads the chunk (one short transaction, no lock:
``Source.open_chunk``) and turns every row into its serialized envelope right there
(``snapshots.read_chunk``), so the executors do the data work: reading, converting and
serializing; the chunk's upper bound travels as the first row. The task hands Spark Arrow
record batches of one binary column, each value a
pickled batch of rows (envelope bytes, message key, ``event_id``, snapshot mark): Spark moves a
few large values per chunk instead of converting every row between Arrow and its own format
twice, and the driver never parses an envelope again.

The remaining chunks are one DataFrame, planned once, with one partition per chunk. The driver
runs one Spark job per partition through a bounded window, as for the log's slices
(``spark_job.partitions_in_order``): ``snapshot.parallelism`` chunks are read at once and the coordinator
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

What the tasks need travels as for the log read (spark_job.py): the spec's YAML as an option,
and the source connection resolved where the reader is planned (the driver's
``AIRFLOW_CONN_<ID>``), sent to the executors inside the pickled reader.
"""

from __future__ import annotations

import json
import logging
import pickle
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .events import ChangeEvent
from .positions import position_from_json
from .sources.base import SnapshotTable, Source
from .spec import PipelineSpec
from .store.records import SnapshotRecord

if TYPE_CHECKING:
    from .snapshots import ChunkRead

log = logging.getLogger(__name__)

FORMAT = "tidegate_snapshot"
# One Spark row per batch of events: a pickled list of (value, key, event_id, mark). Spark
# converts every row between Arrow and its own format twice on the way to the driver; with one
# row per event that conversion cost more CPU than reading the rows from the database.
ROW_SCHEMA = "batch BINARY"
BATCH_ROWS = 2000


def record_to_json(rec: SnapshotRecord) -> str:
    return json.dumps({"pipeline": rec.pipeline, "snapshot": rec.snapshot_id, "kind": rec.kind,
                       "handoff": rec.handoff.to_json(), "tables": rec.tables, "chunks": rec.chunks,
                       "ts_ms": rec.ts_ms})


def record_from_json(text: str) -> SnapshotRecord:
    d = json.loads(text)
    return SnapshotRecord(d["pipeline"], d["snapshot"], d["kind"], position_from_json(d["handoff"]),
                          d["tables"], d["chunks"], int(d["ts_ms"]))


def register_source(spark: Any) -> None:
    """Register the ``tidegate_snapshot`` Python Data Source with the session (idempotent)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class ChunkReader(DataSourceReader):
        def __init__(self, options: dict[str, str]):
            from .connections import get_connection
            from .spec import load_spec_text

            # Planned where the driver's environment is: the spec and the source connection are
            # resolved here and reach the executors inside this (pickled) reader.
            self.spec = load_spec_text(options["spec_text"], origin=options.get("origin", "<spec>"))
            self.connection = get_connection(self.spec.source.conn_id)
            self.record = options["record"]
            self.chunks = json.loads(options["chunks"])

        def partitions(self) -> Sequence[InputPartition]:
            return [InputPartition(c) for c in self.chunks]

        def read(self, partition: InputPartition) -> Iterator[tuple]:
            # Runs in a Spark task: one chunk, read with a connection of its own.
            from .parts import fixed_connection
            from .snapshots import read_chunk

            source = fixed_connection(self.connection).source(self.spec)
            try:
                read = read_chunk(self.spec, source, record_from_json(self.record), partition.value)
                yield from arrow_batches(read.events, header=("upper", read.upper.to_json()))
            finally:
                source.close()

    class SnapshotSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return FORMAT

        def schema(self) -> str:
            return ROW_SCHEMA

        def reader(self, schema: Any) -> ChunkReader:
            return ChunkReader(self.options)

    spark.dataSource.register(SnapshotSource)


def arrow_batches(events: Iterable[ChangeEvent], rows: int = BATCH_ROWS, header: tuple | None = None
                  ) -> Iterator[Any]:
    """Events as Arrow record batches of :data:`ROW_SCHEMA`, ``rows`` events to a Spark row
    (a task yielding Arrow is taken as it is; yielding tuples would convert every value).
    ``header``, if given, is the first row of the first batch (a chunk's upper bound)."""
    import pyarrow as pa

    schema = pa.schema([("batch", pa.binary())])
    batch: list[tuple] = [header] if header is not None else []
    for ev in events:
        batch.append((ev.value, ev.key_bytes, ev.event_id, ev.snapshot))
        if len(batch) >= rows:
            yield pa.RecordBatch.from_arrays([pa.array([_pack(batch)], pa.binary())], schema=schema)
            batch = []
    if batch:
        yield pa.RecordBatch.from_arrays([pa.array([_pack(batch)], pa.binary())], schema=schema)


def _pack(batch: list[tuple]) -> bytes:
    return pickle.dumps(batch, pickle.HIGHEST_PROTOCOL)


def unpack_rows(blobs: Iterable[bytes]) -> list[tuple]:
    """The (value, key, event_id, mark) rows of a chunk, from its batches in order."""
    rows: list[tuple] = []
    for blob in blobs:
        rows += pickle.loads(blob)
    return rows


def chunk_reader(spark: Any):
    """A :data:`tidegate.snapshots.ChunkReader` whose chunks are read by Spark tasks, at most
    ``snapshot.parallelism`` at once, handed over in chunk order. The chunks are one data
    frame, planned once (one partition per chunk); the driver runs one Spark job per partition
    in a window, as for the log's slices (spark_job.partitions_in_order)."""

    def read(spec: PipelineSpec, source: Source, rec: SnapshotRecord, chunks: Sequence[int]
             ) -> Iterator[tuple[int, ChunkRead]]:
        from .snapshots import ChunkRead
        from .spark_job import partitions_in_order

        if not chunks:
            return
        register_source(spark)
        window = max(1, min(spec.snapshot.parallelism, len(chunks)))
        log.info("pipeline %s: snapshot %s: %d chunk(s) as Spark tasks, %d at a time", spec.pipeline,
                 rec.snapshot_id, len(chunks), window)
        frame = (spark.read.format(FORMAT).option("spec_text", spec.text)
                 .option("origin", spec.path or spec.pipeline).option("record", record_to_json(rec))
                 .option("chunks", json.dumps(list(chunks))).load())
        name = f"tidegate-snapshot-{rec.snapshot_id}"
        for index, rows in partitions_in_order(spark.sparkContext, frame.rdd, len(chunks), window, name):
            chunk = chunks[index]
            (_, upper), *events = unpack_rows(r[0] for r in rows)  # the task's header comes first
            yield chunk, ChunkRead(position_from_json(upper), driver_events(spec, source, rec, chunk, events))

    return read


def driver_events(spec: PipelineSpec, source: Source, rec: SnapshotRecord, chunk: int,
                  rows: list[tuple]) -> Iterator[ChangeEvent]:
    """The chunk's events on the driver, built around the bytes the task serialized: the sinks
    send ``value`` and ``key_bytes`` as they are, so the row is not parsed again (``before`` /
    ``after`` / ``key`` of these objects are not filled in)."""
    table = SnapshotTable.from_json(rec.tables[rec.chunks[chunk - 1]["table"]])
    tx_id = f"snapshot:{rec.snapshot_id}"
    position = {"snapshot": rec.snapshot_id, "chunk": chunk}
    native = ChangeEvent.native
    for n, (value, key_bytes, event_id, mark) in enumerate(rows, 1):
        ev = native(spec.tenant, spec.pipeline, source.connector, table.db, table.schema, table.table, "r",
                    None, None, None, tx_id, event_id, position, rec.ts_ms, n, n, mark)
        ev.__dict__["value"] = value  # what the task serialized, sent as is
        ev.__dict__["key_bytes"] = key_bytes
        yield ev


__all__ = ["arrow_batches", "chunk_reader", "driver_events", "record_from_json", "record_to_json",
           "register_source", "unpack_rows"]
