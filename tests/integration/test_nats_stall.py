"""NATS exactly once per stream also after a stall longer than the stream's duplicate_window.

A `tidegate run` of a PostgreSQL pipeline to a NATS stream whose duplicate_window is 2 s is
frozen at the one point that matters: the sub-batch's data is stored in the stream, its commit
marker is not. How it is reached, without guessing at timing: the run talks to NATS through a
relay (``nats_gate.NatsGate``) that, once the run sends its first data publish, keeps the
server's answers (the acks) from the run. The server stores the data; the run waits for acks
and cannot publish its marker. The test sees the data in the stream (its own connection),
SIGSTOPs the run, waits longer than the window, breaks the run's connection (the held acks
are lost, as with a network that drops it) and then:

* ``resumed``: SIGCONTs the run. Its ack wait has timed out; the sub-batch is retried in the same
  run; the retry reads back what the stream holds after the sink's last commit marker and
  publishes only the marker. The run exits 0 and reports ``skipped`` = the data stored before
  the stall.
* ``killed``: SIGKILLs the run; a new run (a newer lease epoch) opens the sink, reads back,
  skips what is stored and reports it.

And a zombie: a run stopped in the middle of a sub-batch, a newer run takes over and delivers
it, the window passes, the zombie's acks arrive and it is resumed: it re-checks its claim
before its next publish and is fenced, storing nothing twice.

Oracle: every change (by idempotency key, the workload's rows and their commit order) is in
the stream exactly once, in order per key, no Nats-Msg-Id stored twice.
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

import psycopg2
import pytest

from tests.integration.airflow_support import VENV_BIN, start_tidegate_run
from tests.integration.nats_gate import NatsGate
from tests.integration.sink_readers import all_messages, is_marker, stored_messages

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

WINDOW_S = 2.0  # the stream's duplicate_window
STALL_S = WINDOW_S + 2.0  # the run stays stopped longer than the window
PUBLISH_TIMEOUT_S = 3.0  # the run's ack wait (connection extra publish_timeout)
ROWS = 10  # each row inserted, then updated: 20 changes, one sub-batch


@dataclass
class Stall:
    name: str
    env: dict[str, str]
    base: Path
    db: object
    gate: NatsGate
    nats: object

    @property
    def stream(self) -> str:
        return self.name.upper()

    def write_spec(self, max_in_flight: int = 1000) -> None:
        # No schedule: the preflight then does not compare the 2 s window with an interval.
        (self.base / "pipelines" / f"{self.name}.yaml").write_text(textwrap.dedent(f"""
            pipeline: {self.name}
            source: {{kind: postgres, conn_id: cdc_postgres, tables: [public.{self.name}], slot: {self.name}}}
            batch: {{max_events: 100}}
            sinks:
              - {{id: bus, kind: nats, conn_id: stall_nats, stream: {self.stream},
                  subject: "{{pipeline}}.{{schema}}.{{table}}", duplicate_window: {WINDOW_S},
                  max_in_flight: {max_in_flight}}}
        """))

    def workload(self) -> int:
        """ROWS inserts, then an update of each: 2 * ROWS changes, one sub-batch."""
        for i in range(1, ROWS + 1):
            self.execute(f"INSERT INTO {self.name} VALUES ({i}, 'new')")
        for i in range(1, ROWS + 1):
            self.execute(f"UPDATE {self.name} SET status = 'paid' WHERE id = {i}")
        return 2 * ROWS

    def assert_exactly_once(self) -> list:
        """Every change once (no Nats-Msg-Id stored twice), in commit order per key."""
        got = changes(self.data())
        ids = [i for i, _, _ in got]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        assert dup == [], f"{len(ids) - len(set(ids))} message(s) stored twice: {dup[:3]}"
        per_key = {k: [op for _, key, op in got if key == k] for k in range(1, ROWS + 1)}
        assert per_key == {k: ["c", "u"] for k in range(1, ROWS + 1)}
        return got

    def execute(self, sql: str) -> None:
        with self.db.cursor() as c:
            c.execute(sql)

    def start(self, run_id: str) -> subprocess.Popen:
        return start_tidegate_run(self.base, self.name, self.env, run_id)

    def finish(self, proc: subprocess.Popen, run_id: str) -> tuple[int, dict | None, str]:
        rc = proc.wait(60)
        out = (self.base / f"{run_id}.out").read_text()
        err = (self.base / f"{run_id}.err").read_text()
        return rc, (json.loads(out) if rc == 0 else None), err

    def run(self, run_id: str) -> dict:
        rc, report, err = self.finish(self.start(run_id), run_id)
        assert rc == 0, err[-3000:]
        return report

    def data(self) -> list:
        try:
            return stored_messages(self.nats, self.stream)
        except Exception:  # noqa: BLE001 - the stream is created by the run
            return []


@pytest.fixture()
def stall(tmp_path, service_env, postgres, nats_service) -> Iterator[Stall]:
    name = f"ns_{uuid.uuid4().hex[:6]}"
    db = psycopg2.connect(postgres.admin_dsn)
    db.autocommit = True
    (tmp_path / "pipelines").mkdir()
    c = nats_service.cdc
    with NatsGate(c.port, f"HPUB {name}.public.".encode()) as gate:
        conn = {"conn_type": "nats", "host": "127.0.0.1", "port": gate.port, "login": c.login,
                "password": c.password, "extra": {"publish_timeout": PUBLISH_TIMEOUT_S}}
        env = dict(os.environ, **service_env, TIDEGATE_PIPELINES_DIR=str(tmp_path / "pipelines"),
                   TIDEGATE_CHECKPOINT_STORE=f"sqlite:///{tmp_path / 'store.sqlite'}",
                   AIRFLOW_CONN_STALL_NATS=json.dumps(conn), PATH=f"{VENV_BIN}:{os.environ['PATH']}")
        s = Stall(name, env, tmp_path, db, gate, c)
        s.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, status text)")
        s.execute(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
        s.write_spec()
        try:
            yield s
        finally:
            s.execute(f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                      f"WHERE slot_name = '{name}'")
            s.execute(f"DROP TABLE IF EXISTS {name}")
            db.close()


def wait_for(pred, what: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"not within {timeout:.0f}s: {what}"
        time.sleep(0.01)


def changes(msgs: list) -> list[tuple[str, int, str]]:
    """(Nats-Msg-Id, row id, op) of every data message, in stream order."""
    out = []
    for m in msgs:
        ev = json.loads(m.data)
        row = ev.get("after") or ev.get("before")
        out.append((m.headers["Nats-Msg-Id"], row["id"], ev["op"]))
    return out


@pytest.mark.parametrize("then", ["resumed", "killed"])
def test_a_sub_batch_stored_before_a_stall_longer_than_the_window_is_not_stored_again(stall, then):
    s = stall
    s.run("place")  # the slot and the pipeline's start
    want = s.workload()

    s.gate.armed = True
    run = s.start("stalled")
    try:
        # The run has published the sub-batch, the server stored all of it, its acks are held:
        # the run waits for them, so its commit marker cannot have been sent.
        wait_for(lambda: s.gate.holding.is_set() and len(s.data()) == want, "the sub-batch stored", run)
        os.killpg(run.pid, signal.SIGSTOP)
        before = s.data()
        marker_seqs = [m.seq for m in all_messages(s.nats, s.stream) if is_marker(m.subject)]
        assert max(marker_seqs, default=0) < min(m.seq for m in before), "a marker after the data"
        time.sleep(STALL_S)  # the fault: stopped longer than the duplicate window
        s.gate.cut()
        if then == "resumed":
            os.killpg(run.pid, signal.SIGCONT)
            rc, report, err = s.finish(run, "stalled")
            assert rc == 0, err[-3000:]
        else:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(30)
            report = s.run("rerun")
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(30)
    bus = next(r for r in report["sinks"] if r["id"] == "bus")
    print(f"{then}: stored before the stall {len(before)}, report of the run that finished it: "
          f"skipped {bus.get('skipped')}, duplicates {bus['duplicates']}, events {bus['events']}")

    got = s.assert_exactly_once()
    assert [i for i, _, _ in got] == [i for i, _, _ in changes(before)]  # what was stored before the stall
    assert bus.get("skipped") == len(before) == want
    assert bus["status"] == "ok"
    assert s.run("after").get("nothing_to_do")



def test_a_zombie_resumed_after_the_window_is_fenced_before_it_publishes_again(stall):
    """A run stopped in the middle of its sub-batch (5 of 20 published, waiting for room: at
    most 5 un-acked, and the relay holds the acks), a newer run takes over and delivers it all,
    then, longer than the window later, the first run's acks arrive and it is resumed: its claim
    check is older than half the window, so it checks again before its next publish and is
    fenced. Without that re-check it would store the other 15 a second time."""
    s = stall
    s.write_spec(max_in_flight=5)
    s.run("place")
    want = s.workload()
    s.gate.armed = True
    zombie = s.start("zombie")
    try:
        wait_for(lambda: s.gate.holding.is_set() and len(s.data()) == 5, "5 messages stored", zombie)
        os.killpg(zombie.pid, signal.SIGSTOP)
        assert len(s.data()) == 5  # it waits for room: no more than max_in_flight un-acked
        s.gate.armed = False
        taken = s.run("takeover")  # a newer lease epoch: reads back the 5, publishes the 15
        bus = next(r for r in taken["sinks"] if r["id"] == "bus")
        assert (bus["skipped"], bus["events"]) == (5, want)
        time.sleep(STALL_S)  # the zombie stays stopped longer than the window after the takeover
        s.gate.release()  # its acks arrive, late
        os.killpg(zombie.pid, signal.SIGCONT)
        rc, _, err = s.finish(zombie, "zombie")
    finally:
        if zombie.poll() is None:
            os.killpg(zombie.pid, signal.SIGKILL)
            zombie.wait(30)
    said = [ln for ln in err.splitlines() if ln.startswith("tidegate: ")]
    print(f"zombie: rc={rc}, {said[-1:]}")
    assert rc != 0 and said and "fenced" in said[-1], err[-3000:]
    assert len(s.assert_exactly_once()) == want
