"""The Delta sink's Spark session: a session of its own (its SQL settings, which carry the
commits' txnAppId, are this sink's alone). When the run is a Spark Connect client, a new session
on the run's server; else one over the process's Spark: the deliver job's, or a local one
started with Delta's settings when none runs (``tidegate run``)."""

from __future__ import annotations

import threading
from typing import Any

from pyspark import SparkContext
from pyspark.sql import SparkSession

from ...errors import NonRetryableSinkError
from . import jars

_SESSION_LOCK = threading.Lock()
_FIX_CONNECT = ("start the Spark Connect server with the settings of tidegate.sinks.delta.jars."
                "spark_conf() (static: they must be given when it starts; `scripts/services up "
                "spark_connect` gives them when jars/delta holds the jars)")
_FIX_CLASSIC = ("the deliver task adds Delta's settings when the spec has a delta sink: start the job "
                "through it, or give spark-submit the settings of tidegate.sinks.delta.jars.spark_conf()")


def open_session(remote: Any, name: str, app_name: str, where: str) -> tuple[Any, Any]:
    """(the session, the Connect session to stop on close or None). ``remote``: the run's Spark
    Connect session (a LazySession), None for classic Spark. Refuses a session without Delta."""
    if remote is not None:
        spark = own = remote.sibling(name)
    else:
        spark, own = _classic_session(app_name).newSession(), None
    ext = spark.conf.get("spark.sql.extensions", "") or ""
    if jars.EXTENSION not in ext:
        if own is not None:
            own.stop()
        raise NonRetryableSinkError(
            f"{where}: the Spark session was started without Delta Lake "
            f"(spark.sql.extensions={ext!r}); {_FIX_CONNECT if remote is not None else _FIX_CLASSIC}")
    return spark, own


def _classic_session(app_name: str) -> Any:
    with _SESSION_LOCK:
        if SparkContext._active_spark_context is None:
            b = SparkSession.builder.master("local[2]").appName(app_name)
            for k, v in jars.spark_conf().items():
                b = b.config(k, v)
            return b.getOrCreate()
        return SparkSession.builder.getOrCreate()


__all__ = ["open_session"]
