"""PostgreSQL does what the logical-decoding source and the failover guard rely on."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import psycopg2
import pytest

from tests.conftest import SERVICES

pytestmark = pytest.mark.integration

WAL2JSON_OPTS = "'format-version','2','include-lsn','1','include-xids','1'"


@pytest.fixture()
def admin(postgres):
    conn = psycopg2.connect(postgres.admin_dsn)
    conn.autocommit = True
    yield conn
    conn.close()


def q(conn, sql, *args):
    with conn.cursor() as c:
        c.execute(sql, args)
        return c.fetchall() if c.description else None


def test_peek_bounded_by_upto_lsn_returns_exactly_the_changes_up_to_it(postgres, admin):
    table, slot = "smoke_" + uuid.uuid4().hex[:8], "smoke_" + uuid.uuid4().hex[:8]
    q(admin, f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
    q(admin, "SELECT pg_create_logical_replication_slot(%s, 'wal2json')", slot)
    try:
        q(admin, f"INSERT INTO {table} VALUES (1, 'a'), (2, 'b')")
        q(admin, f"UPDATE {table} SET v = 'bb' WHERE id = 2")
        bound = q(admin, "SELECT pg_current_wal_lsn()::text")[0][0]
        q(admin, f"INSERT INTO {table} VALUES (3, 'after the bound')")

        # The CDC login (REPLICATION, no superuser) peeks.
        cdc = psycopg2.connect(postgres.cdc_dsn)
        rows = q(cdc, f"SELECT lsn::text, xid::text, data FROM pg_logical_slot_peek_changes("
                      f"%s, %s::pg_lsn, NULL, {WAL2JSON_OPTS})", slot, bound)
        cdc.close()
        changes = [json.loads(d) for _, _, d in rows]
        kinds = [c["action"] for c in changes]
        assert kinds == ["B", "I", "I", "C", "B", "U", "C"]
        data = [(c["action"], [col["value"] for col in c["columns"]])
                for c in changes if c["action"] in "IU"]
        assert data == [("I", [1, "a"]), ("I", [2, "b"]), ("U", [2, "bb"])]
        assert all("xid" in c for c in changes if c["action"] == "B")

        q(admin, "SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", slot, bound)
        confirmed = q(admin, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                             "WHERE slot_name = %s", slot)[0][0]
        assert confirmed == bound
        rest = q(admin, f"SELECT data FROM pg_logical_slot_peek_changes(%s, NULL, NULL, {WAL2JSON_OPTS})",
                 slot)
        inserts = [json.loads(d) for (d,) in rest]
        assert [[c["value"] for c in ch["columns"]] for ch in inserts if ch["action"] == "I"] == [
            [3, "after the bound"]]
    finally:
        q(admin, "SELECT pg_drop_replication_slot(%s)", slot)
        q(admin, f"DROP TABLE {table}")


def test_standby_replays_and_promotion_moves_it_to_a_new_timeline(postgres, postgres_standby, admin):
    table = "smoke_" + uuid.uuid4().hex[:8]
    q(admin, f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
    q(admin, f"INSERT INTO {table} VALUES (1, 'replayed')")
    standby = psycopg2.connect(postgres_standby.admin_dsn)
    standby.autocommit = True
    try:
        system_id = q(admin, "SELECT system_identifier::text FROM pg_control_system()")[0][0]
        assert q(standby, "SELECT system_identifier::text FROM pg_control_system()")[0][0] == system_id
        deadline = time.monotonic() + 20
        while not q(standby, f"SELECT to_regclass('{table}') IS NOT NULL")[0][0] or \
                not q(standby, f"SELECT count(*) FROM {table}")[0][0]:
            assert time.monotonic() < deadline, "standby did not replay the insert"
            time.sleep(0.1)
        assert q(standby, f"SELECT id, v FROM {table}") == [(1, "replayed")]
        assert q(standby, "SELECT pg_is_in_recovery()")[0][0] is True
        before = q(standby, "SELECT timeline_id FROM pg_control_checkpoint()")[0][0]

        assert q(standby, "SELECT pg_promote(true, 30)")[0][0] is True
        q(standby, "CHECKPOINT")
        assert q(standby, "SELECT pg_is_in_recovery()")[0][0] is False
        assert q(standby, "SELECT timeline_id FROM pg_control_checkpoint()")[0][0] == before + 1
    finally:
        standby.close()
        q(admin, f"DROP TABLE {table}")
        # Promotion made it a primary of its own: rebuild the standby for later tests.
        subprocess.run([sys.executable, str(SERVICES), "reset", "postgres_standby"], check=True,
                       capture_output=True)
