"""The local Spark session a test reads with, in the test's own process."""

from __future__ import annotations

from typing import Any


def local_session(app: str, master: str = "local[2]", conf: dict[str, str] | None = None) -> Any:
    """A local session started with Delta Lake's jars and settings, whatever the test reads. The
    first session of a process starts its JVM with the jars on its class path, and a later one
    cannot add them; under `make test` one pytest worker runs many modules in an order of its
    own, so every test session starts as a Delta reader needs it."""
    from pyspark.sql import SparkSession
    from tidegate.sinks.delta.jars import spark_conf

    builder = SparkSession.builder.master(master).appName(app).config("spark.ui.enabled", "false")
    for key, value in {**spark_conf(), **(conf or {})}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
