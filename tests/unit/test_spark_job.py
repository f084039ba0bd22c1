"""tidegate.spark without Spark: the window of partitions in flight, the rows a task ships and
the events the driver rebuilds from them."""

from __future__ import annotations

import os
import random
import threading
import time

from tidegate.events import ChangeEvent, PositionMark
from tidegate.shipped import ShippedEvent, item_to_row, row_to_item
from tidegate.sources.mysql.position import BinlogPosition
from tidegate.spark.windows import partitions_in_order


class FakeContext:
    """runJob returns partition i's rows after a random delay; records how many ran at once."""

    def __init__(self, rows_per_partition: int = 3):
        self.lock = threading.Lock()
        self.running = self.most = 0
        self.started: list[int] = []
        self.cancelled: list[str] = []
        self.groups: set[str] = set()
        self.rows = rows_per_partition

    def setJobGroup(self, group, description, interruptOnCancel=False):  # noqa: N802 - Spark's name
        self.groups.add(group)

    def cancelJobGroup(self, group):  # noqa: N802
        self.cancelled.append(group)

    def runJob(self, rdd, fn, partitions):  # noqa: N802
        (index,) = partitions
        with self.lock:
            self.started.append(index)
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(random.uniform(0, 0.02))
        with self.lock:
            self.running -= 1
        return [(index, k) for k in range(self.rows)]


def test_partitions_come_back_in_order_with_at_most_window_in_flight():
    sc = FakeContext()
    out = [row for _, rows in partitions_in_order(sc, None, 12, 3, "p") for row in rows]
    assert out == [(i, k) for i in range(12) for k in range(3)]
    assert 1 < sc.most <= 3
    assert sorted(sc.started) == list(range(12)) and len(sc.groups) == 1 and sc.cancelled == []


def test_the_window_bounds_what_runs_ahead_of_the_consumer():
    sc = FakeContext()
    parts = partitions_in_order(sc, None, 10, 2, "p")
    next(parts)
    time.sleep(0.1)
    # Partition 0 is in the consumer's hands; at most two more were started meanwhile.
    assert sorted(sc.started) == [0, 1, 2]
    parts.close()


def test_local_partitions_come_in_their_turn_and_take_no_window_slot():
    sc = FakeContext()
    out = list(partitions_in_order(sc, None, 8, 2, "p", local=frozenset({0, 3, 4})))
    assert [i for i, _ in out] == list(range(8))
    assert [i for i, rows in out if rows is None] == [0, 3, 4]
    assert sorted(sc.started) == [1, 2, 5, 6, 7]  # never a Spark job for a local partition
    parts = partitions_in_order(FakeContext(), None, 8, 2, "p", local=frozenset({0, 3, 4}))
    sc = parts.gi_frame.f_locals["sc"]
    assert next(parts) == (0, None)  # the driver reads slice 0 while 1 and 2 decode
    time.sleep(0.1)
    assert sorted(sc.started) == [1, 2]
    parts.close()


def test_stopping_early_cancels_the_jobs_still_running():
    sc = FakeContext()
    parts = partitions_in_order(sc, None, 10, 3, "p")
    next(parts)
    parts.close()
    assert len(sc.cancelled) == 1 and sc.cancelled[0] in sc.groups
    assert len(sc.started) <= 4


def _event(**kw) -> ChangeEvent:
    base = dict(tenant="t", pipeline="p", connector="mysql", db="shop", schema="shop", table="orders",
                op="u", before={"id": 1, "v": "a"}, after={"id": 1, "v": "b"}, key={"id": 1},
                tx_id="0-1-7", event_id="mysql-bin.000002:400:0",
                position={"file": "mysql-bin.000002", "pos": 400}, ts_ms=1_764_000_000_000,
                total_order=2, data_collection_order=1)
    return ChangeEvent.build(**{**base, **kw})


def test_a_shipped_row_rebuilds_the_event_without_reparsing_until_asked():
    end = BinlogPosition("mysql-bin.000002", 512, server_id=1)
    ev = _event(tx_end=True, end_position=end)
    back = row_to_item(item_to_row(ev))
    assert type(back) is ShippedEvent and isinstance(back, ChangeEvent)
    assert (back.value, back.key_bytes, back.idempotency_key, back.end_position, back.tx_end) == (
        ev.value, ev.key_bytes, ev.idempotency_key, end, True)
    assert back.value is item_to_row(ev)[1]  # the very bytes, not a re-serialization
    assert "_env" not in back.__dict__  # nothing parsed so far
    for name in ("before", "after", "key", "position", "ts_ms", "total_order", "data_collection_order",
                 "snapshot", "event_id", "tenant", "pipeline", "connector", "id", "tx_id", "op"):
        assert getattr(back, name) == getattr(ev, name), name
    mark = PositionMark(end)
    assert row_to_item(item_to_row(mark)) == mark


def test_the_driver_reports_its_cpu_and_its_jvms():
    from tidegate.spark.job import cpu_seconds

    sum(i * i for i in range(300_000))  # some CPU of its own
    mine = cpu_seconds()
    assert mine > 0
    # The same process read through /proc (as the driver reads its JVM's) agrees within ticks.
    assert abs(cpu_seconds(os.getpid()) - mine) < 0.5
    assert cpu_seconds(2**22 + 1) is None  # no such process: nothing to report


# --------------------------------------------------------------------------- Spark Connect URL


def test_connect_url_is_built_as_airflows_hook_builds_it():
    from tidegate.connections import Connection
    from tidegate.spark.connect import connect_url

    plain = Connection("sc", "spark_connect", host="127.0.0.1", port=15002)
    assert connect_url(plain) == "sc://127.0.0.1:15002/"
    full = Connection("sc", "spark_connect", host="sc://spark.example", port=443, login="etl",
                      password="t/k n", extra={"use_ssl": True})
    assert connect_url(full) == "sc://spark.example:443/;user_id=etl;token=t/k%20n;use_ssl=True"


def test_tidegate_run_delivers_through_connect_only_when_the_spec_names_a_connect_connection():
    from tidegate.connections import get_connection
    from tidegate.spark.connect import spec_connect_url
    from tidegate.spec import load_spec_text

    spec = load_spec_text("""
        pipeline: p
        source: {kind: mysql, conn_id: src, tables: [d.t], server_id: 7}
        sinks: [{id: k, kind: redis, conn_id: r, stream: s}]
        spark: {conn_id: sc}
    """)
    environ = {"AIRFLOW_CONN_SC": '{"conn_type": "spark_connect", "host": "127.0.0.1", "port": 15002}'}
    assert spec_connect_url(spec, lambda c: get_connection(c, environ)) == "sc://127.0.0.1:15002/"
    environ = {"AIRFLOW_CONN_SC": '{"conn_type": "spark", "host": "local[2]"}'}
    assert spec_connect_url(spec, lambda c: get_connection(c, environ)) is None  # spark-submit's
    assert spec_connect_url(spec, lambda c: get_connection(c, {})) is None  # not defined: in-process
