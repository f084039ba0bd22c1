"""The PostgreSQL snapshot handoff without pg_monitor: a commit waiting for a synchronous
standby during the snapshot is delivered exactly once.

Such a commit is flushed to WAL (so before the handoff position the snapshot takes) and
invisible to new snapshots until the standby answers. The handoff used to find it through
pg_stat_activity's wait events, which show other roles' sessions only to pg_monitor /
pg_read_all_stats, after a 50 ms sleep: for a CDC role without pg_monitor the commit was
invisible to the query, the chunks were read without it and the log from the handoff did not
have it either. Here the CDC role is created without pg_monitor; the writer is another role.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import psycopg2
import pytest
from tidegate.connections import Connection
from tidegate.events import ChangeEvent
from tidegate.sources import make_source
from tidegate.spec import PipelineSpec, SourceSpec

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


@pytest.fixture()
def plain_role(postgres) -> Iterator[tuple[Connection, str, callable]]:
    """A CDC role with LOGIN REPLICATION and SELECT on a schema of its own, and nothing else (no
    pg_monitor, no pg_read_all_stats); the admin's statement runner; the schema."""
    admin = psycopg2.connect(postgres.admin_dsn)
    admin.autocommit = True
    suffix = uuid.uuid4().hex[:8]
    role, schema, password = f"plain_{suffix}", f"ho_{suffix}", uuid.uuid4().hex

    def ex(sql: str) -> None:
        with admin.cursor() as c:
            c.execute(sql)

    ex(f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD '{password}'")
    ex(f"CREATE SCHEMA {schema}")
    ex(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
    ex(f"ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} GRANT SELECT ON TABLES TO {role}")
    conn = Connection(**{**postgres.cdc.__dict__, "conn_id": "plain_cdc", "login": role,
                         "password": password})
    try:
        with admin.cursor() as c:
            c.execute("SELECT pg_has_role(%s, 'pg_read_all_stats', 'USAGE')", (role,))
            assert c.fetchone()[0] is False
        yield conn, schema, ex
    finally:
        ex(f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE "
           f"'ho\\_{suffix}%'")
        ex(f"DROP PUBLICATION IF EXISTS {schema}_pub")
        ex(f"DROP SCHEMA {schema} CASCADE")
        ex(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'")
        time.sleep(0.2)
        ex(f"DROP ROLE {role}")
        admin.close()


@pytest.mark.parametrize("plugin", ["wal2json", "pgoutput"])
def test_handoff_without_pg_monitor_delivers_a_sync_standby_commit_once(plain_role, postgres, plugin):
    conn, schema, ex = plain_role
    ex(f"CREATE TABLE {schema}.t (id int PRIMARY KEY, v int)")
    ex(f"ALTER TABLE {schema}.t REPLICA IDENTITY FULL")
    ex(f"INSERT INTO {schema}.t VALUES (1, 0), (2, 0)")
    ex(f"CREATE PUBLICATION {schema}_pub FOR TABLE {schema}.t")  # made by the admin: the table's owner
    spec = PipelineSpec(pipeline="ho_test", tenant="acme", sinks=(),
                        source=SourceSpec(kind="postgres", conn_id="plain_cdc", tables=(f"{schema}.t",),
                                          slot=schema + "_slot", plugin=plugin, publication=f"{schema}_pub"))
    src = make_source(spec, conn)
    src.replication_slot.ensure()
    [table] = src.snapshots().tables()
    waiter = psycopg2.connect(postgres.admin_dsn)  # the writer: another role than the CDC role's
    waiter.autocommit = True
    released: list[float] = []
    writer = threading.Thread(target=lambda: waiter.cursor().execute(
        f"UPDATE {schema}.t SET v = 1 WHERE id = 1"))
    release = None
    try:
        ex("ALTER SYSTEM SET synchronous_standby_names = 'tidegate_nobody'")
        ex("SELECT pg_reload_conf()")
        time.sleep(0.5)
        with waiter.cursor() as c:  # the setting reached the writer's session
            c.execute("SHOW synchronous_standby_names")
            assert c.fetchone()[0] == "tidegate_nobody"
        writer.start()
        time.sleep(0.5)
        assert writer.is_alive(), "the commit does not wait for the standby"
        handoff_at = src.head()  # the commit record is flushed: it lies before this position

        def release_later() -> None:
            time.sleep(2.0)
            released.append(time.monotonic())
            ex("ALTER SYSTEM RESET synchronous_standby_names")
            ex("SELECT pg_reload_conf()")

        release = threading.Thread(target=release_later)
        release.start()
        t0 = time.monotonic()
        handoff = src.snapshots().handoff(handoff_at)
        waited = time.monotonic() - t0
        upper, rows = src.snapshots().open_chunk(table, None, None)
        snapshot = {r["id"]: r["v"] for r in rows}
        log = [(e.key["id"], e.after["v"]) for e in src.read(handoff, src.head())
               if isinstance(e, ChangeEvent)]
        print(f"handoff waited {waited:.2f}s; chunk {snapshot}; log after the handoff {log}")
        # Per key: the snapshot row, then the log after the handoff; key 1's update exactly once.
        states = {k: [v] for k, v in snapshot.items()}
        for k, v in log:
            states.setdefault(k, []).append(v)
        assert states[1].count(1) == 1 and states[1][-1] == 1, states
        assert states[2] == [0], states
    finally:
        ex("ALTER SYSTEM RESET synchronous_standby_names")
        ex("SELECT pg_reload_conf()")
        writer.join(10)
        if release is not None:
            release.join(10)
        waiter.close()
        src.replication_slot.drop()
        src.close()
    assert not writer.is_alive()
