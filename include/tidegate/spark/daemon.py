"""PySpark's Python daemon with the engine's client libraries imported before it forks workers.

A Spark server set with ``spark.python.daemon.module=tidegate.spark.daemon`` starts this module
where it would start ``pyspark.daemon``: it imports the client libraries a delivery task uses
(the sources' drivers, the sinks' clients, the serializers), then runs PySpark's own daemon.
Every worker the daemon forks has them already.

Why a daemon of our own: Spark keeps an idle Python worker for one minute only (a constant of
its worker factory, not a setting), so a pipeline on a one-minute schedule often gets a new
worker, and so does every new session. A forked worker shares the daemon's imported modules.

Not imported here:
- tidegate itself. A session ships its own tidegate (the deliver task adds its package to the
  session), which a worker puts on its path only when its first task arrives, after the fork:
  an engine imported here would be the server's copy, and the task would run it instead of the
  session's code.
- what starts threads when imported (pyarrow, pandas, PySpark's worker): a fork keeps none of
  a parent's threads, so PySpark imports them after the fork.

Without a library on the path this daemon is PySpark's.
"""

from __future__ import annotations

import importlib
import sys

# What the sources, the sinks, the store and the envelope import (include/tidegate, grep for
# these names), none of which starts a thread at import.
PRELOAD = (
    "orjson", "msgspec", "yaml",
    "psycopg2", "psycopg2.extensions", "psycopg2.extras", "psycopg2.errors",
    "pymysql", "pymysql.cursors", "pymysqlreplication", "pymysqlreplication.event",
    "pymysqlreplication.row_event",
    "confluent_kafka", "confluent_kafka.admin",
    "redis", "redis.exceptions", "redis.retry", "redis.backoff",
    "nats", "nats.errors", "nats.js.api", "nats.js.errors",
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


def forget_tidegate() -> None:
    """Drop the packages ``python -m tidegate.spark.daemon`` imported on the way here (``tidegate``,
    ``tidegate.spark``: the server's copy), so that a worker imports the session's."""
    for name in [m for m in sys.modules if m == "tidegate" or m.startswith("tidegate.")]:
        del sys.modules[name]


if __name__ == "__main__":
    preload()
    forget_tidegate()
    from pyspark.daemon import manager

    manager()
