"""The Spark side of a snapshot: one Spark task per primary-key chunk, delivered in chunk order.

A Python Data Source (``tidegate_snapshot``) has one partition per chunk. Its task opens a
source connection of its own, reads the chunk (one short transaction, no lock:
``Source.read_chunk``) and turns every row into its serialized envelope right there
(``snapshots.chunk_events``), so the executors do the data work: reading, converting and
serializing. The task hands Spark Arrow record batches, and a row reaches the driver as its
envelope bytes, its message key and its ``event_id``; the driver never parses it again.

The driver reads the chunks through a bounded window: ``snapshot.parallelism`` chunks are read
at once, each as a one-partition DataFrame collected with ``toArrow()`` (Arrow moves the rows'
bytes from the JVM to the driver without pickling a Python object per row), and the coordinator
takes them in chunk order; when it takes chunk ``i``, chunk ``i + parallelism`` starts. The
driver holds at most ``parallelism + 1`` chunks (those being read and the one being delivered),
so its memory is bounded by chunks, not by the table. (One DataFrame's ``toLocalIterator`` would compute its
partitions one after the other, or two at a time with prefetching, and unpickle a Row per row.)

Why a Python Data Source and not Spark's JDBC source: a row's values must have exactly the JSON
form the log path gives the same column (DECIMAL(65,30), unsigned BIGINT, BIT, SET, TIME beyond
24 h, time zones, PostgreSQL arrays and numerics), which the Python drivers and the log path's
own converters give and Spark's JDBC type mapping does not (DecimalType stops at 38 digits,
unsigned and BIT types are widened or lost); JDBC partitions split one numeric column, not a
composite key; and it would need the JDBC driver jars on every cluster. The data source reuses
the source's own reads, with one connection per task, and needs nothing beyond ``tidegate``.

Measured (benchmarks/snapshot.py, a 1M-row MariaDB table in 50k-row chunks, on 2 cores shared
with other work): one in-process reader spends about 28 CPU-us a row; the Spark path about 65,
of which the JVM takes about 45 (Arrow from the Python task into Spark rows and back to Arrow
for the driver) and a chunk's planning about a second. Two chunks at once on ``local[2]`` were
therefore slower than one in-process reader here (0.4-0.66x); the parallel read pays off when
executors have cores of their own. A plain RDD of chunk numbers (the task's pickled bytes
passed through) cost about 20 % less CPU in the same measurements, at the price of leaving
Spark's data source API.

What the tasks need travels as for the log read (spark_job.py): the spec's YAML as an option,
and the source connection resolved where the reader is planned (the driver's
``AIRFLOW_CONN_<ID>``), sent to the executors inside the pickled reader.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .events import ChangeEvent
from .positions import position_from_json
from .sources.base import SnapshotTable, Source
from .spec import PipelineSpec
from .store.records import SnapshotRecord

log = logging.getLogger(__name__)

FORMAT = "tidegate_snapshot"
ROW_SCHEMA = "value BINARY, key BINARY, event_id STRING, mark STRING"
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
            from .runner import build_source
            from .snapshots import chunk_events

            source = build_source(self.spec, lambda conn_id: self.connection)
            try:
                events = chunk_events(self.spec, source, record_from_json(self.record), partition.value)
                yield from arrow_batches(events)
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


def arrow_batches(events: Iterable[ChangeEvent], rows: int = BATCH_ROWS) -> Iterator[Any]:
    """Events as Arrow record batches of :data:`ROW_SCHEMA`: Spark takes them as they are (a
    task yielding tuples would have Spark convert every value in Python)."""
    import pyarrow as pa

    schema = pa.schema([("value", pa.binary()), ("key", pa.binary()), ("event_id", pa.string()),
                        ("mark", pa.string())])
    cols: tuple[list, list, list, list] = ([], [], [], [])
    for ev in events:
        cols[0].append(ev.value)
        cols[1].append(ev.key_bytes)
        cols[2].append(ev.event_id)
        cols[3].append(ev.snapshot)
        if len(cols[0]) >= rows:
            yield pa.RecordBatch.from_arrays([pa.array(c, t.type) for c, t in zip(cols, schema, strict=True)],
                                             schema=schema)
            cols = ([], [], [], [])
    if cols[0]:
        yield pa.RecordBatch.from_arrays([pa.array(c, t.type) for c, t in zip(cols, schema, strict=True)],
                                         schema=schema)


def chunk_reader(spark: Any):
    """A :data:`tidegate.snapshots.ChunkReader` whose chunks are read by Spark tasks, at most
    ``snapshot.parallelism`` at once, handed over in chunk order."""

    def read(spec: PipelineSpec, source: Source, rec: SnapshotRecord, chunks: Sequence[int]
             ) -> Iterator[tuple[int, Iterable[ChangeEvent]]]:
        if not chunks:
            return
        register_source(spark)
        sc = spark.sparkContext
        group = f"tidegate-snapshot-{rec.snapshot_id}-{uuid.uuid4().hex[:6]}"
        window = max(1, min(spec.snapshot.parallelism, len(chunks)))
        record = record_to_json(rec)
        log.info("pipeline %s: snapshot %s: %d chunk(s) as Spark tasks, %d at a time", spec.pipeline,
                 rec.snapshot_id, len(chunks), window)

        def fetch(chunk: int) -> list[tuple]:
            sc.setJobGroup(group, f"tidegate snapshot {rec.snapshot_id} chunk {chunk}",
                           interruptOnCancel=True)
            table = (spark.read.format(FORMAT).option("spec_text", spec.text)
                     .option("origin", spec.path or spec.pipeline).option("record", record)
                     .option("chunks", json.dumps([chunk])).load().toArrow())
            cols = [table.column(name).to_pylist() for name in ("value", "key", "event_id", "mark")]
            return list(zip(*cols, strict=True))

        pool = ThreadPoolExecutor(max_workers=window, thread_name_prefix="snapshot-chunk")
        pending: deque[Future] = deque(pool.submit(fetch, c) for c in chunks[:window])
        done = False
        try:
            for i, chunk in enumerate(chunks):
                rows = pending.popleft().result()
                if i + window < len(chunks):
                    pending.append(pool.submit(fetch, chunks[i + window]))
                yield chunk, driver_events(spec, source, rec, chunk, rows)
            done = True
        finally:
            if not done:  # the run stopped early: stop the chunks still being read
                sc.cancelJobGroup(group)
            pool.shutdown(wait=True, cancel_futures=True)

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


__all__ = ["chunk_reader", "driver_events", "record_from_json", "record_to_json", "register_source"]
