"""The Spark side of a run: read the range as partitions, serialize in Spark, deliver in order.

The range (lowest sink checkpoint, upper bound] is cut into slices the source can read
independently (``Source.slices``: MySQL one per binlog file; Postgres one, the slot is a
single stream). A Python Data Source (``pyspark.sql.datasource``) exposes the slices as
partitions, so Spark decodes and serializes them in parallel tasks. The driver then pulls the
partitions back in source order with ``toLocalIterator`` (one partition at a time) and feeds
the engine's coordinator, which cuts sub-batches at transaction boundaries, delivers them and
commits checkpoints as it goes. Delivery stays on the driver: it is ordered and transactional.

What the tasks need travels inside the job, never through a worker's disk or argv: the spec's
YAML text is a data source option, and the source connection is resolved once where the
reader is planned (from the driver's ``AIRFLOW_CONN_<ID>`` environment) and sent to the
executors inside the pickled reader, over Spark's own channel (docs/operations.md, "Spark").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from .events import ChangeEvent, PositionMark
from .plan import RunPlan
from .positions import Position, position_from_json, position_to_json
from .spec import PipelineSpec

log = logging.getLogger(__name__)

ROW_SCHEMA = "kind STRING, value BINARY, tx_end BOOLEAN, end_position STRING"


def item_to_row(item: ChangeEvent | PositionMark) -> tuple:
    """A source item as a flat row: the serialized envelope travels, not Python objects."""
    if isinstance(item, PositionMark):
        return ("mark", None, True, json.dumps(position_to_json(item.position)))
    end = json.dumps(position_to_json(item.end_position)) if item.end_position is not None else None
    return ("event", item.value, item.tx_end, end)


def row_to_item(kind: str, value: bytes | None, tx_end: bool, end_position: str | None
                ) -> ChangeEvent | PositionMark:
    if kind == "mark":
        return PositionMark(position_from_json(end_position))
    return ChangeEvent.from_value(bytes(value), tx_end=bool(tx_end),
                                  end_position=position_from_json(end_position) if end_position else None)


def register_source(spark: Any) -> None:
    """Register the ``tidegate`` Python Data Source with the session (idempotent)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class SliceReader(DataSourceReader):
        def __init__(self, options: dict[str, str]):
            from .connections import get_connection
            from .spec import load_spec_text

            # Planned where the driver's environment is: the spec and the source connection
            # are resolved here and reach the executors inside this (pickled) reader.
            self.spec = load_spec_text(options["spec_text"], origin=options.get("origin", "<spec>"))
            self.connection = get_connection(self.spec.source.conn_id)
            self.slices = json.loads(options["slices"])

        def partitions(self) -> Sequence[InputPartition]:
            # The partition's value is all a task gets besides the reader: the slice's bounds.
            return [InputPartition((i, s, e)) for i, (s, e) in enumerate(self.slices)]

        def read(self, partition: InputPartition) -> Iterator[tuple]:
            # Runs in a Spark task: each slice is read with its own source connection.
            from .runner import build_source

            source = build_source(self.spec, lambda conn_id: self.connection)
            try:
                index, start_json, end_json = partition.value
                start = position_from_json(start_json) if start_json else None
                for item in source.read_slice(start, position_from_json(end_json), index):
                    yield item_to_row(item)
            finally:
                source.close()

    class TidegateSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "tidegate"

        def schema(self) -> str:
            return ROW_SCHEMA

        def reader(self, schema: Any) -> SliceReader:
            return SliceReader(self.options)

    spark.dataSource.register(TidegateSource)


def read_range(spark: Any, spec: PipelineSpec, slices: list[tuple[Position | None, Position]]
               ) -> Iterator[ChangeEvent | PositionMark]:
    """The range's items in source order, decoded in Spark tasks, one partition at a time."""
    if not slices:  # nothing in range: Spark would run one partition with no slice
        return
    register_source(spark)
    encoded = [(json.dumps(position_to_json(s)) if s is not None else None, json.dumps(position_to_json(e)))
               for s, e in slices]
    df = (spark.read.format("tidegate").option("spec_text", spec.text)
          .option("origin", spec.path or spec.pipeline).option("slices", json.dumps(encoded)).load())
    for row in df.toLocalIterator(prefetchPartitions=False):
        yield row_to_item(row.kind, row.value, row.tx_end, row.end_position)


def deliver(spark: Any, *, spec: PipelineSpec, plan: RunPlan, run_id: str,
            upto: Position | None = None) -> dict[str, Any]:
    """The Spark job's body: one bounded run whose range is read by Spark tasks."""
    from .runner import run_pipeline

    def spark_reader(source: Any, start: Position | None, bound: Position):
        slices = source.slices(start, bound)
        log.info("pipeline %s: reading (%s, %s] as %d Spark partition(s)", spec.pipeline, start, bound,
                 len(slices))
        return read_range(spark, spec, slices)

    from .spark_snapshot import chunk_reader  # snapshots: one Spark task per chunk

    return run_pipeline(spec, plan, run_id=run_id, upto=upto, reader=spark_reader,
                        chunk_reader=chunk_reader(spark))
