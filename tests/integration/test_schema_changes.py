"""Schema changes in the stream, end to end through `tidegate run`, against the real servers.

MariaDB: ``ADD COLUMN`` and ``DROP COLUMN`` between rows of one run. Every sink (Kafka
exactly-once read with read_committed, NATS JetStream, Redis Streams) gets each row once with
its own columns and a ``schema_change`` message between them, in source order (Kafka and Redis
by the positions the messages carry, NATS by the one stream's order). With
``on_schema_change: halt`` a run delivers the rows before a DDL and halts with a
``schema_change`` incident; `tidegate run --resolve continue --reason ...` goes on past it (to
the next DDL, which halts again).

Every range is read in a reader process, as large ranges of `tidegate run` are.

PostgreSQL: the same for ``ADD COLUMN`` and ``TRUNCATE``, with the ALTER in a run of its own
and the first row with the new column in the next one: the column set remembered by the store
tells the change.
"""

from __future__ import annotations

import json
import random
import textwrap
import uuid

import psycopg2
import pymysql
import pytest
from tidegate import cli
from tidegate.plan import EXIT_FATAL
from tidegate.store import open_store

from tests.integration.sink_readers import kafka_changes, nats_stream, redis_events

pytestmark = pytest.mark.integration


@pytest.fixture()
def pipelines(tmp_path, monkeypatch, service_env, kafka, nats_service, redis_service):
    folder = tmp_path / "pipelines"
    folder.mkdir()
    monkeypatch.setenv("TIDEGATE_PIPELINES_DIR", str(folder))
    monkeypatch.setenv("TIDEGATE_CHECKPOINT_STORE", f"sqlite:///{tmp_path / 'ckpt.sqlite'}")
    # `tidegate run` reads every range in a reader process here, however small (reader_process.py):
    # the schema changes, the Postgres column memory and the halts cross the process boundary.
    monkeypatch.setenv("TIDEGATE_READER_PROCESS_MIN_BYTES", "0")
    return folder


def write_spec(folder, pipeline: str, source: str, policy: str) -> None:
    (folder / f"{pipeline}.yaml").write_text(textwrap.dedent(f"""
        pipeline: {pipeline}
        source: {{{source}, start: head, on_schema_change: {policy}}}
        sinks:
          - {{id: events, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}",
              exactly_once: true}}
          - {{id: bus, kind: nats, conn_id: cdc_nats, stream: {pipeline.upper()},
              subject: "{{pipeline}}.{{table}}"}}
          - {{id: cache, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:{{table}}"}}
    """))


def tidegate_run(capsys, *args: str) -> tuple[int, str]:
    """`tidegate run ...` (the console script's main, in this process): (exit code, stderr)."""
    rc = cli.main(["run", *args])
    return rc, capsys.readouterr().err


def step(item: dict) -> tuple:
    """A row as (op, its columns and values), a control message as (change, table, columns)."""
    if item.get("type") == "schema_change":
        return (item["change"], item["table"], [c["name"] for c in item["columns"] or []])
    return (item["op"], item["after"] if item["after"] is not None else item["before"])


def by_position(data: list[dict], control: list[dict], order) -> list[dict]:
    """Rows and control messages of two destinations, in source order by their positions (a
    PostgreSQL column change carries the position of the row it comes before)."""
    return sorted(data + control, key=lambda m: (order(m["source"]["position"]), 1) if "source" in m
                  else (order(m["position"]), 0))


def delivered(bootstrap, nats_conn, redis_conn, pipeline: str, table: str, order) -> dict[str, list[dict]]:
    """What each sink holds, in source order; each message once (checked by idempotency key)."""
    kafka = by_position(kafka_changes(bootstrap, f"{pipeline}.{table}"),
                        kafka_changes(bootstrap, f"{pipeline}.__control"), order)
    redis = by_position([json.loads(e) for e in redis_events(redis_conn, f"{pipeline}:{table}")],
                        [json.loads(e) for e in redis_events(redis_conn, f"{pipeline}:__control")], order)
    nats = [payload for subject, payload in nats_stream(nats_conn, pipeline.upper())
            if subject in (f"{pipeline}.{table}", f"{pipeline}.__control")]
    out = {"kafka": kafka, "nats": nats, "redis": redis}
    for sink, items in out.items():
        keys = [m["idempotency_key"] for m in items]
        assert len(keys) == len(set(keys)), sink
    return out


def assert_every_sink(got: dict[str, list[dict]], expected: list[tuple]) -> None:
    for sink, items in got.items():
        assert [step(m) for m in items] == expected, sink
    assert got["kafka"] == got["nats"] == got["redis"]  # the same bytes, the same ids


def incidents(pipeline: str) -> list:
    with open_store() as store:
        return store.incidents.all(pipeline)


# --------------------------------------------------------------------------- MariaDB


def binlog_order(p: dict) -> tuple:
    return int(p["file"].rsplit(".", 1)[1]), p["pos"], p.get("row", -1)


def test_mariadb_add_and_drop_column_between_rows(pipelines, capsys, mysql, kafka_bootstrap, nats_service,
                                                  redis_service):
    tag = uuid.uuid4().hex[:8]
    db, go, stop = f"sc_{tag}", f"scgo_{tag}", f"schalt_{tag}"
    source = f"kind: mysql, conn_id: cdc_mysql, tables: [{db}.t], server_id: {random.randint(100_000, 10**9)}"
    write_spec(pipelines, go, source, "continue")
    write_spec(pipelines, stop, source.replace("server_id: ", "server_id: 1"), "halt")
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))

    def sql(*stmts: str) -> None:
        with admin.cursor() as c:
            for s in stmts:
                c.execute(s)

    sql(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t (id INT PRIMARY KEY, a VARCHAR(10))")
    try:
        for p in (go, stop):  # the first runs place every sink at the head
            assert tidegate_run(capsys, p)[0] == 0
        sql(f"INSERT INTO {db}.t VALUES (1, 'x')", f"ALTER TABLE {db}.t ADD COLUMN b INT DEFAULT 5",
            f"INSERT INTO {db}.t VALUES (2, 'y', 6)", f"ALTER TABLE {db}.t DROP COLUMN a",
            f"UPDATE {db}.t SET b = 7 WHERE id = 1")
        expected = [("c", {"id": 1, "a": "x"}),
                    ("alter", "t", ["id", "a", "b"]),
                    ("c", {"id": 2, "a": "y", "b": 6}),
                    ("alter", "t", ["id", "b"]),
                    ("u", {"id": 1, "b": 7})]

        # on_schema_change: continue: one run, everything in order on every sink
        assert tidegate_run(capsys, go)[0] == 0
        got = delivered(kafka_bootstrap, nats_service.cdc, redis_service.cdc, go, "t", binlog_order)
        assert_every_sink(got, expected)
        ddl = [m for m in got["kafka"] if m.get("type") == "schema_change"]
        assert [m["ddl"] for m in ddl] == [f"ALTER TABLE {db}.t ADD COLUMN b INT DEFAULT 5",
                                           f"ALTER TABLE {db}.t DROP COLUMN a"]
        assert all(m["db"] == db and m["pipeline"] == go for m in ddl)

        # on_schema_change: halt: the rows before the DDL, then a halt with the incident
        rc, err = tidegate_run(capsys, stop)
        assert rc == EXIT_FATAL and "schema_change" in err
        [inc] = incidents(stop)
        assert inc.kind == "schema_change" and not inc.resolved and "ADD COLUMN b" in inc.detail
        assert_every_sink(delivered(kafka_bootstrap, nats_service.cdc, redis_service.cdc, stop, "t",
                                    binlog_order), expected[:1])
        assert tidegate_run(capsys, stop)[0] == EXIT_FATAL  # still halted: nothing moves without a resolve
        rc, err = tidegate_run(capsys, stop, "--resolve", "continue", "--reason", "consumers know b")
        assert rc == EXIT_FATAL and "DROP COLUMN a" in err  # past the ADD, halted at the DROP
        assert_every_sink(delivered(kafka_bootstrap, nats_service.cdc, redis_service.cdc, stop, "t",
                                    binlog_order), expected[:3])
        assert tidegate_run(capsys, stop, "--resolve", "continue", "--reason", "a is gone")[0] == 0
        got_stop = delivered(kafka_bootstrap, nats_service.cdc, redis_service.cdc, stop, "t", binlog_order)
        assert_every_sink(got_stop, expected)
        assert [(i.resolved, i.resolution, i.reason) for i in incidents(stop)] == [
            (True, "continue", "consumers know b"), (True, "continue", "a is gone")]
        # the messages are the same ones the other pipeline got (same ids but for the pipeline)
        assert [m["idempotency_key"] for m in got_stop["kafka"] if "type" in m] == \
            [m["idempotency_key"].replace(f"|{go}|", f"|{stop}|") for m in ddl]
    finally:
        sql(f"DROP DATABASE IF EXISTS {db}")
        admin.close()


# --------------------------------------------------------------------------- PostgreSQL


def lsn_order(p: dict) -> int:
    hi, lo = p["lsn"].split("/")
    return int(hi, 16) << 32 | int(lo, 16)


def test_postgres_add_column_and_truncate_between_rows(pipelines, capsys, postgres, kafka_bootstrap,
                                                       nats_service, redis_service):
    tag = uuid.uuid4().hex[:8]
    table, go, stop = f"sc_{tag}", f"scgo_{tag}", f"schalt_{tag}"
    source = f"kind: postgres, conn_id: cdc_postgres, tables: [public.{table}], slot: {{slot}}"
    write_spec(pipelines, go, source.format(slot=go), "continue")
    write_spec(pipelines, stop, source.format(slot=stop), "halt")
    admin = psycopg2.connect(postgres.admin_dsn)
    admin.autocommit = True

    def sql(*stmts: str) -> None:
        with admin.cursor() as c:
            for s in stmts:
                c.execute(s)

    sql(f"CREATE TABLE public.{table} (id int PRIMARY KEY, a text)")
    try:
        for p in (go, stop):  # the first runs create the slots and place the sinks at the head
            assert tidegate_run(capsys, p)[0] == 0
        sql(f"INSERT INTO public.{table} VALUES (1, 'x')")
        assert tidegate_run(capsys, go)[0] == 0
        sql(f"ALTER TABLE public.{table} ADD COLUMN b int DEFAULT 5")
        assert tidegate_run(capsys, go)[0] == 0  # a range with no row of the table
        sql(f"INSERT INTO public.{table} VALUES (2, 'y', 6)", f"TRUNCATE public.{table}",
            f"INSERT INTO public.{table} VALUES (3, 'z', 7)")
        expected = [("c", {"id": 1, "a": "x"}),
                    ("columns", table, ["id", "a", "b"]),
                    ("c", {"id": 2, "a": "y", "b": 6}),
                    ("truncate", table, ["id", "a", "b"]),
                    ("c", {"id": 3, "a": "z", "b": 7})]

        # continue: the ALTER came in an earlier run than its first row; the change still shows
        assert tidegate_run(capsys, go)[0] == 0
        got = delivered(kafka_bootstrap, nats_service.cdc, redis_service.cdc, go, table, lsn_order)
        assert_every_sink(got, expected)
        change = next(m for m in got["kafka"] if m.get("change") == "columns")
        assert change["columns"] == [{"name": "id", "type": "integer"}, {"name": "a", "type": "text"},
                                     {"name": "b", "type": "integer"}]
        assert change["previous_columns"] == change["columns"][:2] and change["schema"] == "public"

        # halt: stops before the column change, then before the TRUNCATE
        rc, err = tidegate_run(capsys, stop)
        assert rc == EXIT_FATAL and "schema_change" in err
        assert_every_sink(delivered(kafka_bootstrap, nats_service.cdc, redis_service.cdc, stop, table,
                                    lsn_order), expected[:1])
        rc, err = tidegate_run(capsys, stop, "--resolve", "continue", "--reason", "b has a default")
        assert rc == EXIT_FATAL and "truncate" in err
        assert_every_sink(delivered(kafka_bootstrap, nats_service.cdc, redis_service.cdc, stop, table,
                                    lsn_order), expected[:3])
        assert tidegate_run(capsys, stop, "--resolve", "continue", "--reason", "reloaded")[0] == 0
        assert_every_sink(delivered(kafka_bootstrap, nats_service.cdc, redis_service.cdc, stop, table,
                                    lsn_order), expected)
        add, truncate = incidents(stop)
        assert add.kind == truncate.kind == "schema_change"
        assert add.from_position < add.to_position <= truncate.from_position < truncate.to_position
    finally:
        sql(f"DROP TABLE IF EXISTS public.{table}",
            f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            f"WHERE slot_name IN ('{go}', '{stop}')")
        admin.close()
