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
                         schema: str, count: int = 0) -> str:
    """Register a Python Data Source under a new name whose partition ``index`` is
    ``task(payload, index)`` run by a Spark task, yielding Arrow record batches of ``schema``. A
    data frame read with the ``index`` option has that one partition (Spark Connect: a frame per
    index); without it, partitions 0 to ``count - 1`` (an RDD's partitions, run in a window).
    ``payload`` and ``task`` reach the executors inside the pickled class; returns the name."""
    # pyspark's data source API: loaded by a run that reads through Spark, never by one that does not
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    name = f"tidegate_{uuid.uuid4().hex[:12]}"

    class TaskReader(DataSourceReader):
        def __init__(self, options: Mapping[str, str]):
            self.indexes = [int(options["index"])] if "index" in options else range(count)

        def partitions(self) -> Sequence[InputPartition]:
            return [InputPartition(i) for i in self.indexes]

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
