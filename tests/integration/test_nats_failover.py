"""NATS exactly once per stream across a GTID failover: what a killed run stored without its
commit marker is recognized on the other server of the pair.

A MariaDB pipeline delivers to a NATS stream through a relay (``nats_gate.NatsGate``) that,
once the run sends its first data publish, keeps the server's acks from the run: the server
stores the sub-batch, the run cannot publish its commit marker. The test SIGKILLs the run,
writes more changes to the primary, and moves the pipeline's connection to the primary's GTID
replica (the primary's binlog rotated first, so the two servers' files and offsets differ), as
an operator does after promoting a replica that was in sync. A new run delivers the rest from
the replica.

Each change's ``event_id`` (and so its ``Nats-Msg-Id``) is its position in the log of the
server it was read from: the replica's copies of the killed run's changes carry other ids.
Campaign seed 5821 (``FAILOVERS=gtid``) found them stored twice (6 of 526 changes); the sink now
also recognizes a stored change by its transaction and its place in it (``read_back.Stored``).

Oracle: the workload's changes per key, in commit order, each once; the new run's report counts
as skipped exactly what the killed run stored; a third run has nothing to do. The same with a
DDL among the killed run's changes: its ``schema_change`` control message once (its id, too, is
a position in one server's log; it was stored twice before it was known by its GTID). The same
fault on generated workloads (seeds: transactions of 1-4 statements on two tables, multi-row
updates, deletes, primary-key changes, a column added now and then; writes between the kill and
the rerun): as many messages as the source made changes and DDL, and the stream replayed
equals the source's tables. Seeds 4 and 11 draw DDL before the kill (12 of seeds 1-20 did, and
failed before the fix).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pymysql
import pytest

from tests.integration.airflow_support import VENV_BIN, start_tidegate_run
from tests.integration.nats_gate import NatsGate
from tests.integration.sink_readers import stored_messages
from tests.integration.test_continuity_e2e import wait_replica_has

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

ROWS = 12  # each row inserted, then updated: one sub-batch
LATER = 4  # rows inserted between the kill and the rerun


@dataclass
class Pair:
    name: str
    env: dict[str, str]
    base: Path
    primary: pymysql.Connection
    replica: pymysql.Connection
    nats: object
    gate: NatsGate

    @property
    def stream(self) -> str:
        return self.name.upper()

    def execute(self, sql: str) -> None:
        with self.primary.cursor() as c:
            c.execute(sql)

    def start(self, run_id: str) -> subprocess.Popen:
        return start_tidegate_run(self.base, self.name, self.env, run_id)

    def run(self, run_id: str) -> dict:
        proc = self.start(run_id)
        rc = proc.wait(120)
        assert rc == 0, (self.base / f"{run_id}.err").read_text()[-3000:]
        return json.loads((self.base / f"{run_id}.out").read_text())

    def kill_once_stored(self, stored: Callable[[], bool]) -> None:
        """A run SIGKILLed once the gate holds its acks and ``stored()`` says the stream holds
        what it published: its sub-batch stored, without the commit marker."""
        self.gate.armed = True
        run = self.start("killed")
        try:
            deadline = time.monotonic() + 60
            while not (self.gate.holding.is_set() and stored()):
                assert run.poll() is None, "the run ended before its sub-batch was stored"
                assert time.monotonic() < deadline, "the sub-batch was not stored within 60s"
                time.sleep(0.01)
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
            run.wait(30)

    def fail_over(self) -> None:
        """The connection moves to the replica once it holds every transaction of the primary."""
        wait_replica_has(self.primary, self.replica)
        self.env["AIRFLOW_CONN_CDC_MYSQL"] = self.env["AIRFLOW_CONN_CDC_MYSQL_REPLICA"]

    def messages(self) -> list:
        """Every message of the stream but the commit markers, in stream order."""
        try:
            return stored_messages(self.nats, self.stream)
        except Exception:  # noqa: BLE001 - the stream is created by the run
            return []

    def changes(self, msgs: list | None = None) -> list[tuple[str, str, str, dict]]:
        """(Nats-Msg-Id, table, op, row) of every data message of both tables, in stream order
        (of ``msgs``, a read of :meth:`messages`, or of a read of its own)."""
        out = []
        for m in self.messages() if msgs is None else msgs:
            table = m.subject.rpartition(".")[2]
            if m.subject == f"{self.name}.{self.name}.{table}" and table in ("t", "u"):
                ev = json.loads(m.data)
                out.append((m.headers["Nats-Msg-Id"], table, ev["op"], ev["after"] or ev["before"]))
        return out

    def rows(self) -> dict[str, dict[int, str]]:
        with self.primary.cursor() as c:
            out = {}
            for table in ("t", "u"):
                c.execute(f"SELECT id, status FROM {self.name}.{table}")
                out[table] = dict(c.fetchall())
        return out

    def control(self, msgs: list | None = None) -> list[dict]:
        """The schema_change control messages of the stream, in stream order (as :meth:`changes`)."""
        msgs = self.messages() if msgs is None else msgs
        control = [json.loads(m.data) for m in msgs if m.subject == f"{self.name}.__control"]
        return [m for m in control if m["type"] == "schema_change"]

    def data(self) -> list[tuple[str, int, str]]:
        """(Nats-Msg-Id, row id, op) of every data message of table t, in stream order."""
        return [(i, row["id"], op) for i, table, op, row in self.changes() if table == "t"]


@pytest.fixture()
def pair(tmp_path, service_env, mysql, mysql_replica, nats_service) -> Iterator[Pair]:
    name = f"nf_{uuid.uuid4().hex[:6]}"
    primary = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    replica = pymysql.connect(**mysql_replica.mysql_kwargs(autocommit=True))
    (tmp_path / "pipelines").mkdir()
    c = nats_service.cdc
    with NatsGate(c.port, f"HPUB {name}.{name}.".encode()) as gate:
        conn = {"conn_type": "nats", "host": "127.0.0.1", "port": gate.port, "login": c.login,
                "password": c.password, "extra": {"publish_timeout": 3.0}}
        env = dict(os.environ, **service_env, TIDEGATE_PIPELINES_DIR=str(tmp_path / "pipelines"),
                   TIDEGATE_CHECKPOINT_STORE=f"sqlite:///{tmp_path / 'store.sqlite'}",
                   AIRFLOW_CONN_FAILOVER_NATS=json.dumps(conn), PATH=f"{VENV_BIN}:{os.environ['PATH']}")
        p = Pair(name, env, tmp_path, primary, replica, c, gate)
        p.execute(f"CREATE DATABASE {name}")
        for table in ("t", "u"):
            p.execute(f"CREATE TABLE {name}.{table} (id INT PRIMARY KEY, status VARCHAR(10))")
        (tmp_path / "pipelines" / f"{name}.yaml").write_text(textwrap.dedent(f"""
            pipeline: {name}
            source: {{kind: mysql, conn_id: cdc_mysql, server_id: 47311, tables: [{name}.t, {name}.u]}}
            batch: {{max_events: 1000}}
            sinks:
              - {{id: bus, kind: nats, conn_id: failover_nats, stream: {p.stream},
                  subject: "{{pipeline}}.{{schema}}.{{table}}", duplicate_window: 2}}
        """))
        try:
            yield p
        finally:
            p.execute(f"DROP DATABASE IF EXISTS {name}")
            primary.close()
            replica.close()


def test_changes_a_killed_run_stored_are_not_stored_again_by_a_run_on_the_gtid_replica(pair):
    p = pair
    p.run("place")  # the pipeline's start, on the primary
    p.execute("FLUSH BINARY LOGS")  # the two servers' files and offsets differ more
    for i in range(1, ROWS + 1):
        p.execute(f"INSERT INTO {p.name}.t VALUES ({i}, 'new')")
    for i in range(1, ROWS + 1):
        p.execute(f"UPDATE {p.name}.t SET status = 'paid' WHERE id = {i}")

    p.kill_once_stored(lambda: len(p.data()) == 2 * ROWS)
    stored = p.data()
    p.gate.cut()
    for i in range(ROWS + 1, ROWS + LATER + 1):  # written between the kill and the rerun
        p.execute(f"INSERT INTO {p.name}.t VALUES ({i}, 'new')")
    p.fail_over()

    report = p.run("on_replica")
    bus = next(r for r in report["sinks"] if r["id"] == "bus")
    got = p.data()
    print(f"stored by the killed run {len(stored)}; the run on the replica: skipped "
          f"{bus.get('skipped')}, events {bus['events']}; the stream holds {len(got)}")
    per_key = {k: [op for _, key, op in got if key == k] for k in range(1, ROWS + LATER + 1)}
    assert per_key == {k: ["c", "u"] if k <= ROWS else ["c"] for k in range(1, ROWS + LATER + 1)}
    assert len(got) == 2 * ROWS + LATER
    assert got[:len(stored)] == stored  # the killed run's copies stayed, under the primary's ids
    later_ids = {i for i, _, _ in got[len(stored):]}
    assert not later_ids & {i for i, _, _ in stored}
    assert bus.get("skipped") == len(stored) == 2 * ROWS
    assert bus["status"] == "ok"
    assert p.run("after").get("nothing_to_do")


def test_a_schema_change_a_killed_run_stored_is_not_stored_again_on_the_gtid_replica(pair):
    """A DDL among the changes of the killed run's sub-batch: its ``schema_change`` control
    message is stored once, though its id (a position in the primary's log) is not the one
    the replica's copy of the DDL gives it."""
    p = pair
    p.run("place")
    p.execute("FLUSH BINARY LOGS")
    for i in range(1, ROWS + 1):
        p.execute(f"INSERT INTO {p.name}.t VALUES ({i}, 'new')")
    p.execute(f"ALTER TABLE {p.name}.t ADD COLUMN note INT NULL")
    for i in range(1, ROWS + 1):
        p.execute(f"UPDATE {p.name}.t SET status = 'paid' WHERE id = {i}")

    p.kill_once_stored(lambda: len(p.data()) == 2 * ROWS)
    stored = p.control()
    assert [m["ddl"] for m in stored] == [f"ALTER TABLE {p.name}.t ADD COLUMN note INT NULL"]
    p.gate.cut()
    p.execute(f"INSERT INTO {p.name}.t (id, status) VALUES ({ROWS + 1}, 'new')")
    p.fail_over()

    bus = next(r for r in p.run("on_replica")["sinks"] if r["id"] == "bus")
    control = p.control()
    print(f"control messages: {[(m['idempotency_key'], m['position']) for m in control]}; "
          f"skipped {bus.get('skipped')}")
    assert control == stored  # once, under the primary's id
    assert len(p.data()) == 2 * ROWS + 1
    assert bus.get("skipped") == 2 * ROWS + 1
    assert p.run("after").get("nothing_to_do")


class Workload:
    """Random transactions on both tables: inserts, updates of one or several rows, deletes and
    primary-key changes (a delete and a create), 1-4 statements each; counts the changes. Before
    one transaction in five a column is added to one of the tables (drawn from a generator of
    its own, so the transactions of a seed stay those it drew before DDL was drawn)."""

    def __init__(self, p: Pair, seed: int):
        self.p, self.rng, self.ddl_rng = p, random.Random(seed), random.Random(f"{seed}/ddl")
        self.live: dict[str, set[int]] = {"t": set(), "u": set()}
        self.next_id, self.changes, self.ddl = 1, 0, 0

    def transactions(self, n: int) -> None:
        with self.p.primary.cursor() as c:
            for _ in range(n):
                if self.ddl_rng.random() < 0.2:
                    self.ddl += 1
                    c.execute(f"ALTER TABLE {self.p.name}.{self.ddl_rng.choice(('t', 'u'))} "
                              f"ADD COLUMN c{self.ddl} INT NULL")
                c.execute("START TRANSACTION")
                for _ in range(self.rng.randint(1, 4)):
                    self.statement(c)
                c.execute("COMMIT")

    def statement(self, c) -> None:
        table = self.rng.choice(("t", "u"))
        live, name = self.live[table], f"{self.p.name}.{table}"
        kind = self.rng.choice(("insert", "insert", "update", "delete", "key")) if live else "insert"
        if kind == "insert":
            c.execute(f"INSERT INTO {name} (id, status) VALUES ({self.next_id}, 'new')")
            live.add(self.next_id)
            self.next_id += 1
        elif kind == "update":
            ids = self.rng.sample(sorted(live), min(len(live), self.rng.randint(1, 3)))
            status = self.rng.choice(("paid", "sent", "held"))
            c.execute(f"UPDATE {name} SET status = '{status}' WHERE id IN ({','.join(map(str, ids))})")
        elif kind == "delete":
            gone = self.rng.choice(sorted(live))
            c.execute(f"DELETE FROM {name} WHERE id = {gone}")
            live.discard(gone)
        else:  # the primary key changes: a delete of the old key, a create of the new one
            old = self.rng.choice(sorted(live))
            c.execute(f"UPDATE {name} SET id = {self.next_id} WHERE id = {old}")
            live.discard(old)
            live.add(self.next_id)
            self.next_id += 1
            self.changes += c.rowcount
        self.changes += c.rowcount


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 11])
def test_a_generated_workload_killed_mid_delivery_and_failed_over_is_stored_once(pair, seed):
    """The same fault on a generated workload (transactions of several changes, both tables,
    key changes, multi-row updates): every change once, and the stream replayed equals the
    source's tables."""
    p, rng = pair, random.Random(seed)
    p.run("place")
    p.execute("FLUSH BINARY LOGS")
    work = Workload(p, seed)
    work.transactions(rng.randint(4, 12))
    before_kill, ddl_before_kill = work.changes, work.ddl


    def stored() -> bool:  # one read of the stream per look
        msgs = p.messages()
        return len(p.changes(msgs)) == before_kill and len(p.control(msgs)) == ddl_before_kill

    p.kill_once_stored(stored)
    p.gate.cut()
    work.transactions(rng.randint(1, 4))  # written between the kill and the rerun
    p.fail_over()

    bus = next(r for r in p.run("on_replica")["sinks"] if r["id"] == "bus")
    got = p.changes()
    control = p.control()
    print(f"seed {seed}: {before_kill} changes and {ddl_before_kill} DDL stored by the killed run, "
          f"{work.changes} and {work.ddl} in all; skipped {bus.get('skipped')}; the stream holds "
          f"{len(got)} and {len(control)}")
    assert len(got) == work.changes, f"{len(got) - work.changes} change(s) stored twice"
    assert len({i for i, _, _, _ in got}) == len(got)
    assert len(control) == work.ddl, f"{len(control) - work.ddl} schema change(s) stored twice"
    assert len({m["position"]["gtid"] for m in control}) == work.ddl
    replayed: dict[str, dict[int, str]] = {"t": {}, "u": {}}
    for _, table, op, row in got:
        if op == "d":
            del replayed[table][row["id"]]
        else:
            replayed[table][row["id"]] = row["status"]
    assert replayed == p.rows()
    assert bus.get("skipped") == before_kill + ddl_before_kill
    assert p.run("after").get("nothing_to_do")
