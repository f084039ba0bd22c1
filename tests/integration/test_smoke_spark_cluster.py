"""The `spark` service: a standalone master and one worker from the venv's pyspark, on loopback.
A job submitted to it runs on its executors, and the master lists the application."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.request

import pytest

from tests.conftest import SERVICES, services_env

pytestmark = [pytest.mark.integration]


def test_a_job_runs_on_the_standalone_cluster(service_env, tmp_path):
    r = subprocess.run([sys.executable, str(SERVICES), "up", "spark"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    master = services_env()["TIDEGATE_SPARK_MASTER"]
    port = int(master.rsplit(":", 1)[1])
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent("""
        import sys
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.master(sys.argv[1]).appName("tidegate-cluster-smoke").getOrCreate()
        rdd = spark.sparkContext.parallelize(range(1000), 4)
        print("RESULT", rdd.map(lambda x: x * 2).sum(), rdd.getNumPartitions(), flush=True)
        spark.stop()
    """))
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    out = subprocess.run([sys.executable, str(job), master], capture_output=True, text=True, env=env,
                         timeout=300)
    assert "RESULT 999000 4" in out.stdout, out.stderr[-3000:]
    with urllib.request.urlopen(f"http://127.0.0.1:{port + 1004}/json/", timeout=5) as resp:
        state = json.load(resp)
    assert state["status"] == "ALIVE" and state["aliveworkers"] >= 1
    assert "tidegate-cluster-smoke" in {a["name"] for a in state["completedapps"] + state["activeapps"]}
