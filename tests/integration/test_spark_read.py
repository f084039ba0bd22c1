"""The Spark job reads a range as per-binlog-file partitions, or finer slices inside the files;
in source order the items (rows and schema_change messages) equal, byte for byte, one
sequential read of the same range."""

from __future__ import annotations

import os
import sys
import textwrap
import uuid

import pymysql
import pytest
from tidegate.events import ChangeEvent, PositionMark, is_control
from tidegate.runner import build_source
from tidegate.spark_job import read_range
from tidegate.spec import load_spec

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    # Spark's Python workers must run this interpreter (it has tidegate installed).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2]").appName("tidegate-test")
               .config("spark.ui.enabled", "false").getOrCreate())
    yield session
    session.stop()


def test_parallel_slices_in_spark_equal_the_sequential_read(mysql, tmp_path, spark, monkeypatch):
    db = "spark_" + uuid.uuid4().hex[:8]
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(f"""
        pipeline: s_{db}
        source: {{kind: mysql, conn_id: cdc_mysql, server_id: 47011, tables: [{db}.t]}}
        sinks: [{{id: a, kind: redis, conn_id: r, stream: "s"}}]
    """))
    spec = load_spec(str(path))
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    source = build_source(spec)
    start = source.head()
    try:
        with admin.cursor() as c:
            c.execute(f"CREATE DATABASE {db}")
            c.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(20))")
            for chunk in range(3):  # three binlog files with rows in each
                c.execute("BEGIN")
                for i in range(chunk * 100, chunk * 100 + 100):
                    c.execute(f"INSERT INTO {db}.t (id, v) VALUES (%s, %s)", (i, f"v{i}"))
                c.execute("COMMIT")
                c.execute(f"UPDATE {db}.t SET v = 'u' WHERE id = %s", (chunk * 100,))
                if chunk == 1:
                    c.execute(f"ALTER TABLE {db}.t ADD COLUMN w INT DEFAULT 0")
                for i in range(chunk * 100 + 1, chunk * 100 + 40):  # small transactions to cut between
                    c.execute(f"UPDATE {db}.t SET v = 'w' WHERE id = %s", (i,))
                c.execute("FLUSH BINARY LOGS")
        upto = source.head()
        slices = source.slices(start, upto)
        assert len(slices) >= 4  # the start file, three more after each flush

        sequential = list(source.read(start, upto))
        in_spark = list(read_range(spark, spec, slices))
        monkeypatch.setenv("TIDEGATE_MYSQL_SLICE_BYTES", "4096")  # slices inside the files too
        fine_source = build_source(spec)
        fine = fine_source.slices(start, upto)
        fine_source.close()
        assert len(fine) > len(slices) + 3
        in_spark_fine = list(read_range(spark, spec, fine))
    finally:
        source.close()
        with admin.cursor() as c:
            c.execute(f"DROP DATABASE IF EXISTS {db}")
        admin.close()

    def flat(items):
        return [("mark", it.position) if isinstance(it, PositionMark)
                else (type(it).__name__, it.value, it.tx_end, it.end_position) for it in items]

    rows = [it for it in in_spark if isinstance(it, ChangeEvent)]
    assert len(rows) == 303 + 3 * 39
    assert [r.after["id"] for r in rows if r.op == "c"] == list(range(300))
    ddl = [it for it in in_spark if is_control(it)]  # travelled from their tasks as control messages
    assert [(m.type, m.fields["change"], m.table, m.tx_end) for m in ddl] == [
        ("schema_change", "create", "t", True), ("schema_change", "alter", "t", True)]
    # Marks may differ where slices meet (each slice ends at its own boundary); the rows and
    # messages, their bytes, order and transaction ends may not.
    expected = [f for f in flat(sequential) if f[0] != "mark"]
    for got in (in_spark, in_spark_fine):
        assert [f for f in flat(got) if f[0] != "mark"] == expected
        assert [it for it in got if isinstance(it, PositionMark)][-1].position == upto
