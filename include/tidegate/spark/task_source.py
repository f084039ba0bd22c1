"""A Python Data Source whose one partition runs a given function in a Spark task: how the
log's slices and the snapshot's chunks are read by Spark tasks, through spark-submit and Spark
Connect alike.

What the tasks need (the spec, the source connection, the salt, the segment) travels inside the
data source's class, pickled, which a Connect server receives as bytes of the registration:
never as an option string, which a Connect server shows, in part, as the text of the operation
in its UI.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any


def register_task_source(spark: Any, payload: Any, task: Callable[[Any, int], Iterator[Any]],
                         schema: str) -> str:
    """Register a Python Data Source under a new name whose data frames (one per index, the
    ``index`` option) have one partition: ``task(payload, index)`` run by a Spark task, yielding
    Arrow record batches of ``schema``. ``payload`` and ``task`` reach the server inside the
    pickled class; returns the name."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    name = f"tidegate_{uuid.uuid4().hex[:12]}"

    class TaskReader(DataSourceReader):
        def __init__(self, options: Mapping[str, str]):
            self.index = int(options["index"])

        def partitions(self) -> Sequence[InputPartition]:
            return [InputPartition(self.index)]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            yield from task(payload, partition.value)

    class TaskSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return name

        def schema(self) -> str:
            return schema

        def reader(self, schema: Any) -> TaskReader:
            return TaskReader(self.options)

    spark.dataSource.register(TaskSource)
    return name


__all__ = ["register_task_source"]
