"""Where Delta Lake's jars are and the Spark settings a session needs for a ``kind: delta`` sink.

The jars (``io.delta:delta-spark_4.2_2.13`` and Delta's own dependencies, the version pinned beside
``delta-spark`` in requirements.txt) are fetched from Maven Central at install time by
``scripts/services install`` into ``jars/delta`` of the project (``TIDEGATE_DELTA_JARS`` names
another folder). They reach the driver and every executor through ``spark.jars``: no Ivy
resolution when a run starts, so a machine without Maven access runs the sink too. Light: no Spark.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import SpecError
from ...spec import repo_dir

JARS_ENV = "TIDEGATE_DELTA_JARS"
EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"


def jars_dir() -> Path:
    return Path(os.environ.get(JARS_ENV) or repo_dir() / "jars" / "delta")


def jar_paths() -> list[str]:
    """The Delta jars, sorted; SpecError naming the folder and the fix when there are none."""
    folder = jars_dir()
    jars = sorted(str(p) for p in folder.glob("*.jar"))
    if not any(Path(j).name.startswith("delta-spark_") for j in jars):
        raise SpecError([f"the Delta Lake jars are not in {folder} (a kind: delta sink needs them): run "
                        f"`make install` (scripts/services install fetches them from Maven Central), or set "
                        f"{JARS_ENV} to a folder holding delta-spark_4.2_2.13 and delta-storage"])
    return jars


def spark_conf() -> dict[str, str]:
    """The settings a session needs before it starts (static SQL settings, jars)."""
    return {
        "spark.jars": ",".join(jar_paths()),
        "spark.sql.extensions": EXTENSION,
        "spark.sql.catalog.spark_catalog": CATALOG,
        # A table's state is rebuilt from its log at every write; Delta's default of 50 partitions
        # for that costs more than it saves on tables of one pipeline's size.
        "spark.databricks.delta.snapshotPartitions": "2",
    }
