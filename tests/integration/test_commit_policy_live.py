"""Commit policy against real servers: with the optional Redis sink down, the required Kafka
sink advances and Redis stays behind; the next run catches Redis up, without duplicates."""

from __future__ import annotations

import dataclasses
import textwrap
import uuid

import pymysql
import pytest
import redis
from tidegate import runner
from tidegate.parts import Parts
from tidegate.run import RunContext
from tidegate.spec import load_spec
from tidegate.store import open_store

from tests.integration.sink_readers import kafka_changes, redis_ids

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


def test_optional_redis_down_required_kafka_advances_redis_catches_up(mysql, kafka_bootstrap, kafka,
                                                                        redis_service, tmp_path):
    tag = uuid.uuid4().hex[:6]
    db, pipeline = f"cp_{tag}", f"cp_{tag}"
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent(f"""
        pipeline: {pipeline}
        source: {{kind: mysql, conn_id: src, tables: [{db}.t], server_id: 48310, start: head}}
        batch: {{max_events: 2}}
        sinks:
          - {{id: events, kind: kafka, conn_id: kafka, topic: "{{pipeline}}.{{table}}", exactly_once: true}}
          - {{id: cache, kind: redis, conn_id: redis, stream: "{{pipeline}}:{{table}}", required: false}}
    """))
    spec = load_spec(str(path))
    dead_redis = dataclasses.replace(redis_service.cdc, port=1)  # nothing listens there
    conns = {"src": mysql.cdc, "kafka": kafka.cdc, "redis": redis_service.cdc}
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    try:
        with admin.cursor() as c:
            c.execute(f"CREATE DATABASE {db}")
            c.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY)")
        runner.prepare_bounds(RunContext(spec, parts=Parts(conns.__getitem__),
                                         store=store))  # place at head
        with admin.cursor() as c:
            for i in range(1, 6):
                c.execute(f"INSERT INTO {db}.t VALUES ({i})")

        down = {**conns, "redis": dead_redis}.__getitem__
        report = runner.run_pipeline(RunContext(spec, run_id="r1", parts=Parts(down), store=store))
        sinks = {s["id"]: s for s in report["sinks"]}
        assert sinks["events"]["status"] == "ok" and sinks["events"]["events"] == 5
        assert sinks["cache"]["status"] == "failed" and sinks["cache"]["events"] == 0
        assert sinks["cache"]["error_class"] == "retryable"
        ckpt = store.checkpoints.current(pipeline)
        assert ckpt["events"].position > ckpt["cache"].position  # Redis stayed behind

        with admin.cursor() as c:
            c.execute(f"INSERT INTO {db}.t VALUES (6)")
        report = runner.run_pipeline(RunContext(spec, run_id="r2", parts=Parts(conns.__getitem__),
                                                store=store))
        sinks = {s["id"]: s for s in report["sinks"]}
        assert (sinks["events"]["events"], sinks["cache"]["events"]) == (1, 6)
        ckpt = store.checkpoints.current(pipeline)
        assert ckpt["events"].position == ckpt["cache"].position

        kafka_keys = [ch["idempotency_key"] for ch in kafka_changes(kafka_bootstrap, f"{pipeline}.t")]
        assert len(kafka_keys) == len(set(kafka_keys)) == 6
        assert redis_ids(redis_service.cdc, f"{pipeline}:t") == kafka_keys
    finally:
        with admin.cursor() as c:
            c.execute(f"DROP DATABASE IF EXISTS {db}")
        admin.close()
        store.close()
        r = redis.Redis(host="127.0.0.1", port=redis_service.port, username=redis_service.cdc.login,
                        password=redis_service.cdc.password)
        r.delete(f"{pipeline}:t")
        r.close()
