"""A replication slot invalidated by the server, through the DAG (`airflow dags test`).

The server invalidates the pipeline's slot (``wal_status = lost``: ``max_slot_wal_keep_size``
lowered, WAL switched and checkpointed past the slot's restart point) while changes wait in it.
The next DAG run's guard halts it with an incident of kind ``slot_invalidated`` whose range
starts at the sinks' checkpoint and covers the lost changes; the DAG run fails. A run triggered
with ``resolve: accept_gap`` and a reason re-creates the slot and moves the checkpoints past the
range; every sink receives a ``gap`` control message with the incident's range and the reason;
the pipeline streams the changes made after that. The server settings are restored in a finally.
"""

from __future__ import annotations

import collections
import json
import textwrap
import time
import uuid

import psycopg2
import pytest
from tidegate.sources.postgres.position import Lsn
from tidegate.store import open_store

from tests.integration import airflow_support
from tests.integration.airflow_support import (
    make_airflow_env,
    per_key,
    spark_connect_server,  # noqa: F401 - the spark_connect fixture
    task_ended,
)
from tests.integration.sink_readers import kafka_changes, redis_events

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


def dags_test(env: dict[str, str], dag: str, conf: dict | None = None) -> tuple[int, str]:
    t0 = time.monotonic()
    rc, log = airflow_support.dags_test(env, dag, conf)
    print(f"airflow dags test {dag} {conf or ''}: rc={rc} in {time.monotonic() - t0:.0f}s")
    return rc, log


class Workload:
    def __init__(self, execute, table: str):
        self.execute, self.table = execute, table
        self.next_id = 1
        self.expected: dict[int, list[tuple]] = collections.defaultdict(list)

    def wave(self, n: int) -> dict[int, list[tuple]]:
        """n inserts and an update of every 2nd; returns this wave's changes per key."""
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        mine: dict[int, list[tuple]] = collections.defaultdict(list)
        for i in ids:
            self.execute(f"INSERT INTO {self.table} VALUES ({i}, 'new')")
            mine[i].append(("c", "new"))
        for i in ids[::2]:
            self.execute(f"UPDATE {self.table} SET status = 'paid' WHERE id = {i}")
            mine[i].append(("u", "paid"))
        return dict(mine)


def invalidate(query, slot: str) -> str:
    """Lower max_slot_wal_keep_size (and wal_keep_size, which keeps WAL for slots too: 256MB on
    the test server) and write, switch and checkpoint WAL until the server has invalidated
    ``slot``; returns its wal_status."""
    query("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
    query("ALTER SYSTEM SET wal_keep_size = 0")
    query("SELECT pg_reload_conf()")
    query("CREATE TABLE IF NOT EXISTS wal_filler (x text)")
    for _ in range(12):
        query("INSERT INTO wal_filler SELECT repeat('w', 1000) FROM generate_series(1, 200)")
        query("SELECT pg_switch_wal()")
        query("CHECKPOINT")
        [(status,)] = query("SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        if status == "lost":
            return status
    return status


def test_invalidated_slot_halts_then_accept_gap_resumes_through_the_dag(
        tmp_path, service_env, postgres, kafka, redis_service, spark_connect, kafka_bootstrap):
    env = make_airflow_env(tmp_path, service_env)
    tag = uuid.uuid4().hex[:6]
    pipeline = table = f"inv_{tag}"
    (tmp_path / "pipelines" / f"{pipeline}.yaml").write_text(textwrap.dedent(f"""
        pipeline: {pipeline}
        source: {{kind: postgres, conn_id: cdc_postgres, tables: [public.{table}], slot: {pipeline},
                  start: earliest}}
        spark: {{conn_id: spark_connect}}
        sinks:
          - {{id: events, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}",
              exactly_once: true}}
          - {{id: cache, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:{{table}}"}}
    """))
    admin = psycopg2.connect(postgres.admin_dsn)
    admin.autocommit = True

    def query(sql: str, args=None) -> list[tuple]:
        with admin.cursor() as c:
            c.execute(sql, args)
            return c.fetchall() if c.description else []

    query(f"CREATE TABLE {table} (id int PRIMARY KEY, status text)")
    query(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
    work = Workload(lambda s: query(s), table)
    dag = f"cdc_{pipeline}"
    store = open_store(env["TIDEGATE_CHECKPOINT_STORE"])
    t0 = time.monotonic()
    try:
        # the slot made beforehand (one DAG run fewer): the first run reads it from its start
        query("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (pipeline,))
        before = work.wave(5)
        rc, log = dags_test(env, dag)
        assert rc == 0 and task_ended(log, "deliver"), log[-3000:]
        checkpoint = store.checkpoints.get(pipeline, "events").position

        lost = work.wave(4)  # waits in the slot when the server invalidates it
        [(lost_end,)] = query("SELECT pg_current_wal_lsn()::text")
        assert invalidate(query, pipeline) == "lost"

        rc, log = dags_test(env, dag)
        assert rc != 0 and "CONTINUITY HALT" in log and not task_ended(log, "deliver"), log[-3000:]
        [inc] = store.incidents.all(pipeline, unresolved_only=True)
        print(f"incident {inc.id}: {inc.kind} from {inc.from_position} to {inc.to_position}: {inc.detail}")
        assert inc.kind == "slot_invalidated" and "wal_status=lost" in inc.detail
        assert inc.from_position == checkpoint  # exactly from the checkpoint ...
        assert inc.to_position.lsn >= Lsn.parse(lost_end)  # ... past the lost changes

        reason = f"orders {min(lost)}..{max(lost)} re-sent by the shop ({tag})"
        rc, log = dags_test(env, dag, {"resolve": "accept_gap", "reason": reason})
        assert rc == 0, log[-3000:]
        resolved = store.incidents.get(inc.id)
        assert resolved.resolved and resolved.reason == reason
        [(status,)] = query("SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (pipeline,))
        assert status != "lost", "the slot was not re-created"

        after = work.wave(6)
        rc, log = dags_test(env, dag)
        assert rc == 0 and task_ended(log, "deliver"), log[-3000:]

        # the sinks: the waves before and after, each change once, in order; the lost wave absent
        want = {**before, **after}
        changes = kafka_changes(kafka_bootstrap, f"{pipeline}.{table}")
        cached = [json.loads(e) for e in redis_events(redis_service.cdc, f"{pipeline}:{table}")]
        for sink, got in (("kafka", changes), ("redis", cached)):
            keys = [e["idempotency_key"] for e in got]
            assert len(keys) == len(set(keys)) == sum(map(len, want.values())), sink
            assert per_key(got) == want, sink
        # ... and a gap control message, once, with the incident's range and the reason
        controls = {"kafka": kafka_changes(kafka_bootstrap, f"{pipeline}.__control"),
                    "redis": [json.loads(e) for e in
                              redis_events(redis_service.cdc, f"{pipeline}:__control")]}
        for sink, msgs in controls.items():
            gaps = [m for m in msgs if m["type"] == "gap"]
            assert len(gaps) == 1, (sink, msgs)
            gap = gaps[0]
            assert gap["reason"] == reason and gap["incident"] == inc.id, (sink, gap)
            assert gap["from"]["lsn"] == str(inc.from_position.lsn), (sink, gap)
            assert gap["to"]["lsn"] == str(inc.to_position.lsn), (sink, gap)
        print(f"{len(changes)} changes delivered, {sum(map(len, lost.values()))} accepted as lost; "
              f"{time.monotonic() - t0:.0f}s")
    finally:
        query("ALTER SYSTEM RESET max_slot_wal_keep_size")
        query("ALTER SYSTEM RESET wal_keep_size")
        query("SELECT pg_reload_conf()")
        query("DROP TABLE IF EXISTS wal_filler")
        query("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
              (pipeline,))
        query(f"DROP TABLE IF EXISTS {table}")
        store.close()
        admin.close()
