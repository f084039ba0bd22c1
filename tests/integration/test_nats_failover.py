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
as skipped exactly what the killed run stored; a third run has nothing to do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
import uuid
from collections.abc import Iterator
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

    def fail_over(self) -> None:
        """The connection moves to the replica once it holds every transaction of the primary."""
        wait_replica_has(self.primary, self.replica)
        self.env["AIRFLOW_CONN_CDC_MYSQL"] = self.env["AIRFLOW_CONN_CDC_MYSQL_REPLICA"]

    def data(self) -> list[tuple[str, int, str]]:
        """(Nats-Msg-Id, row id, op) of every data message, in stream order."""
        try:
            msgs = stored_messages(self.nats, self.stream)
        except Exception:  # noqa: BLE001 - the stream is created by the run
            return []
        out = []
        for m in msgs:
            if m.subject != f"{self.name}.{self.name}.t":  # control messages (the failover's)
                continue
            ev = json.loads(m.data)
            out.append((m.headers["Nats-Msg-Id"], (ev["after"] or ev["before"])["id"], ev["op"]))
        return out


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
        p.execute(f"CREATE TABLE {name}.t (id INT PRIMARY KEY, status VARCHAR(10))")
        (tmp_path / "pipelines" / f"{name}.yaml").write_text(textwrap.dedent(f"""
            pipeline: {name}
            source: {{kind: mysql, conn_id: cdc_mysql, server_id: 47311, tables: [{name}.t]}}
            batch: {{max_events: 100}}
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

    p.gate.armed = True
    run = p.start("killed")
    try:
        deadline = time.monotonic() + 60
        while not (p.gate.holding.is_set() and len(p.data()) == 2 * ROWS):
            assert run.poll() is None, "the run ended before its sub-batch was stored"
            assert time.monotonic() < deadline, "the sub-batch was not stored within 60s"
            time.sleep(0.01)
        os.killpg(run.pid, signal.SIGKILL)  # stored, without its commit marker
        run.wait(30)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(30)
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
