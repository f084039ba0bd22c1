"""PySpark's Python daemon with the engine imported before it forks workers.

A Spark server set with ``spark.python.daemon.module=tidegate.spark.daemon`` starts this module
where it would start ``pyspark.daemon``: it imports the delivery task's modules (the engine, the
sinks' and sources' client libraries), then runs PySpark's own daemon. Every worker the daemon
forks has them already, so a run delivered by a Spark task does not import the engine first.

Why a daemon of our own: Spark keeps an idle Python worker for one minute only (a constant of
its worker factory, not a setting), so a pipeline on a one-minute schedule gets a new worker,
which imports the engine again, for nearly every run. A forked worker shares the daemon's
imported modules instead.

What is left to import after the fork: what PySpark itself imports there (its worker module,
pyarrow, pandas), because those start threads when imported, and a fork keeps none of a
parent's threads. The modules imported here start none at import.

A session that ships its own tidegate (the deliver task adds its package to the session) has
that package first on the daemon's path: Spark starts one daemon per session environment, so
what is imported here is the session's own code. Without tidegate on the path this daemon is
PySpark's.
"""

from __future__ import annotations

import importlib

# The modules a delivery task imports (tidegate.spark.delivery.delivery_task and what the run
# reaches through tidegate.kinds), client libraries included.
PRELOAD = (
    "tidegate.runner", "tidegate.run", "tidegate.parts", "tidegate.reader_process", "tidegate.store",
    "tidegate.spark.delivery",
    "tidegate.sources.mysql.source", "tidegate.sources.postgres.source",
    "tidegate.sinks.kafka.sink", "tidegate.sinks.nats.sink", "tidegate.sinks.redis.sink",
)


def preload() -> list[str]:
    """Import :data:`PRELOAD`; returns the modules that could not be imported (a server whose
    Python lacks a sink's client library still serves the others)."""
    missing = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


if __name__ == "__main__":
    preload()
    from pyspark.daemon import manager

    manager()
