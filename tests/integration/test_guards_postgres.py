"""Continuity guards against real PostgreSQL faults: a dropped slot halts with the exact range
until the gap is accepted (slot recreated, checkpoints moved); a promoted standby halts."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid

import psycopg2
import pytest
from tidegate import guards
from tidegate.errors import SlotMissingError
from tidegate.events import ChangeEvent
from tidegate.parts import Parts
from tidegate.run import RunContext
from tidegate.spec import load_spec
from tidegate.store import open_store

from tests.conftest import SERVICES

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


@pytest.fixture()
def setup(postgres, tmp_path):
    name = "guard_" + uuid.uuid4().hex[:8]
    admin = psycopg2.connect(postgres.admin_dsn)
    admin.autocommit = True
    with admin.cursor() as c:
        c.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text)")
        c.execute(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
    path = tmp_path / "g.yaml"
    path.write_text(textwrap.dedent(f"""
        pipeline: {name}
        source: {{kind: postgres, conn_id: src, slot: {name}, tables: [public.{name}]}}
        sinks:
          - {{id: a, kind: redis, conn_id: r, stream: "s"}}
    """))
    spec = load_spec(str(path))
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    yield spec, store, admin, name
    with admin.cursor() as c:
        c.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                  "WHERE slot_name = %s", (name,))
        c.execute(f"DROP TABLE IF EXISTS {name}")
    admin.close()
    store.close()


def insert(admin, table, ids):
    with admin.cursor() as c:
        for i in ids:
            c.execute(f"INSERT INTO {table} VALUES (%s, %s)", (i, f"v{i}"))


def ids(source, start, upto):
    return [e.after["id"] for e in source.read(start, upto) if isinstance(e, ChangeEvent)]


def test_dropped_slot_halts_with_exact_range_until_gap_accepted(setup, postgres):
    spec, store, admin, table = setup
    lookup = {"src": postgres.cdc}.__getitem__
    assert guards.guard_retention(RunContext(spec, run_id="r0", parts=Parts(lookup),
                                             store=store))["status"] == "created"
    source = Parts(lookup).source(spec)
    insert(admin, table, [1, 2])
    checkpoint = source.head()
    assert ids(source, None, checkpoint) == [1, 2]
    epoch = store.leases.acquire(spec.pipeline, "r1")
    store.checkpoints.write_many(spec.pipeline, {"a": checkpoint}, run_id="r1", epoch=epoch)
    assert guards.guard_retention(RunContext(spec, run_id="r1", parts=Parts(lookup),
                                             store=store))["status"] == "ok"

    with admin.cursor() as c:
        c.execute("SELECT pg_drop_replication_slot(%s)", (table,))
    insert(admin, table, [3])  # written while no slot exists: lost for CDC
    with pytest.raises(guards.ContinuityHalt) as halt:
        guards.guard_retention(RunContext(spec, run_id="r2", parts=Parts(lookup), store=store))
    inc = halt.value.incident
    assert inc.kind == "slot_dropped" and inc.from_position == checkpoint
    assert inc.to_position > checkpoint and inc.to_position <= source.head()
    with pytest.raises(guards.ContinuityHalt):
        guards.check_halted(RunContext(spec, store=store))

    done = guards.resolve_incidents(RunContext(spec, run_id="r3", parts=Parts(lookup), store=store),
                                               resolution="accept_gap", reason="row 3 re-sent by the app",
                                               who="bob")
    assert [(d["kind"], d["resolution"], d["reason"]) for d in done] == [
        ("slot_dropped", "accept_gap", "row 3 re-sent by the app")]
    guards.check_halted(RunContext(spec, store=store))
    assert guards.guard_retention(RunContext(spec, run_id="r4", parts=Parts(lookup),
                                             store=store))["status"] == "ok"
    moved = store.checkpoints.get(spec.pipeline, "a").position
    assert moved >= inc.to_position  # past the missing range, at the new slot's start
    insert(admin, table, [4])
    assert ids(source, moved, source.head()) == [4]  # the recreated slot serves what follows
    source.close()


def wait_replayed(standby_cursor, lsn, timeout: float = 30) -> None:
    """Until the standby has replayed the primary's WAL up to ``lsn``."""
    deadline = time.monotonic() + timeout
    while True:
        standby_cursor.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (str(lsn.lsn),))
        if standby_cursor.fetchone()[0]:
            return
        assert time.monotonic() < deadline, f"the standby did not replay up to {lsn}"
        time.sleep(0.05)


def test_promoted_standby_is_detected_and_halts(setup, postgres, postgres_standby):
    spec, store, admin, table = setup
    primary = {"src": postgres.cdc}.__getitem__
    standby = {"src": postgres_standby.cdc}.__getitem__
    guards.guard_retention(RunContext(spec, run_id="r0", parts=Parts(primary), store=store))
    assert guards.guard_failover(RunContext(spec, run_id="r0", parts=Parts(primary),
                                            store=store))["status"] == "recorded"
    source = Parts(primary).source(spec)
    checkpoint = source.head()
    source.close()
    epoch = store.leases.acquire(spec.pipeline, "r1")
    store.checkpoints.write_many(spec.pipeline, {"a": checkpoint}, run_id="r1", epoch=epoch)
    assert guards.guard_failover(RunContext(spec, run_id="r1", parts=Parts(primary),
                                            store=store))["status"] == "ok"
    insert(admin, table, [1, 2, 3])  # a run's bounds, taken on the primary: (checkpoint, upto]
    source = Parts(primary).source(spec)
    upto = source.head()
    source.close()

    conn = psycopg2.connect(postgres_standby.admin_dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as c:
            wait_replayed(c, upto)
            c.execute("SELECT pg_promote(true, 30)")
            c.execute("CHECKPOINT")
        with pytest.raises(guards.ContinuityHalt) as halt:
            guards.guard_failover(RunContext(spec, run_id="r2", parts=Parts(standby), store=store))
        inc = halt.value.incident
        assert inc.kind == "failover" and inc.from_position == checkpoint
        assert "from timeline 1 to 2: a standby was promoted" in inc.detail
        assert inc.to_position.timeline == 2 and inc.to_position.system_id == checkpoint.system_id
        with pytest.raises(guards.ContinuityHalt):
            guards.check_halted(RunContext(spec, store=store))
        # That run's deliver task retried after the connection moved (Airflow retries the task,
        # not the DAG run's guards): the promoted server has no slot of the pipeline, and the
        # read refuses before any row.
        promoted, read = Parts(standby).source(spec), []
        with pytest.raises(SlotMissingError, match="does not exist on cdc_postgres_standby"):
            read.extend(promoted.read(checkpoint, upto))
        assert read == []
        promoted.close()
    finally:
        conn.close()
        subprocess.run([sys.executable, str(SERVICES), "reset", "postgres_standby"], check=True,
                       capture_output=True)
