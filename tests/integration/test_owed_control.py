"""A control message a checkpoint version owes is delivered by the run that writes it, also when
the source range holds nothing new, end to end through `tidegate run` against the real servers.

An operator accepts a gap (a purged MariaDB binlog, a dropped PostgreSQL slot) and nothing is
written afterwards; a GTID failover to the MariaDB replica happens while the pipeline is idle.
The run that accepts the gap (or translates the failover) must put the ``gap`` (``failover``)
message on every sink's control channel (Kafka read with read_committed, NATS JetStream, Redis
Streams), once, and leave every checkpoint owing nothing, as a run with data does. Later runs
deliver no second message.
"""

from __future__ import annotations

import json
import textwrap
import time
import uuid

import psycopg2
import pymysql
import pytest
from tidegate import cli
from tidegate.sources.mysql.position import GtidSet
from tidegate.store import open_store

from tests.integration.sink_readers import kafka_changes, nats_payloads, redis_events
from tests.integration.test_smoke_mysql import purge_to

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

SINKS = ("events", "bus", "cache")


@pytest.fixture()
def pipelines(tmp_path, monkeypatch, service_env, kafka, nats_service, redis_service):
    folder = tmp_path / "pipelines"
    folder.mkdir()
    monkeypatch.setenv("TIDEGATE_PIPELINES_DIR", str(folder))
    monkeypatch.setenv("TIDEGATE_CHECKPOINT_STORE", f"sqlite:///{tmp_path / 'ckpt.sqlite'}")
    return folder


def write_spec(folder, pipeline: str, source: str) -> None:
    (folder / f"{pipeline}.yaml").write_text(textwrap.dedent(f"""
        pipeline: {pipeline}
        source: {{{source}, start: head}}
        sinks:
          - {{id: events, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}",
              exactly_once: true}}
          - {{id: bus, kind: nats, conn_id: cdc_nats, stream: {pipeline.upper()},
              subject: "{{pipeline}}.{{table}}"}}
          - {{id: cache, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:{{table}}"}}
    """))


def tidegate_run(capsys, pipeline: str, *args: str) -> tuple[int, dict | None, str]:
    """`tidegate run PIPELINE ...` in this process: (exit code, its JSON report, stderr)."""
    rc = cli.main(["run", pipeline, *args])
    out = capsys.readouterr()
    return rc, json.loads(out.out) if out.out.strip() else None, out.err


def control_messages(pipeline: str, kafka_bootstrap: str, nats, redis) -> dict[str, list[dict]]:
    """What each sink's control channel holds, as its consumers read it."""
    return {"events": kafka_changes(kafka_bootstrap, f"{pipeline}.__control"),
            "bus": nats_payloads(nats, pipeline.upper(), f"{pipeline}.__control"),
            "cache": [json.loads(e) for e in redis_events(redis, f"{pipeline}:__control")]}


def assert_settled(pipeline: str, upto_at_least) -> None:
    """Every sink's current version owes nothing and sits at or past ``upto_at_least``."""
    with open_store() as store:
        ckpts = store.checkpoints.current(pipeline)
    for sid in SINKS:
        assert ckpts[sid].control is None, (sid, ckpts[sid])
        assert not ckpts[sid].position < upto_at_least, (sid, ckpts[sid].position, upto_at_least)


def test_accepted_purge_with_nothing_new_tells_every_sink_once(pipelines, capsys, mysql, kafka_bootstrap,
                                                              nats_service, redis_service):
    tag = uuid.uuid4().hex[:8]
    db, pipeline = f"owed_{tag}", f"owed_gap_{tag}"
    write_spec(pipelines, pipeline, f"kind: mysql, conn_id: cdc_mysql, tables: [{db}.t], server_id: 48411")
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))

    def sql(*stmts: str) -> None:
        with admin.cursor() as c:
            for st in stmts:
                c.execute(st)

    try:
        sql(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(20))")
        assert tidegate_run(capsys, pipeline)[0] == 0  # placed at the head
        sql(f"INSERT INTO {db}.t VALUES (1, 'a')")
        rc, report, err = tidegate_run(capsys, pipeline)
        assert rc == 0 and report["events"] == 1, err
        sql(f"INSERT INTO {db}.t VALUES (2, 'lost')", "FLUSH BINARY LOGS")
        with admin.cursor() as c:
            c.execute("SHOW MASTER STATUS")
            newest = c.fetchone()[0]
        purge_to(admin, newest)
        rc, _, err = tidegate_run(capsys, pipeline)
        assert rc != 0 and "binlog_purged" in err, err
        with open_store() as store:
            (inc,) = store.incidents.all(pipeline)

        # Nothing is written to the table from here on.
        rc, report, err = tidegate_run(capsys, pipeline, "--resolve", "accept_gap",
                                       "--reason", "row 2 re-sent")
        assert rc == 0, err
        control = control_messages(pipeline, kafka_bootstrap, nats_service.cdc, redis_service.cdc)
        for sid in SINKS:
            assert [(m["type"], m["incident"], m["reason"]) for m in control[sid]] == [
                ("gap", inc.id, "row 2 re-sent")], sid
            assert control[sid][0]["from"] == inc.from_position.to_json(), sid
        assert_settled(pipeline, inc.to_position)

        assert tidegate_run(capsys, pipeline)[0] == 0  # nothing owed any more: no second message
        sql(f"INSERT INTO {db}.t VALUES (3, 'after')")
        rc, report, err = tidegate_run(capsys, pipeline)
        assert rc == 0 and report["events"] == 1, err
        control = control_messages(pipeline, kafka_bootstrap, nats_service.cdc, redis_service.cdc)
        assert {sid: [m["type"] for m in msgs] for sid, msgs in control.items()} == {
            sid: ["gap"] for sid in SINKS}
        rows = kafka_changes(kafka_bootstrap, f"{pipeline}.t")
        assert [r["after"]["id"] for r in rows] == [1, 3]
    finally:
        sql(f"DROP DATABASE IF EXISTS {db}")
        admin.close()


def test_accepted_slot_loss_with_nothing_new_tells_every_sink_once(pipelines, capsys, postgres,
                                                                  kafka_bootstrap, nats_service,
                                                                  redis_service):
    name = f"owed_{uuid.uuid4().hex[:8]}"
    write_spec(pipelines, name, f"kind: postgres, conn_id: cdc_postgres, slot: {name}, "
                                f"tables: [public.{name}]")
    admin = psycopg2.connect(postgres.admin_dsn)
    admin.autocommit = True

    def sql(*stmts: str) -> None:
        with admin.cursor() as c:
            for st in stmts:
                c.execute(st)

    try:
        sql(f"CREATE TABLE {name} (id int PRIMARY KEY, v text)", f"ALTER TABLE {name} REPLICA IDENTITY FULL")
        assert tidegate_run(capsys, name)[0] == 0  # creates the slot, placed at the head
        sql(f"INSERT INTO {name} VALUES (1, 'a')")
        rc, report, err = tidegate_run(capsys, name)
        assert rc == 0 and report["events"] == 1, err
        sql(f"SELECT pg_drop_replication_slot('{name}')", f"INSERT INTO {name} VALUES (2, 'lost')")
        rc, _, err = tidegate_run(capsys, name)
        assert rc != 0 and "slot_dropped" in err, err
        with open_store() as store:
            (inc,) = store.incidents.all(name)

        rc, report, err = tidegate_run(capsys, name, "--resolve", "accept_gap", "--reason", "slot lost")
        assert rc == 0, err
        control = control_messages(name, kafka_bootstrap, nats_service.cdc, redis_service.cdc)
        for sid in SINKS:
            assert [(m["type"], m["incident"], m["kind"]) for m in control[sid]] == [
                ("gap", inc.id, "slot_dropped")], sid
        assert_settled(name, inc.to_position)
        assert tidegate_run(capsys, name)[0] == 0
        control = control_messages(name, kafka_bootstrap, nats_service.cdc, redis_service.cdc)
        assert {sid: len(msgs) for sid, msgs in control.items()} == {sid: 1 for sid in SINKS}
    finally:
        sql(f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            f"WHERE slot_name = '{name}'", f"DROP TABLE IF EXISTS {name}")
        admin.close()


def test_gtid_failover_of_an_idle_pipeline_tells_every_sink_once(pipelines, capsys, mysql, mysql_replica,
                                                                kafka_bootstrap, nats_service, redis_service):
    tag = uuid.uuid4().hex[:8]
    db, pipeline = f"owed_{tag}", f"owed_fo_{tag}"
    source = f"kind: mysql, tables: [{db}.t], server_id: 48412"
    write_spec(pipelines, pipeline, f"conn_id: cdc_mysql, {source}")
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    try:
        with admin.cursor() as c:
            c.execute(f"CREATE DATABASE {db}")
            c.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(20))")
            assert tidegate_run(capsys, pipeline)[0] == 0
            c.execute(f"INSERT INTO {db}.t VALUES (1, 'a')")
            assert tidegate_run(capsys, pipeline)[0] == 0
            c.execute("SELECT @@gtid_binlog_pos")
            primary = GtidSet.parse(c.fetchone()[0])
        replica = pymysql.connect(**mysql_replica.mysql_kwargs(autocommit=True))
        deadline = time.monotonic() + 30
        with replica.cursor() as c:
            while True:  # the replica has every transaction of the checkpoints
                c.execute("SELECT @@gtid_slave_pos")
                if GtidSet.parse(c.fetchone()[0]).contains(primary):
                    break
                assert time.monotonic() < deadline, "the replica did not catch up"
                time.sleep(0.1)
        replica.close()

        write_spec(pipelines, pipeline, f"conn_id: cdc_mysql_replica, {source}")  # the failover
        rc, report, err = tidegate_run(capsys, pipeline)
        assert rc == 0, err
        with open_store() as store:
            (inc,) = store.incidents.all(pipeline)
        assert (inc.kind, inc.resolution) == ("failover", "auto")
        control = control_messages(pipeline, kafka_bootstrap, nats_service.cdc, redis_service.cdc)
        for sid in SINKS:
            assert [(m["type"], m["incident"]) for m in control[sid]] == [("failover", inc.id)], sid
        assert_settled(pipeline, inc.to_position)
        assert tidegate_run(capsys, pipeline)[0] == 0
        control = control_messages(pipeline, kafka_bootstrap, nats_service.cdc, redis_service.cdc)
        assert {sid: len(msgs) for sid, msgs in control.items()} == {sid: 1 for sid in SINKS}
    finally:
        with admin.cursor() as c:
            c.execute(f"DROP DATABASE IF EXISTS {db}")
        admin.close()
