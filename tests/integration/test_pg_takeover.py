"""A stalled PostgreSQL run does not block its pipeline: the next run takes the slot over.

A `tidegate run` SIGSTOPped (its whole process group) while it streams the slot keeps its WAL
sender, and the slot stays active for that sender's pid: without a takeover every later run
failed with ``replication slot "..." is active for PID N``. Here a second run, started while
the first is still stopped, must take the lease and the slot (it terminates the WAL sender of
the older lease epoch), deliver everything within a bounded time, and the first, once resumed,
must write nothing anywhere, move no checkpoint and exit non-zero naming that it was fenced
or lost its replication connection.

Oracle: every change of the workload exactly once per sink, in commit order per key (Kafka
exactly-once through a read_committed consumer; Redis by idempotency_key), and the store's
checkpoint history unchanged by the resumed run (no checkpoint moved back or at all).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import psycopg2.extras
import pytest
from tidegate.store import open_store

from tests.integration.airflow_support import VENV_BIN, per_key
from tests.integration.sink_readers import kafka_changes, redis_events
from tests.integration.test_fault_matrix import Run, Workload, store_writable, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

SINKS = ("events", "cache")
TAKEOVER_S = 60  # the second run must finish within this, though the first still holds the slot
# source.stall_timeout: a WAL sender blocked sending to the stopped run (its socket full) cannot be
# terminated; the server's kernel drops its connection after this (tcp_user_timeout)
STALL = "5s"


class PgPipeline:
    def __init__(self, name: str, base: Path, env: dict[str, str], kafka: str, redis_conn, admin_dsn: str):
        self.name, self.base, self.env, self.kafka, self.redis = name, base, env, kafka, redis_conn
        self.db = psycopg2.connect(admin_dsn)
        self.db.autocommit = True
        self.store = open_store(env["TIDEGATE_CHECKPOINT_STORE"])
        self.work = Workload(self.execute, name)
        self.wave_size = 600

    def execute(self, stmt: str) -> None:
        with self.db.cursor() as c:
            c.execute(stmt)

    def query(self, sql: str, args=None) -> list[tuple]:
        with self.db.cursor() as c:
            c.execute(sql, args)
            return c.fetchall()

    def run(self, run_id: str, timeout: float = 240) -> subprocess.CompletedProcess:
        return subprocess.run([str(VENV_BIN / "tidegate"), "run", self.name, "--run-id", run_id],
                              env=self.env, capture_output=True, text=True, timeout=timeout)

    def start(self, run_id: str) -> Run:
        return Run.start(self.name, run_id, self.env, self.base / f"{run_id}.log")

    def writes(self, run_id: str) -> int:
        return sum(1 for h in self.store.checkpoints.history(self.name, "events")
                   if h.kind == "write" and h.run_id == run_id)

    def history(self) -> dict[str, list[tuple]]:
        return {sid: [(h.version, h.kind, h.run_id, h.epoch, str(h.position))
                      for h in self.store.checkpoints.history(self.name, sid)] for sid in SINKS}

    def contents(self) -> dict[str, list[dict]]:
        return {"kafka": kafka_changes(self.kafka, f"{self.name}.{self.name}"),
                "redis": [json.loads(e) for e in redis_events(self.redis, f"{self.name}:{self.name}")]}

    def slot_holder(self) -> tuple | None:
        rows = self.query("SELECT s.active_pid, a.application_name FROM pg_replication_slots s LEFT JOIN "
                          "pg_stat_activity a ON a.pid = s.active_pid WHERE s.slot_name = %s", (self.name,))
        return rows[0] if rows and rows[0][0] is not None else None

    def close(self) -> None:
        self.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                     f"WHERE slot_name = '{self.name}' AND active_pid IS NOT NULL")
        time.sleep(0.5)
        self.execute(f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                     f"WHERE slot_name = '{self.name}'")
        self.execute(f"DROP TABLE IF EXISTS {self.name}")
        self.db.close()
        self.store.close()


# How the stalled run reads: in its own process (a small range: the default), or in its reader
# process (TIDEGATE_READER_PROCESS_MIN_BYTES=0), which reads up to ~6000 items ahead of delivery:
# there the range must be larger than that for the WAL sender still to hold the slot when stopped.
# The reader process reads at most about 5 MB ahead of what the run took (reader_process.py):
# the wave must hold well more WAL than that, or under load the reader reads it all and lets the
# slot go before the run is stopped, and there is nothing to take over (8,000 rows of about 700
# bytes of wal2json each did not always).
READS = {"in-process": {"wave": 600, "max_events": 10, "env": {}},
         "reader-process": {"wave": 20000, "max_events": 200,
                            "env": {"TIDEGATE_READER_PROCESS_MIN_BYTES": "0"}}}


@pytest.fixture()
def pg_pipeline(request, tmp_path, service_env, postgres, kafka, redis_service) -> Iterator[PgPipeline]:
    reads = READS[getattr(request, "param", "in-process")]
    name = f"tk_{uuid.uuid4().hex[:6]}"
    (tmp_path / "pipelines").mkdir()
    env = dict(os.environ, **service_env, TIDEGATE_PIPELINES_DIR=str(tmp_path / "pipelines"),
               TIDEGATE_CHECKPOINT_STORE=f"sqlite:///{tmp_path / 'store.sqlite'}",
               PATH=f"{VENV_BIN}:{os.environ['PATH']}", **reads["env"])
    (tmp_path / "pipelines" / f"{name}.yaml").write_text(textwrap.dedent(f"""
        pipeline: {name}
        source: {{kind: postgres, conn_id: cdc_postgres, tables: [public.{name}], slot: {name},
                  stall_timeout: {STALL}}}
        batch: {{max_events: {reads["max_events"]}}}
        sinks:
          - {{id: events, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}",
              exactly_once: true, partitions: 3}}
          - {{id: cache, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:{{table}}"}}
    """))
    p = PgPipeline(name, tmp_path, env, kafka.cdc.extra["bootstrap.servers"], redis_service.cdc,
                   postgres.admin_dsn)
    p.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, status text, note text NOT NULL DEFAULT "
              f"'{'x' * 500}')")
    p.execute(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
    p.wave_size = reads["wave"]
    try:
        yield p
    finally:
        p.close()


def stop_mid_delivery(p: PgPipeline, run: Run) -> None:
    """SIGSTOP the run's process group right after it committed a sub-batch, while its WAL
    sender holds the slot, and not inside a store write transaction (that would block the
    store for everyone: not the fault under test)."""
    wait_for(lambda: p.writes(run.run_id) >= 2, "the first run committed 2 sub-batches", run=run)
    for _ in range(20):
        seen = p.writes(run.run_id)
        while p.writes(run.run_id) == seen:
            assert run.proc.poll() is None, f"the run ended before it was stopped:\n{run.output()[-3000:]}"
        run.signal(signal.SIGSTOP)
        if store_writable(p.base / "store.sqlite"):
            return
        run.signal(signal.SIGCONT)
    raise AssertionError("the run held the store's write lock whenever it was stopped")


@pytest.mark.parametrize("pg_pipeline", list(READS), indirect=True)
def test_stalled_run_slot_taken_over_by_the_next_run(pg_pipeline):
    p = pg_pipeline
    placed = p.run("place")
    assert placed.returncode == 0, placed.stderr[-3000:]
    p.work.wave(p.wave_size)
    stalled = p.start("stalled")
    try:
        stop_mid_delivery(p, stalled)
        holder = p.slot_holder()
        assert holder is not None, "the stalled run's WAL sender does not hold the slot"
        at_stop = p.writes("stalled")
        p.work.wave(60)  # more rows while the first run is stopped

        t0 = time.monotonic()
        second = p.run("takeover", timeout=TAKEOVER_S)
        took = time.monotonic() - t0
        print(f"slot held by {holder} when stopped after {at_stop} sub-batches; the second run: "
              f"rc={second.returncode} in {took:.1f}s: "
              f"{[ln for ln in second.stderr.splitlines() if ln.startswith('tidegate: ')][-1:]}")
        assert second.returncode == 0, second.stderr[-3000:]
        took_over = f"took replication slot {p.name!r} over from PID {holder[0]}"
        assert took_over in second.stderr, second.stderr[-3000:]
        caught = p.run("after")
        assert caught.returncode == 0, caught.stderr[-3000:]
        assert json.loads(caught.stdout).get("nothing_to_do"), caught.stdout
        before, history = p.contents(), p.history()

        stalled.signal(signal.SIGCONT)
        rc = stalled.wait(120)
    finally:
        stalled.signal(signal.SIGKILL)
    out = stalled.output()
    after = p.contents()
    print(f"the resumed run: rc={rc}; its last line: "
          f"{[ln for ln in out.splitlines() if ln.startswith('tidegate: ')][-1:]}")
    assert {k: len(v) for k, v in after.items()} == {k: len(v) for k, v in before.items()}, \
        "the resumed run wrote to a sink"
    assert p.history() == history, "a checkpoint moved after the takeover"
    assert rc != 0 and re.search(r"^tidegate: .*(fenced|another run took|replication connection)", out,
                                 re.M), out[-4000:]
    for sink, events in after.items():
        ids = [e["idempotency_key"] for e in events]
        assert len(ids) == len(set(ids)) == p.work.changes, (sink, len(ids), len(set(ids)), p.work.changes)
        assert per_key(events) == p.work.expected, sink
    for sid in SINKS:  # checkpoints never moved back
        lsns = [h.position.lsn for h in p.store.checkpoints.history(p.name, sid)]
        assert lsns == sorted(lsns), (sid, [str(x) for x in lsns])


def hold_slot(dsn: str, slot: str, application_name: str):
    """A replication session holding ``slot`` (started, never read, never confirming anything:
    it cannot move the slot), as a client other than the run would."""
    conn = psycopg2.connect(dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection,
                            application_name=application_name, options="-c wal_sender_timeout=0")
    conn.cursor().start_replication(slot_name=slot, decode=False, status_interval=366 * 86400)
    return conn


def run_error(r: subprocess.CompletedProcess) -> str:
    return ([ln for ln in r.stderr.splitlines() if ln.startswith("tidegate: ")] or [r.stderr[-2000:]])[-1]


def test_slot_held_by_another_client_is_an_error_naming_it(pg_pipeline, postgres):
    """Not a run of this pipeline: the run refuses to touch it, names the pid and the
    application, and moves nothing."""
    p = pg_pipeline
    assert p.run("place").returncode == 0
    p.work.wave(5)
    holder = hold_slot(postgres.admin_dsn, p.name, "etl-tool")
    try:
        pid = holder.get_backend_pid()
        before = p.history()
        r = p.run("refused", timeout=60)
        err = run_error(r)
        print(err)
        assert r.returncode != 0 and f"PID {pid}" in err and "'etl-tool'" in err, r.stderr[-3000:]
        assert p.history() == before
        assert p.slot_holder() == (pid, "etl-tool")  # left alone
    finally:
        holder.close()
    assert p.run("after").returncode == 0
    assert len({e["idempotency_key"] for e in p.contents()["redis"]}) == p.work.changes


@pytest.fixture()
def other_role(postgres, pg_pipeline) -> Iterator[str]:
    """A second CDC role (another deployment's worker, say): LOGIN REPLICATION, not superuser."""
    role, password = f"{pg_pipeline.name}_w2", uuid.uuid4().hex
    pg_pipeline.execute(f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD '{password}'")
    c = postgres.cdc
    try:
        yield (f"host={c.host} port={c.port} dbname={c.schema} user={role} password={password}")
    finally:
        pg_pipeline.execute(f"REVOKE pg_signal_backend FROM {c.login}")
        pg_pipeline.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            f"WHERE usename = '{role}'")
        time.sleep(0.3)
        pg_pipeline.execute(f"DROP ROLE IF EXISTS {role}")


def test_takeover_from_another_role_needs_pg_signal_backend(pg_pipeline, postgres, other_role):
    """A stalled run of this pipeline under another role: the run fails in preflight naming
    pg_signal_backend; once granted, it takes the slot over."""
    p = pg_pipeline
    assert p.run("place").returncode == 0
    p.work.wave(5)
    stalled = hold_slot(other_role, p.name, f"tidegate/1/{p.name}")  # an older lease epoch
    try:
        pid = stalled.get_backend_pid()
        r = p.run("refused", timeout=60)
        err = run_error(r)
        print(err)
        assert r.returncode != 0 and "pg_signal_backend" in err and f"PID {pid}" in err, r.stderr[-3000:]
        p.execute(f"GRANT pg_signal_backend TO {postgres.cdc.login}")
        r = p.run("granted", timeout=60)
        assert r.returncode == 0, r.stderr[-3000:]
        assert f"took replication slot {p.name!r} over from PID {pid}" in r.stderr
    finally:
        stalled.close()
    got = p.contents()
    for sink, events in got.items():
        assert len(events) == len({e["idempotency_key"] for e in events}) == p.work.changes, sink
