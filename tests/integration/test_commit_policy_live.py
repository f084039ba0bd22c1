"""Commit policy against real servers: with the optional Redis sink down, the required Kafka
sink advances and Redis stays behind; the next run catches Redis up, without duplicates."""

from __future__ import annotations

import dataclasses
import textwrap
import threading
import time
import uuid

import pymysql
import pytest
import redis
from tidegate import bounds_step
from tidegate.parts import Parts
from tidegate.run import RunContext
from tidegate.spec import load_spec
from tidegate.store import open_store

from tests.integration.nats_gate import NatsGate
from tests.integration.sink_readers import kafka_changes, redis_ids
from tests.runs import whole_run

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


def _kafka_and_optional_redis(tmp_path, pipeline: str, db: str, *, server_id: int, max_events: int):
    """A pipeline of ``{db}.t`` to a required Kafka topic (exactly once) and an optional Redis
    stream, from the head."""
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent(f"""
        pipeline: {pipeline}
        source: {{kind: mysql, conn_id: src, tables: [{db}.t], server_id: {server_id}, start: head}}
        batch: {{max_events: {max_events}}}
        sinks:
          - {{id: events, kind: kafka, conn_id: kafka, topic: "{{pipeline}}.{{table}}", exactly_once: true}}
          - {{id: cache, kind: redis, conn_id: redis, stream: "{{pipeline}}:{{table}}", required: false}}
    """))
    return load_spec(str(path))


def _table_placed_at_head(admin, db: str, run: RunContext) -> None:
    """``{db}.t`` created, and the pipeline's sinks placed at the head (``start: head``)."""
    with admin.cursor() as c:
        c.execute(f"CREATE DATABASE {db}")
        c.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY)")
    bounds_step.prepare_bounds(run)


def _four_thousand_rows_after_the_head(admin, db: str, run: RunContext) -> None:
    """The table placed at the head, then 400 transactions of 10 rows (80 sub-batches of 50)."""
    _table_placed_at_head(admin, db, run)
    with admin.cursor() as c:
        for i in range(0, 4000, 10):
            c.execute(f"INSERT INTO {db}.t VALUES " + ",".join(f"({i + k})" for k in range(10)))


def _r1_once_redis_has_a_sub_batch(run: RunContext, admin_redis, stream: str
                                   ) -> tuple[threading.Thread, list[dict]]:
    """``run`` started in a thread, returned once Redis holds its first sub-batch (50 entries),
    with the list its report will be put in."""
    reports: list[dict] = []
    thread = threading.Thread(target=lambda: reports.append(whole_run(run)))
    thread.start()
    while admin_redis.exists(stream) == 0 or admin_redis.xlen(stream) < 50:
        assert thread.is_alive(), "the run ended before Redis had its first sub-batch"
        time.sleep(0.001)
    return thread, reports


def _dropped(admin, db: str, store, admin_redis, stream: str) -> None:
    with admin.cursor() as c:
        c.execute(f"DROP DATABASE IF EXISTS {db}")
    admin.close()
    store.close()
    admin_redis.delete(stream)


def test_optional_redis_down_required_kafka_advances_redis_catches_up(mysql, kafka_bootstrap, kafka,
                                                                        redis_service, tmp_path):
    tag = uuid.uuid4().hex[:6]
    db, pipeline = f"cp_{tag}", f"cp_{tag}"
    spec = _kafka_and_optional_redis(tmp_path, pipeline, db, server_id=48310, max_events=2)
    dead_redis = dataclasses.replace(redis_service.cdc, port=1)  # nothing listens there
    conns = {"src": mysql.cdc, "kafka": kafka.cdc, "redis": redis_service.cdc}
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    try:
        _table_placed_at_head(admin, db, RunContext(spec, parts=Parts(conns.__getitem__), store=store))
        with admin.cursor() as c:
            for i in range(1, 6):
                c.execute(f"INSERT INTO {db}.t VALUES ({i})")

        down = {**conns, "redis": dead_redis}.__getitem__
        report = whole_run(RunContext(spec, run_id="r1", parts=Parts(down), store=store))
        sinks = {s["id"]: s for s in report["sinks"]}
        assert sinks["events"]["status"] == "ok" and sinks["events"]["events"] == 5
        assert sinks["cache"]["status"] == "failed" and sinks["cache"]["events"] == 0
        assert sinks["cache"]["error_class"] == "retryable"
        ckpt = store.checkpoints.current(pipeline)
        assert ckpt["events"].position > ckpt["cache"].position  # Redis stayed behind

        with admin.cursor() as c:
            c.execute(f"INSERT INTO {db}.t VALUES (6)")
        report = whole_run(RunContext(spec, run_id="r2", parts=Parts(conns.__getitem__),
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


def test_a_cleared_run_whose_optional_redis_failed_half_way_leaves_it_where_it_stopped(
        mysql, kafka_bootstrap, kafka, redis_service, tmp_path):
    """The optional Redis sink loses its right to XADD half way through a run (its ACL user is
    changed on the real server: every later XADD gets NOPERM); the run ends with Kafka at the
    head and Redis behind. Cleared, the run is replayed: Kafka gets its range again, Redis the
    shorter range it had, and the replay leaves Redis's checkpoint there, though it reads on for
    Kafka. The next run gives Redis every change it missed (before the fix, the replay moved Redis
    over them for good)."""
    tag = uuid.uuid4().hex[:6]
    db, pipeline, user, password = f"cr_{tag}", f"cr_{tag}", f"tg_{tag}", uuid.uuid4().hex
    stream = f"{pipeline}:t"
    admin_redis = redis.Redis(host="127.0.0.1", port=redis_service.port, username=redis_service.cdc.login,
                              password=redis_service.cdc.password)
    admin_redis.execute_command("ACL", "SETUSER", user, "on", f">{password}", "~*", "&*", "+@all")
    spec = _kafka_and_optional_redis(tmp_path, pipeline, db, server_id=48311, max_events=50)
    conns = {"src": mysql.cdc, "kafka": kafka.cdc,
             "redis": dataclasses.replace(redis_service.cdc, login=user, password=password)}
    parts = Parts(conns.__getitem__)
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    try:
        _four_thousand_rows_after_the_head(admin, db, RunContext(spec, parts=parts, store=store))

        run, reports = _r1_once_redis_has_a_sub_batch(RunContext(spec, run_id="r1", parts=parts, store=store),
                                                      admin_redis, stream)
        admin_redis.execute_command("ACL", "SETUSER", user, "-xadd")  # from now on: NOPERM
        run.join(120)
        sinks = {s["id"]: s for s in reports[0]["sinks"]}
        assert sinks["events"]["status"] == "ok" and sinks["events"]["events"] == 4000
        got = sinks["cache"]["events"]
        assert sinks["cache"]["status"] == "failed" and 0 < got < 4000, sinks["cache"]
        stopped = store.checkpoints.current(pipeline)["cache"].position
        head = store.checkpoints.current(pipeline)["events"].position
        assert stopped < head
        admin_redis.execute_command("ACL", "SETUSER", user, "+xadd")

        replay = whole_run(RunContext(spec, run_id="r1", parts=parts, store=store))  # cleared
        sinks = {s["id"]: s for s in replay["sinks"]}
        assert (sinks["events"]["events"], sinks["cache"]["events"]) == (4000, got)
        assert store.checkpoints.current(pipeline)["cache"].position == stopped  # not moved over the rest

        with admin.cursor() as c:
            c.execute(f"INSERT INTO {db}.t VALUES (4000)")
        r2 = whole_run(RunContext(spec, run_id="r2", parts=parts, store=store))
        sinks = {s["id"]: s for s in r2["sinks"]}
        assert (sinks["events"]["events"], sinks["cache"]["events"]) == (1, 4000 - got + 1)
        ckpt = store.checkpoints.current(pipeline)
        assert ckpt["events"].position == ckpt["cache"].position

        kafka_keys = [ch["idempotency_key"] for ch in kafka_changes(kafka_bootstrap, f"{pipeline}.t")]
        assert len(set(kafka_keys)) == 4001
        assert set(redis_ids(redis_service.cdc, stream)) == set(kafka_keys)  # every change, in both
    finally:
        _dropped(admin, db, store, admin_redis, stream)
        admin_redis.execute_command("ACL", "DELUSER", user)
        admin_redis.close()


def test_a_lost_redis_acknowledgement_is_credited_to_the_run_that_delivered_it(
        mysql, kafka_bootstrap, kafka, redis_service, tmp_path):
    """The optional Redis sink commits a sub-batch (its MULTI/EXEC runs on the real server) and
    the run never hears of it: a relay holds the EXEC's reply, then breaks the connection and
    refuses every later one, so the sink's retries fail and the run ends with Redis behind in
    the store. A later run adopts Redis's own record and credits the adopted stretch to the run
    that delivered it: a clear of that run re-sends all it gave Redis, the lost-ack sub-batch
    included (before the fix, the later run took the stretch as its own, and the clear left it
    out)."""
    tag = uuid.uuid4().hex[:6]
    db, pipeline = f"la_{tag}", f"la_{tag}"
    stream = f"{pipeline}:t"
    admin_redis = redis.Redis(host="127.0.0.1", port=redis_service.port, username=redis_service.cdc.login,
                              password=redis_service.cdc.password)
    spec = _kafka_and_optional_redis(tmp_path, pipeline, db, server_id=48312, max_events=50)
    conns = {"src": mysql.cdc, "kafka": kafka.cdc, "redis": redis_service.cdc}
    parts = Parts(conns.__getitem__)
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    try:
        _four_thousand_rows_after_the_head(admin, db, RunContext(spec, parts=parts, store=store))

        with NatsGate(redis_service.port, hold_on=b"EXEC") as gate:
            relayed = dataclasses.replace(redis_service.cdc, port=gate.port)
            gated = Parts({**conns, "redis": relayed}.__getitem__)
            run, reports = _r1_once_redis_has_a_sub_batch(
                RunContext(spec, run_id="r1", parts=gated, store=store), admin_redis, stream)
            gate.armed = True  # the next EXEC runs on the server; its reply stays in the relay
            assert gate.holding.wait(60), "no EXEC reached Redis after the relay was armed"
            time.sleep(0.2)  # the EXEC runs on the server
            gate.cut_and_refuse()
            run.join(120)
        sinks = {s["id"]: s for s in reports[0]["sinks"]}
        assert sinks["events"]["status"] == "ok" and sinks["events"]["events"] == 4000
        heard = sinks["cache"]["events"]
        held = admin_redis.xlen(stream)  # the sub-batch whose acknowledgement was lost included
        assert sinks["cache"]["status"] == "failed" and 0 < heard < held < 4000, (sinks["cache"], held)
        stopped = store.checkpoints.current(pipeline)["cache"].position

        with admin.cursor() as c:
            c.execute(f"INSERT INTO {db}.t VALUES (4000)")
        r2 = whole_run(RunContext(spec, run_id="r2", parts=parts, store=store))
        sinks = {s["id"]: s for s in r2["sinks"]}
        assert (sinks["events"]["events"], sinks["cache"]["events"]) == (1, 4000 - held + 1)  # adopted
        adopted = [v for v in store.checkpoints.history(pipeline, "cache") if v.kind == "adopt"]
        assert len(adopted) == 1 and adopted[0].position > stopped, adopted

        first = redis_ids(redis_service.cdc, stream)
        replay = whole_run(RunContext(spec, run_id="r1", parts=parts, store=store))  # cleared
        sinks = {s["id"]: s for s in replay["sinks"]}
        assert (sinks["events"]["events"], sinks["cache"]["events"]) == (4000, held)
        assert redis_ids(redis_service.cdc, stream)[len(first):] == first[:held]  # r1's part, again
        journal = {(e.run_id, e.mode): e.sinks["cache"] for e in store.runs.entries(pipeline)
                   if "cache" in e.sinks}
        assert journal["r1", "incremental"].end == adopted[0].position == journal["r2", "incremental"].start

        kafka_keys = [ch["idempotency_key"] for ch in kafka_changes(kafka_bootstrap, f"{pipeline}.t")]
        assert len(kafka_keys) == 2 * 4000 + 1 and set(first) == set(kafka_keys)
        assert len(first) == len(set(first)) == 4001  # before the replay: every change once
    finally:
        _dropped(admin, db, store, admin_redis, stream)
        admin_redis.close()
