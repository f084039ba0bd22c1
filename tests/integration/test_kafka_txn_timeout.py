"""A Kafka exactly-once run that outlives its transaction: SIGSTOPped while its transaction is
open, longer than ``transaction.timeout.ms`` (2 s here, a connection extra), with no other run
in between. The broker aborts the transaction (the test waits until it has: the topic's last
stable offset catches up with its high watermark, the abort marker written) and the run is
SIGCONTed: it must fail saying its transaction timed out (naming transaction.timeout.ms), not
that another run took over. A rerun then delivers every change exactly once (read_committed),
in commit order per key.
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
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.integration.airflow_support import VENV_BIN, per_key
from tests.integration.sink_readers import kafka_changes

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

TX_TIMEOUT_MS = 2000
NOTE = "x" * 6000  # rows of 6 KB: a transaction of 20 of them stays open long enough to be seen
ROWS = 2400  # 3,000 changes in 150 transactions: a run long enough to be stopped inside one


@dataclass
class Pipe:
    name: str
    env: dict[str, str]
    base: Path
    db: object
    bootstrap: str

    def execute(self, sql: str) -> None:
        with self.db.cursor() as c:
            c.execute(sql)

    def start(self, run_id: str) -> tuple[subprocess.Popen, Path]:
        log = self.base / f"{run_id}.log"
        with open(log, "wb") as f:
            proc = subprocess.Popen([str(VENV_BIN / "tidegate"), "run", self.name, "--run-id", run_id],
                                    env=self.env, stdout=subprocess.DEVNULL, stderr=f, start_new_session=True)
        return proc, log

    def run(self, run_id: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(VENV_BIN / "tidegate"), "run", self.name, "--run-id", run_id],
                              env=self.env, capture_output=True, text=True, timeout=120)


class Watermarks:
    """(last stable offset, high watermark) of partition 0 of a topic: a read_committed and a
    read_uncommitted consumer's high watermarks. high > stable: a transaction is open."""

    def __init__(self, bootstrap: str, topic: str):
        self.tp = TopicPartition(topic, 0)
        self.consumers = [Consumer({"bootstrap.servers": bootstrap, "group.id": "tt-" + uuid.uuid4().hex,
                                    "isolation.level": level})
                          for level in ("read_committed", "read_uncommitted")]

    def __call__(self) -> tuple[int, int]:
        try:
            stable, high = (c.get_watermark_offsets(self.tp, timeout=10, cached=False)[1]
                            for c in self.consumers)
        except Exception:  # noqa: BLE001 - the topic is created by the run
            return 0, 0
        return stable, high

    def open(self) -> bool:
        stable, high = self()
        return high > stable

    def close(self) -> None:
        for c in self.consumers:
            c.close()


@pytest.fixture()
def pipe(tmp_path, service_env, postgres, kafka) -> Iterator[Pipe]:
    name = f"tt_{uuid.uuid4().hex[:6]}"
    db = psycopg2.connect(postgres.admin_dsn)
    db.autocommit = True
    (tmp_path / "pipelines").mkdir()
    bootstrap = kafka.cdc.extra["bootstrap.servers"]
    conn = {"conn_type": "kafka",
            "extra": {"bootstrap.servers": bootstrap, "transaction.timeout.ms": TX_TIMEOUT_MS}}
    env = dict(os.environ, **service_env, TIDEGATE_PIPELINES_DIR=str(tmp_path / "pipelines"),
               TIDEGATE_CHECKPOINT_STORE=f"sqlite:///{tmp_path / 'store.sqlite'}",
               AIRFLOW_CONN_SHORT_TX_KAFKA=json.dumps(conn), PATH=f"{VENV_BIN}:{os.environ['PATH']}")
    p = Pipe(name, env, tmp_path, db, bootstrap)
    p.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, status text, note text NOT NULL DEFAULT '{NOTE}')")
    p.execute(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
    (tmp_path / "pipelines" / f"{name}.yaml").write_text(textwrap.dedent(f"""
        pipeline: {name}
        source: {{kind: postgres, conn_id: cdc_postgres, tables: [public.{name}], slot: {name}}}
        batch: {{max_events: 20}}
        sinks:
          - {{id: events, kind: kafka, conn_id: short_tx_kafka, topic: "{{pipeline}}.{{table}}",
              exactly_once: true, partitions: 1}}
    """))
    try:
        yield p
    finally:
        p.execute(f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                  f"WHERE slot_name = '{name}'")
        p.execute(f"DROP TABLE IF EXISTS {name}")
        db.close()


def wait_for(pred, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"not within {timeout:.0f}s: {what}"
        time.sleep(0.005)


def stop_mid_transaction(proc: subprocess.Popen, marks: Watermarks) -> None:
    """SIGSTOP the run again and again, a few milliseconds apart, until it is stopped while a
    transaction of its is open: seen open with the run stopped, and still open 0.3 s later (a
    commit already sent when the run stopped ends within milliseconds). Stopping first and
    looking afterwards does not race the run: waiting for a poll to see a transaction open did
    (a fresh CI's run committed 150 transactions between two polls)."""
    for attempt in range(3000):
        assert proc.poll() is None, "the run ended before it was stopped with a transaction open"
        os.killpg(proc.pid, signal.SIGSTOP)
        seen = marks()
        if seen[1] > seen[0]:
            time.sleep(0.3)
            if marks() == seen:
                return
        os.killpg(proc.pid, signal.SIGCONT)
        time.sleep(0.002 * (1 + attempt % 7))  # varied, so the stops do not keep step with the run
    raise AssertionError("never stopped the run while its transaction was open")


def test_a_run_stalled_past_its_transaction_timeout_says_so_and_a_rerun_delivers_once(pipe):
    p = pipe
    r = p.run("place")
    assert r.returncode == 0, r.stderr[-3000:]
    expected: dict[int, list[tuple]] = {}
    for i in range(1, ROWS + 1):
        p.execute(f"INSERT INTO {p.name} (id, status) VALUES ({i}, 'new')")
        expected[i] = [("c", "new")]
    for i in range(1, ROWS + 1, 4):
        p.execute(f"UPDATE {p.name} SET status = 'paid' WHERE id = {i}")
        expected[i].append(("u", "paid"))
    changes = sum(len(v) for v in expected.values())

    topic = f"{p.name}.{p.name}"
    marks = Watermarks(p.bootstrap, topic)
    proc, log = p.start("stalled")
    try:
        stop_mid_transaction(proc, marks)
        stopped = time.monotonic()
        # The broker aborts the transaction once it is older than transaction.timeout.ms (it
        # looks every transaction.abort.timed.out.transaction.cleanup.interval.ms: 500 ms on
        # these brokers, 10 s by default): the abort marker moves the last stable offset up.
        wait_for(lambda: not marks.open(), "the broker aborted the open transaction", timeout=60)
        print(f"the broker aborted the transaction {time.monotonic() - stopped:.1f}s into the stall")
        os.killpg(proc.pid, signal.SIGCONT)
        rc = proc.wait(120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        marks.close()
    said = [ln for ln in log.read_text().splitlines() if ln.startswith("tidegate: ")]
    print(f"the stalled run: rc={rc}, {said[-1:]}")
    assert rc != 0
    assert said, log.read_text()[-3000:]
    assert re.search(r"transaction timed out", said[-1]) and "transaction.timeout.ms" in said[-1], said[-1]
    assert "another run took over this pipeline" not in said[-1], said[-1]
    assert "the pipeline's lease is still this run's" in said[-1], said[-1]
    # Nothing took over: the run is not fatal (Airflow retries it), a new attempt delivers it.
    assert "must not be retried" not in said[-1] and "a new attempt of the run delivers it" in said[-1]

    for i in range(4):  # the rerun (and the next, which finds nothing to do)
        r = p.run(f"rerun_{i}")
        assert r.returncode == 0, r.stderr[-3000:]
        if json.loads(r.stdout).get("nothing_to_do"):
            break
    got = kafka_changes(p.bootstrap, topic)
    ids = [e["idempotency_key"] for e in got]
    assert len(ids) == len(set(ids)) == changes
    assert per_key(got) == expected
