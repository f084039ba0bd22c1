"""What a tidegate task process imports, imported once by a long-lived parent instead.

With ``[scheduler] mp_start_method = forkserver`` and ``[scheduler] mp_forkserver_preload =
tidegate_airflow.preload``, the LocalExecutor's worker processes are forked from a process that
has imported this module, and every task process is forked from a worker: it starts with the
task runner, the DAG file's modules (the operators, the Spark provider, the spec and kind
modules) and the engine modules the tasks call already in memory, instead of importing them
again (about 0.3 s of each task's own time on a 2-core machine; docs/operations.md, "Freshness").

Importing it opens nothing and reads no spec. A module missing here (a client library not
installed, say) is left out: the task that needs it imports it, and fails, as without the preload.
Of Spark, only the Spark Connect client is imported (the deliver task of every pipeline whose
``spark.conn_id`` is a Connect connection, the default, opens a session with it); not the
classic PySpark session, which starts a JVM.
"""

from __future__ import annotations

import importlib

# The task runner every task process runs and the DagBag it parses the DAG file with (0.4 s of
# imports); the DAG file's modules (tidegate_dags.py); what Airflow imports when that file builds
# a DAG (the timetables of cron, preset and @continuous schedules).
RUNTIME = ("airflow.sdk.execution_time.task_runner", "airflow.dag_processing.dagbag", "airflow.version",
           "tidegate_airflow.factory", "tidegate_airflow.operators",
           "tidegate_airflow.metrics", "tidegate.catalog", "airflow.sdk.definitions.timetables.trigger",
           "airflow.sdk.definitions.timetables.interval", "airflow.sdk.definitions.timetables.simple",
           "airflow.timetables.base", "airflow.timetables.simple", "airflow.serialization.definitions.assets",
           "airflow.serialization.dag_dependency")
# What the tasks call when they run: guards, bounds, the run's record, the store, the report's status.
ENGINE = ("tidegate.guards", "tidegate.runner", "tidegate.run", "tidegate.store", "tidegate.store.sqlite",
          "tidegate.store.postgres", "tidegate.status", "tidegate.parts", "tidegate.spark.connect")


# The Spark Connect client: 0.7-1.6 s of CPU of every deliver task (grpc, pyarrow, and pandas,
# which pyspark.sql.connect imports through pyspark.testing.connectutils), taken once here.
# Importing it opens no channel and starts no thread: each task process, a fork, opens its own.
SPARK_CLIENT = ("pyspark.sql.connect.session",)


def _kind_modules() -> list[str]:
    """The source and sink classes' modules of every registered kind (their client libraries),
    and the modules of a sink kind's envelope (its encoder, and the parser of its fields)."""
    from tidegate import kinds

    out = []
    for registry, attr in ((kinds.SOURCES, "source"), (kinds.SINKS, "sink")):
        for name in registry:
            try:
                kind = kinds.source_kind(name) if attr == "source" else kinds.sink_kind(name)
            except ImportError:
                continue
            # A sink kind that needs Spark settings (Delta) pulls Spark in: left to its task.
            if not getattr(kind, "spark_conf", ""):
                refs = (getattr(kind, attr), getattr(kind, "envelope", ""),
                        getattr(kind, "envelope_fields", ""))
                out += [ref.partition(":")[0] for ref in refs if ref]
    return out


def preload() -> list[str]:
    """Import the modules; returns those that could not be imported."""
    missing = []
    for module in (*RUNTIME, *ENGINE, *_kind_modules(), *SPARK_CLIENT):
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    return missing


preload()
