"""The Spark job reads a range as per-binlog-file partitions (or finer slices inside the files),
several at once; in source order the items (rows and schema_change messages) equal, byte for
byte, one sequential read of the same range, and the fields the driver did not receive are the
sequential read's too."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
import uuid

import pymysql
import pytest
from tidegate.events import ChangeEvent, PositionMark, is_control
from tidegate.parts import Parts
from tidegate.shipped import ROW_FIELDS, ShippedEvent
from tidegate.spark.slices import read_range
from tidegate.spec import load_spec

from tests.integration.local_spark import local_session

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def event_log(tmp_path_factory):
    return tmp_path_factory.mktemp("spark-events")


@pytest.fixture(scope="module")
def spark(event_log):
    # Spark's Python workers must run this interpreter (it has tidegate installed).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = local_session("tidegate-test", conf={"spark.eventLog.enabled": "true",
                                                   "spark.eventLog.dir": str(event_log),
                                                   "spark.eventLog.compress": "false"})
    yield session
    session.stop()


def max_tasks_at_once(event_log) -> int:
    """The most Spark tasks that ran at the same time, from the event log's task start/end times."""
    edges = []
    for path in event_log.rglob("*"):  # one file per application, or a folder of rolled files
        if not path.is_file() or path.name.startswith((".", "appstatus")):
            continue
        for line in path.read_text().splitlines():
            ev = json.loads(line)
            if ev.get("Event") == "SparkListenerTaskEnd":
                info = ev["Task Info"]
                edges += [(info["Launch Time"], 1), (info["Finish Time"], -1)]
    running = most = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):
        running += step
        most = max(most, running)
    return most


@pytest.fixture(scope="module")
def backlog(mysql, tmp_path_factory):
    """Four binlog files with rows of one table in each, and the spec of a pipeline over it."""
    db = "spark_" + uuid.uuid4().hex[:8]
    path = tmp_path_factory.mktemp("spec") / "s.yaml"
    path.write_text(textwrap.dedent(f"""
        pipeline: s_{db}
        source: {{kind: mysql, conn_id: cdc_mysql, server_id: 47011, tables: [{db}.t]}}
        sinks: [{{id: a, kind: redis, conn_id: r, stream: "s"}}]
    """))
    spec = load_spec(str(path))
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    source = Parts().source(spec)
    start = source.head()
    with admin.cursor() as c:
        c.execute(f"CREATE DATABASE {db}")
        c.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(20), d DECIMAL(8,2), at DATETIME)")
        for chunk in range(3):  # three binlog files with rows in each
            c.execute("BEGIN")
            for i in range(chunk * 1000, chunk * 1000 + 1000):
                c.execute(f"INSERT INTO {db}.t (id, v, d, at) VALUES (%s, %s, %s, '2026-01-02 03:04:05')",
                          (i, f"v{i}", i / 4))
            c.execute("COMMIT")
            c.execute(f"UPDATE {db}.t SET v = 'u' WHERE id = %s", (chunk * 1000,))
            if chunk == 1:
                c.execute(f"ALTER TABLE {db}.t ADD COLUMN w INT DEFAULT 0")
            for i in range(chunk * 1000 + 1, chunk * 1000 + 40):  # small transactions to cut between
                c.execute(f"UPDATE {db}.t SET v = 'w' WHERE id = %s", (i,))
            c.execute("FLUSH BINARY LOGS")
    upto = source.head()
    yield spec, source, start, upto
    source.close()
    with admin.cursor() as c:
        c.execute(f"DROP DATABASE IF EXISTS {db}")
    admin.close()


def test_parallel_slices_in_spark_equal_the_sequential_read(backlog, spark, event_log, monkeypatch):
    spec, source, start, upto = backlog
    slices = source.slices(start, upto)
    assert len(slices) >= 4  # the start file, three more after each flush

    sequential = list(source.read(start, upto))
    in_spark = list(read_range(spark, spec, slices, window=2))

    def flat(items):
        return [("mark", it.position) if isinstance(it, PositionMark)
                else (is_control(it), it.value, it.tx_end, it.end_position) for it in items]

    rows = [it for it in in_spark if isinstance(it, ChangeEvent)]
    assert len(rows) == 3003 + 3 * 39
    assert all(type(r) is ShippedEvent for r in rows)
    assert [r.after["id"] for r in rows if r.op == "c"] == list(range(3000))
    ddl = [it for it in in_spark if is_control(it)]  # travelled from their tasks as control messages
    assert [(m.type, m.fields["change"], m.table, m.tx_end) for m in ddl] == [
        ("schema_change", "create", "t", True), ("schema_change", "alter", "t", True)]
    # Marks may differ where slices meet (each slice ends at its own file boundary); the rows and
    # messages, their bytes, order and transaction ends may not.
    expected = [f for f in flat(sequential) if f[0] != "mark"]
    assert [f for f in flat(in_spark) if f[0] != "mark"] == expected
    assert [it for it in in_spark if isinstance(it, PositionMark)][-1].position == upto

    # Slices cut inside the files (forced small) read the same.
    monkeypatch.setenv("TIDEGATE_MYSQL_SLICE_BYTES", "4096")
    fine_source = Parts().source(spec)
    fine = fine_source.slices(start, upto)
    fine_source.close()
    assert len(fine) > len(slices) + 3
    in_spark_fine = list(read_range(spark, spec, fine, window=2))
    assert [f for f in flat(in_spark_fine) if f[0] != "mark"] == expected
    assert [it for it in in_spark_fine if isinstance(it, PositionMark)][-1].position == upto

    # Every field reads the same as on the event the source built: the shipped ones (the
    # serialized key too) and those parsed from the envelope on demand.
    fields = [f.name for f in ChangeEvent.__dataclass_fields__.values()] + [
        "id", "idempotency_key", "key_bytes", "value"]
    assert set(ROW_FIELDS) <= set(fields)
    by_key = {e.idempotency_key: e for e in sequential if isinstance(e, ChangeEvent)}
    for shipped in rows[::250] + rows[-3:]:
        built = by_key[shipped.idempotency_key]
        assert {f: getattr(shipped, f) for f in fields} == {f: getattr(built, f) for f in fields}

    # Two slices were decoded at the same time (the window), not one partition after another.
    time.sleep(1)  # the event log is flushed as the jobs end
    assert max_tasks_at_once(event_log) >= 2

    # A slice too large for one task's result is read by the driver in its turn: same stream.
    mixed = list(read_range(spark, spec, slices, window=2, local=frozenset({1}),
                            read_local=lambda i: source.read_slice(slices[i][0], slices[i][1], i)))
    assert [f for f in flat(mixed) if f[0] != "mark"] == expected


def test_stopping_early_cancels_the_slices_in_flight(backlog, spark):
    spec, source, start, upto = backlog
    items = read_range(spark, spec, source.slices(start, upto), window=2)
    first = next(it for it in items if isinstance(it, ChangeEvent))
    assert first.op == "c"
    items.close()  # the coordinator stopped (a failed sub-batch): no job may keep running
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + 30
    while tracker.getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert tracker.getActiveJobsIds() == []
