"""The Python side of pyspark matches its jars, and a local SparkSession runs a job."""

from __future__ import annotations

import re
from pathlib import Path

import pyspark
import pytest

from tests.integration.local_spark import local_session

pytestmark = pytest.mark.integration


def test_pyspark_python_version_equals_jar_version():
    jars = Path(pyspark.__file__).parent / "jars"
    core = [p.name for p in jars.glob("spark-core_*.jar")]
    assert len(core) == 1, core
    jar_version = re.match(r"spark-core_2\.\d+-(.+)\.jar", core[0]).group(1)
    assert pyspark.__version__ == jar_version


def test_local_session_runs_a_job(monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    spark = local_session("tidegate-smoke", conf={"spark.sql.shuffle.partitions": "2"})
    try:
        df = spark.range(0, 1000, numPartitions=4)
        row = df.selectExpr("sum(id) AS s", "count(*) AS n").collect()[0]
        assert (row.s, row.n) == (499500, 1000)
        assert spark.version == pyspark.__version__
    finally:
        spark.stop()
