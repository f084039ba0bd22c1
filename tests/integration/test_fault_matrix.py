"""The fault matrix: one real fault per scenario while `tidegate run` delivers a MariaDB or
PostgreSQL (wal2json) pipeline to Kafka (exactly-once), NATS JetStream and Redis Streams.

Each scenario writes a workload of single-row transactions, starts a run, injects the fault
once the run has committed a few sub-batches, brings the server back, writes a second wave and
runs until a run finds nothing to do. Then, per sink and per key: every change arrived once and
in commit order (Kafka through a read_committed consumer, NATS by `Nats-Msg-Id`, Redis by
`idempotency_key`), and every run that failed on the way said why (none halted: nothing was
lost).

1. The Kafka broker SIGKILLed while the run's transaction is open (the topic's read_uncommitted
   high watermark past its last stable offset), then restarted.
2. Redis SIGKILLed and restarted (AOF, appendfsync always). Redis restarted empty (its AOF
   deleted), or restored from an older copy of its AOF: the next run delivers nothing to it and
   fails naming the rewinds; after the one an operator chooses, Redis holds exactly the changes
   after the store's checkpoint (going on without the lost ones), or every change once (the
   rewind that delivers them again).
3. The NATS server SIGKILLed and restarted (JetStream file storage).
4. MariaDB SIGKILLed and restarted while a run reads its binlog; PostgreSQL stopped in
   immediate mode (a crash: every backend killed, WAL recovery on start) while a run streams
   its slot. Either way the read breaks off and the run fails short of its range.
5. A zombie: a run SIGSTOPped mid-delivery, a second run of the pipeline takes the lease and
   finishes, then the first is SIGCONTed: it writes nothing anywhere (no record a read_committed
   consumer sees, no NATS message, no Redis entry, no checkpoint version) and exits non-zero
   naming that it was fenced. Stopped right after a commit (whichever sink it meets first), and
   stopped while its sub-batch waits on a stalled Redis that is then killed and restarted (so
   the zombie certainly retries a Redis write when it wakes).

The scheduler-driven variant (the deliver task killed under a real Airflow scheduler, then
retried by Airflow) is in test_airflow_scheduler.py, which owns the shared deployment.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import pymysql
import pytest
from confluent_kafka import Consumer, TopicPartition
from tidegate.plan import EXIT_FATAL
from tidegate.positions import position_from_json
from tidegate.sources.mysql.position import BinlogPosition
from tidegate.store import CheckpointStore, open_store

from tests.conftest import services_cmd
from tests.integration.airflow_support import VENV_BIN, per_key
from tests.integration.sink_readers import (
    kafka_changes,
    nats_count,
    nats_messages,
    redis_client,
    redis_events,
    redis_ids,
)

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

SINKS = ("events", "bus", "cache")  # Kafka exactly-once, NATS, Redis
SUB_BATCH = 10  # max_events: every transaction is one change, so every sub-batch holds 10
# A source that dies while a run reads must not have handed the kernel the rest of the range
# already: each row carries 6 KB, so a run's range (~7 MB of log) is more than the server's
# socket send buffer (4 MB) and the reader's receive buffer hold; and every run reads
# in-process, one sub-batch ahead of delivery (TIDEGATE_READER_PROCESS_MIN_BYTES: a reader
# process would take 1000 items at a time, a whole range here, before the fault).
NOTE = "x" * 6000
IN_PROCESS_READS = str(64 << 20)
SERVER_IDS = itertools.count(48601)  # MariaDB replication client ids, one per pipeline


# --------------------------------------------------------------------------- the workload


class Workload:
    """Single-row transactions on one table (and, with :meth:`bulk`, large ones); remembers
    every key's (op, status) in commit order (``expected``) and how many changes it made.
    ``series(lo, hi)``: the source's rows lo..hi as a SELECT of (id, 'new')."""

    def __init__(self, execute: Callable[[str], None], table: str,
                 series: Callable[[int, int], str] | None = None):
        self.execute, self.table, self.series = execute, table, series
        self.next_id = 1
        self.expected: dict[int, list[tuple]] = collections.defaultdict(list)
        self.changes = 0

    def _do(self, stmt: str, key: int, change: tuple) -> None:
        self.execute(stmt)
        self.expected[key].append(change)
        self.changes += 1

    def wave(self, n: int) -> None:
        """n inserts, then an update of every 3rd and a delete of every 5th new row."""
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        for i in ids:
            self._do(f"INSERT INTO {self.table} (id, status) VALUES ({i}, 'new')", i, ("c", "new"))
        for i in ids[::3]:
            self._do(f"UPDATE {self.table} SET status = 'paid' WHERE id = {i}", i, ("u", "paid"))
        for i in ids[::5]:
            self._do(f"DELETE FROM {self.table} WHERE id = {i}", i, ("d", None))

    def bulk(self, n: int) -> range:
        """One transaction: n inserts, then an update of every 3rd of them. Returns the ids."""
        ids = range(self.next_id, self.next_id + n)
        self.next_id += n
        for stmt in ("BEGIN", f"INSERT INTO {self.table} (id, status) {self.series(ids[0], ids[-1])}",
                     f"UPDATE {self.table} SET status = 'paid' WHERE id BETWEEN {ids[0]} AND {ids[-1]} "
                     f"AND id % 3 = 0", "COMMIT"):
            self.execute(stmt)
        for i in ids:
            self.expected[i].append(("c", "new"))
        for i in ids:
            if i % 3 == 0:
                self.expected[i].append(("u", "paid"))
        self.changes += n + sum(1 for i in ids if i % 3 == 0)
        return ids


class Db:
    """The workload's admin connection to the source server, reopened after a restart."""

    def __init__(self, connect: Callable[[], object]):
        self.connect = connect
        self.conn = connect()

    def execute(self, stmt: str) -> None:
        with self.conn.cursor() as c:
            c.execute(stmt)

    def reconnect(self) -> None:
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001, S110 - the server it talked to is gone
            pass
        self.conn = self.connect()


# --------------------------------------------------------------------------- pipelines and runs


@dataclass
class Cdc:
    """What every scenario shares: the CLI's environment (own pipelines folder and SQLite
    checkpoint store), the store, and the sinks' connections."""

    env: dict[str, str]
    base: Path
    store: CheckpointStore
    kafka: str
    nats: object
    redis: object


@dataclass
class Run:
    """A `tidegate run` started in a process group of its own, output to a file."""

    run_id: str
    proc: subprocess.Popen
    out: Path

    @classmethod
    def start(cls, pipeline: str, run_id: str, env: dict[str, str], out: Path,
              args: tuple[str, ...] = ()) -> Run:
        """`tidegate run PIPELINE --run-id RUN_ID [ARGS]` in a process group of its own, its output
        (stdout and stderr) to ``out``."""
        with open(out, "wb") as f:
            proc = subprocess.Popen([str(VENV_BIN / "tidegate"), "run", pipeline, "--run-id", run_id, *args],
                                    env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        return cls(run_id, proc, out)

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def wait(self, timeout: float = 240) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(30)
            raise AssertionError(f"run {self.run_id} still running after {timeout:.0f}s:\n"
                                 + self.output()[-3000:]) from None

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)


@dataclass
class Pipeline:
    name: str
    table: str  # as the topic/stream templates name it (no schema)
    cdc: Cdc
    work: Workload
    db: Db

    @property
    def topic(self) -> str:
        return f"{self.name}.{self.table}"

    @property
    def stream(self) -> str:
        return self.name.upper()

    @property
    def redis_key(self) -> str:
        return f"{self.name}:{self.table}"

    def cli(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
        return subprocess.run([str(VENV_BIN / "tidegate"), *args], env=self.cdc.env, capture_output=True,
                              text=True, timeout=timeout)

    def run(self, run_id: str) -> subprocess.CompletedProcess:
        return self.cli("run", self.name, "--run-id", run_id)

    def run_ok(self, run_id: str) -> dict:
        r = self.run(run_id)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout)

    def start(self, run_id: str) -> Run:
        return Run.start(self.name, run_id, self.cdc.env, self.cdc.base / f"{self.name}.{run_id}.log")

    def writes(self, run_id: str, sink: str = "events") -> int:
        """Sub-batches the run has committed to the store for ``sink``."""
        return sum(1 for h in self.cdc.store.checkpoints.history(self.name, sink)
                   if h.kind == "write" and h.run_id == run_id)

    def history(self) -> dict[str, list[tuple]]:
        return {sid: [(h.version, h.kind, h.run_id, h.epoch, str(h.position))
                      for h in self.cdc.store.checkpoints.history(self.name, sid)] for sid in SINKS}

    def catch_up(self, tag: str, max_runs: int = 6) -> list[str]:
        """Run until a run finds nothing to do; returns the one-line errors of the runs that
        failed on the way (each must say why, and none may halt: nothing was lost)."""
        failures = []
        for i in range(max_runs):
            r = self.run(f"{tag}_{i}")
            if r.returncode == 0:
                if json.loads(r.stdout).get("nothing_to_do"):
                    return failures
                continue
            failures.append(explained_failure(r.stderr))
            time.sleep(1)
        raise AssertionError(f"{self.name}: not caught up after {max_runs} runs: {failures}")


# A traceback's line naming one of the engine's errors (tidegate.store.tx.StoreError: ...)
ENGINE_ERROR = re.compile(r"^tidegate\.(?:\w+\.)*\w+Error: ", re.M)


def explained_failure(stderr: str) -> str:
    """What a failed run said last: the CLI's one-line error, or the last line of the traceback
    of an error the engine does not wrap (e.g. a source connection lost mid-read). A failed run
    is never silent; a halt here would claim a loss that did not happen, and must at least
    name its range."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    said = [ln for ln in lines if ln.startswith("tidegate: ")]
    if not said:
        assert "Traceback (most recent call last)" in stderr, f"a run failed silently:\n{stderr[-3000:]}"
        # An engine error is said in one line, also when a Spark task raised it (campaign seed 5505)
        assert not ENGINE_ERROR.search(stderr), \
            f"a run buried the engine's error in a traceback:\n{stderr[-3000:]}"
        return lines[-1]
    error = said[-1]
    if "is halted by incident" in error:
        assert re.search(r"changes from .+ to .+ may be missing", error), error
        raise AssertionError(f"a fault that loses nothing halted the pipeline: {error}")
    return error


def spec_text(name: str, source: str, max_events: int) -> str:
    return textwrap.dedent(f"""
        pipeline: {name}
        source: {source}
        batch: {{max_events: {max_events}}}
        sinks:
          - {{id: events, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}",
              exactly_once: true, partitions: 3}}
          - {{id: bus, kind: nats, conn_id: cdc_nats, stream: {name.upper()},
              subject: "{{pipeline}}.{{table}}"}}
          - {{id: cache, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:{{table}}"}}
    """)


@pytest.fixture(scope="module")
def cdc(tmp_path_factory, service_env, mysql, postgres, kafka, redis_service, nats_service) -> Iterator[Cdc]:
    base = tmp_path_factory.mktemp("fault_matrix")
    (base / "pipelines").mkdir()
    url = f"sqlite:///{base / 'store.sqlite'}"
    env = dict(os.environ, **service_env, TIDEGATE_PIPELINES_DIR=str(base / "pipelines"),
               TIDEGATE_CHECKPOINT_STORE=url, TIDEGATE_READER_PROCESS_MIN_BYTES=IN_PROCESS_READS,
               PATH=f"{VENV_BIN}:{os.environ['PATH']}")
    store = open_store(url)
    yield Cdc(env, base, store, kafka.cdc.extra["bootstrap.servers"], nats_service.cdc, redis_service.cdc)
    store.close()


@pytest.fixture()
def mysql_pipeline(cdc, mysql) -> Iterator[Pipeline]:
    name = f"fm_{uuid.uuid4().hex[:6]}"
    db = Db(lambda: pymysql.connect(**mysql.mysql_kwargs(autocommit=True)))
    db.execute(f"CREATE DATABASE {name}")
    db.execute(f"CREATE TABLE {name}.orders (id INT PRIMARY KEY, status VARCHAR(20), "
               f"note VARCHAR(8000) NOT NULL DEFAULT '{NOTE}')")
    source = (f"{{kind: mysql, conn_id: cdc_mysql, tables: [{name}.orders], server_id: {next(SERVER_IDS)}, "
              f"start: head}}")
    (cdc.base / "pipelines" / f"{name}.yaml").write_text(spec_text(name, source, max_events=SUB_BATCH))
    try:
        series = lambda lo, hi: f"SELECT seq, 'new' FROM {name}.seq_{lo}_to_{hi}"  # noqa: E731
        yield Pipeline(name, "orders", cdc, Workload(db.execute, f"{name}.orders", series), db)
    finally:
        db.reconnect()
        db.execute(f"DROP DATABASE IF EXISTS {name}")
        db.conn.close()


@pytest.fixture()
def postgres_pipeline(cdc, postgres) -> Iterator[Pipeline]:
    yield from _postgres_pipeline(cdc, postgres, None)


@pytest.fixture()
def pgoutput_pipeline(cdc, postgres) -> Iterator[Pipeline]:
    """A PostgreSQL pipeline whose slot is pgoutput (read in the run's process, compiled rows),
    through a publication the admin made, as an administrator would for a CDC role."""
    yield from _postgres_pipeline(cdc, postgres, "pgoutput")


def _postgres_pipeline(cdc, postgres, plugin: str | None) -> Iterator[Pipeline]:
    name = f"fm_{uuid.uuid4().hex[:6]}"

    def connect():
        conn = psycopg2.connect(postgres.admin_dsn)
        conn.autocommit = True
        return conn

    db = Db(connect)
    db.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, status text, note text NOT NULL DEFAULT '{NOTE}')")
    db.execute(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
    pgoutput = f", plugin: pgoutput, publication: {name}" if plugin else ""
    if plugin:
        db.execute(f"CREATE PUBLICATION {name} FOR TABLE {name}")
    source = f"{{kind: postgres, conn_id: cdc_postgres, tables: [public.{name}], slot: {name}{pgoutput}}}"
    (cdc.base / "pipelines" / f"{name}.yaml").write_text(spec_text(name, source, max_events=SUB_BATCH))
    try:
        series = lambda lo, hi: f"SELECT g, 'new' FROM generate_series({lo}, {hi}) g"  # noqa: E731
        yield Pipeline(name, name, cdc, Workload(db.execute, name, series), db)
    finally:
        db.reconnect()
        db.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                   f"WHERE slot_name = '{name}'")
        db.execute(f"DROP PUBLICATION IF EXISTS {name}")
        db.execute(f"DROP TABLE IF EXISTS {name}")
        db.conn.close()


# --------------------------------------------------------------------------- servers


def server_pid(name: str) -> int:
    """The server's pid, as `scripts/services status` finds it."""
    out = services_cmd("status", check=False).stdout
    found = re.search(rf"^{name}\s+port \d+\s+pid (\d+)\s+healthy", out, re.M)
    assert found, f"{name} is not up and healthy:\n{out}"
    return int(found.group(1))


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] == "Z"  # a zombie is gone for our purpose
    except FileNotFoundError:
        return True


def stop_server(name: str, sig: int = signal.SIGKILL, pid: int | None = None) -> None:
    """Signal the server (``pid``: looked up beforehand, when the moment matters) and wait
    until it is gone."""
    pid = pid or server_pid(name)
    os.kill(pid, sig)
    wait_for(lambda: gone(pid), f"{name} (pid {pid}) to end after signal {sig}", timeout=60)


@contextmanager
def restarted(name: str) -> Iterator[None]:
    """The body runs with the server down; it is started again (and waited for until
    healthy) on the way out, whatever happened."""
    try:
        yield
    finally:
        services_cmd("up", name)


def services_dir() -> Path:
    return Path(os.environ["TIDEGATE_SERVICES_DIR"])  # set by the service_env fixture


def backup_redis(data: Path) -> Path:
    """A copy of Redis's data (``data``: its folder) as an operator's backup takes it: a clean
    shutdown (SIGTERM: the AOF on disk is whole), the AOF folder copied aside, the server started
    again."""
    backup = data.with_name(data.name + "-backup")
    shutil.rmtree(backup, ignore_errors=True)
    with restarted("redis"):
        stop_server("redis", signal.SIGTERM)
        shutil.copytree(data / "appendonlydir", backup / "appendonlydir")
    return backup


def restore_redis(data: Path, backup: Path, hold: float = 0) -> None:
    """Redis restored from :func:`backup_redis`'s copy: kill -9, its AOF folder replaced by the
    copy, ``hold`` seconds down, started again. What it acknowledged after the copy is gone, its
    checkpoint records with it."""
    with restarted("redis"):
        stop_server("redis")
        shutil.rmtree(data / "appendonlydir")
        shutil.copytree(backup / "appendonlydir", data / "appendonlydir")
        time.sleep(hold)


def wait_for(pred: Callable[[], object], what: str, timeout: float = 120, run: Run | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if run is not None and run.proc.poll() is not None:
            raise AssertionError(f"run {run.run_id} ended (rc={run.proc.returncode}) before {what}:\n"
                                 + run.output()[-3000:])
        assert time.monotonic() < deadline, f"not within {timeout:.0f}s: {what}"
        time.sleep(0.02)


@dataclass
class Faulted:
    """How a faulted run went: its one-line error ("ok" when it succeeded), the sub-batches it
    had committed when the fault hit and those it committed in all."""

    ended: str
    at_fault: int
    committed: int


def faulted_run(p: Pipeline, run_id: str, fault: Callable[[], None], writes: int = 2,
                ready: Callable[[], bool] = lambda: True) -> Faulted:
    """Start a run, inject ``fault`` once it has committed ``writes`` sub-batches and
    ``ready()`` holds, wait for it."""
    run = p.start(run_id)
    try:
        wait_for(lambda: p.writes(run_id) >= writes and ready(), f"{writes} sub-batches committed",
                 run=run)
        at_fault = p.writes(run_id)
        fault()
        rc = run.wait()
    finally:
        run.signal(signal.SIGKILL)
    return Faulted("ok" if rc == 0 else explained_failure(run.output()), at_fault, p.writes(run_id))


# --------------------------------------------------------------------------- reading the sinks


def sink_contents(p: Pipeline) -> dict[str, list[tuple[str, dict]]]:
    """Per sink, (the id it dedups by, envelope) of every data message, in the sink's order."""
    c = p.cdc
    kafka = kafka_changes(c.kafka, p.topic)
    redis = [json.loads(e) for e in redis_events(c.redis, p.redis_key)]
    return {"kafka": [(e["idempotency_key"], e) for e in kafka],
            "nats": [(h["Nats-Msg-Id"], e) for e, h in nats_messages(c.nats, p.stream, p.topic)],
            "redis": [(e["idempotency_key"], e) for e in redis]}


def tally(scenario: str, sink: str, want: int, got: list[tuple[str, dict]]) -> tuple[int, int]:
    """(duplicates, lost) of one sink, printed as a row of the scenario table."""
    ids = [i for i, _ in got]
    dups, lost = len(ids) - len(set(ids)), want - len(set(ids))
    print(f"| {scenario} | {sink} | {want} | {dups} | {lost} |")
    return dups, lost


def assert_exactly_once(p: Pipeline, scenario: str) -> None:
    """Every change of the workload once per sink, in commit order per key, and the same
    events on every sink."""
    got = sink_contents(p)
    for sink, items in got.items():
        assert tally(scenario, sink, p.work.changes, items) == (0, 0), sink
        assert per_key([e for _, e in items]) == p.work.expected, sink
    assert {i for i, _ in got["kafka"]} == {i for i, _ in got["nats"]} == {i for i, _ in got["redis"]}


# --------------------------------------------------------------------------- 1-3: the sinks' servers


def fault_then_catch_up(p: Pipeline, server: str, sig: int = signal.SIGKILL, *, source: bool = False,
                        ready: Callable[[], bool] = lambda: True) -> Faulted:
    """A first run (sinks placed at the head), a wave, a run faulted by stopping ``server``
    with ``sig`` (once ``ready()`` holds) and restarting it, a second wave, and runs until
    caught up. ``source``: the server is the pipeline's source, whose death cuts the run's read
    short."""
    p.run_ok("place")
    p.work.wave(600)
    wave = p.work.changes
    pid = server_pid(server)

    def fault() -> None:
        with restarted(server):
            stop_server(server, sig, pid)
            time.sleep(1)  # the run meets the dead server

    faulted = faulted_run(p, f"fault_{server}", fault, ready=ready)
    # The fault met the run with most of the wave still to go.
    assert faulted.at_fault * SUB_BATCH < wave / 2, (faulted, wave)
    if source:  # the read broke off: the run failed short of its range
        assert faulted.ended != "ok" and faulted.committed * SUB_BATCH < wave, (faulted, wave)
    if server in ("mysql", "postgres"):
        p.db.reconnect()
    p.work.wave(60)
    later = p.catch_up(f"after_{server}")
    print(f"{server}: the faulted run {faulted}, {wave} changes in its range; the runs after it ended "
          f"{later or 'ok'}")
    return faulted


class OpenTransaction:
    """Whether a topic holds a transaction in progress: a read_uncommitted consumer's high
    watermark is past the last stable offset a read_committed one gets. Closes its consumers
    once it said yes (they would only complain about the broker being killed)."""

    def __init__(self, bootstrap: str, topic: str):
        self.topic = topic
        self.consumers = [Consumer({"bootstrap.servers": bootstrap, "group.id": "fm-" + uuid.uuid4().hex,
                                    "isolation.level": level})
                          for level in ("read_committed", "read_uncommitted")]

    def __call__(self) -> bool:
        topic = self.consumers[0].list_topics(self.topic, timeout=10).topics[self.topic]
        for part in topic.partitions:
            stable, high = (c.get_watermark_offsets(TopicPartition(self.topic, part), timeout=10,
                                                    cached=False)[1] for c in self.consumers)
            if high > stable:
                self.close()
                return True
        return False

    def close(self) -> None:
        for c in self.consumers:
            c.close()
        self.consumers = []


def test_kafka_broker_sigkilled_mid_transaction(mysql_pipeline):
    p = mysql_pipeline
    in_transaction = OpenTransaction(p.cdc.kafka, p.topic)
    try:
        fault_then_catch_up(p, "kafka", ready=in_transaction)
    finally:
        in_transaction.close()
    assert_exactly_once(p, "Kafka SIGKILL + restart")


def test_redis_sigkilled_and_restarted_from_its_aof(mysql_pipeline):
    p = mysql_pipeline
    fault_then_catch_up(p, "redis")
    assert_exactly_once(p, "Redis SIGKILL + restart (AOF)")


def test_nats_sigkilled_and_restarted_from_file_storage(mysql_pipeline):
    p = mysql_pipeline
    fault_then_catch_up(p, "nats")
    assert_exactly_once(p, "NATS SIGKILL + restart")


def after(event: dict, checkpoint: BinlogPosition) -> bool:
    """Whether a MariaDB event lies after a checkpoint (a transaction boundary)."""
    at = event["source"]["position"]
    return not BinlogPosition(at["file"], at["pos"]) < checkpoint


def test_redis_restarted_empty_is_named_and_gets_nothing_until_an_operator_chooses(mysql_pipeline):
    """Redis loses everything it had (its AOF is deleted before the restart) while the store
    says the sink received changes: the sink holds no record of its own. The next run delivers
    nothing to it and fails naming the two rewinds; the operator goes on without the lost
    changes (a rewind to the current version), and the runs after it deliver to Redis exactly
    the changes after the store's checkpoint, once each, and nothing before it again. Kafka and
    NATS lose nothing."""
    p = mysql_pipeline
    p.run_ok("place")
    p.work.wave(300)
    run = p.start("fault_redis_empty")
    try:
        wait_for(lambda: p.writes(run.run_id) >= 2, "2 sub-batches committed", run=run)
        # The run waits (SIGSTOP) while Redis shuts down: an idle machine's run otherwise
        # delivered the whole wave during the shutdown (a CI run, rc 0, every sink ok).
        run.signal(signal.SIGSTOP)
        with restarted("redis"):
            stop_server("redis")
            run.signal(signal.SIGCONT)
            # With Redis gone no checkpoint of the sink can move; the run fails on its own.
            rc = run.wait()
            assert rc != 0, run.output()[-3000:]
            failed = explained_failure(run.output())
            held = p.cdc.store.checkpoints.get(p.name, "cache")
            shutil.rmtree(services_dir() / "redis" / "appendonlydir")
            (services_dir() / "redis" / "dump.rdb").unlink(missing_ok=True)
    finally:
        run.signal(signal.SIGKILL)
    p.work.wave(60)
    named = p.run("named")
    assert named.returncode == EXIT_FATAL, named.stdout[-3000:]  # until an operator chooses: no retry
    assert "sink cache keeps no checkpoint record of its own" in named.stderr, named.stderr[-3000:]
    on = f"to go on without them, tidegate checkpoints rewind {p.name} cache --to-version {held.version} "
    assert on in named.stderr, named.stderr[-3000:]
    assert redis_events(p.cdc.redis, p.redis_key) == []  # nothing delivered to it
    assert p.cdc.store.checkpoints.get(p.name, "cache") == held  # nor its checkpoint moved
    r = p.cli("checkpoints", "rewind", p.name, "cache", "--to-version", str(held.version),
              "--reason", "Redis lost its data; go on without it")
    assert r.returncode == 0, r.stderr[-3000:]
    resumed = p.run_ok("resumed")
    assert p.catch_up("after_redis_empty") == []
    print(f"redis empty: the faulted run ended {failed!r}; the store held the cache sink at "
          f"{held.position}; the next run failed naming the rewinds")

    got = sink_contents(p)
    for sink in ("kafka", "nats"):
        assert tally("Redis restarted empty", sink, p.work.changes, got[sink]) == (0, 0), sink
        assert per_key([e for _, e in got[sink]]) == p.work.expected, sink
    # NATS holds every change in source order: Redis holds exactly those after the checkpoint.
    owed = [i for i, e in got["nats"] if after(e, held.position)]
    assert 0 < len(owed) < p.work.changes
    assert tally("Redis restarted empty", "redis (after the store's checkpoint)", len(owed),
                 got["redis"]) == (0, 0)
    assert [i for i, _ in got["redis"]] == owed
    # The run after the operator's choice started the sink at the store's checkpoint and sent it just that.
    [cache] = [r for r in resumed["sinks"] if r["id"] == "cache"]
    assert (cache["start"]["file"], cache["start"]["pos"]) == (held.position.file, held.position.pos)
    assert cache["events"] == len(owed)


@pytest.mark.parametrize("rewound_first", [False, True], ids=["", "rewound-first"])
def test_redis_restored_from_an_older_backup_gets_what_it_lost_by_the_rewind_it_names(mysql_pipeline,
                                                                                        rewound_first):
    """Redis is restored from a copy of its AOF taken after a first run, once a second run has
    delivered more: the sink's record is older than the store's checkpoint, so Redis lost
    changes it had acknowledged. The next run delivers nothing to it and fails naming the
    version whose rewind delivers them again; after that rewind Redis holds every change once,
    in commit order per key, as Kafka and NATS do. ``rewound_first``: an operator rewinds Redis
    one version back before any run told the loss, which that rewind does not deliver again:
    the next run tells it all the same (campaign seeds 9724, 9727)."""
    p = mysql_pipeline
    p.run_ok("place")
    p.work.wave(60)
    p.run_ok("first")
    backup = backup_redis(services_dir() / "redis")
    p.work.wave(60)
    p.run_ok("second")
    stored = p.cdc.store.checkpoints.get(p.name, "cache")
    restore_redis(services_dir() / "redis", backup)
    if rewound_first:
        r = p.cli("checkpoints", "rewind", p.name, "cache", "--to-version", str(stored.version - 1),
                  "--reason", "unrelated")
        assert r.returncode == 0, r.stderr[-3000:]
        stored = p.cdc.store.checkpoints.get(p.name, "cache")
    p.work.wave(30)
    named = p.run("restored")
    assert named.returncode == EXIT_FATAL, named.stdout[-3000:]  # until an operator chooses: no retry
    again = re.search(rf"to deliver the missing changes again, tidegate checkpoints rewind {p.name} cache "
                      rf"--to-version (\d+) ", named.stderr)
    on = f"to go on without them, tidegate checkpoints rewind {p.name} cache --to-version {stored.version} "
    assert again and on in named.stderr, named.stderr[-3000:]
    assert int(again[1]) < stored.version
    assert p.cdc.store.checkpoints.get(p.name, "cache") == stored  # nothing moved
    r = p.cli("checkpoints", "rewind", p.name, "cache", "--to-version", again[1],
              "--reason", "Redis restored from a backup")
    assert r.returncode == 0, r.stderr[-3000:]
    assert p.catch_up("after_rewind") == []
    assert_exactly_once(p, "Redis restored from an older backup, then the rewind it named")


def test_redis_restored_under_a_stopped_run_fails_the_run_instead_of_hiding_the_loss(mysql_pipeline):
    """A run is stopped (SIGSTOP) after two sub-batches while Redis is restored from a copy taken
    before the run, then woken: its next sub-batch finds a record other than the one it set, so
    the Redis sink fails (its EXEC would have set the record over the loss, and no later run
    could have told it), the record stays the restored one, and the next run names the rewind
    that delivers what was lost. After it Redis holds every change once, as Kafka and NATS do."""
    p = mysql_pipeline
    p.run_ok("place")
    p.work.wave(20)
    p.run_ok("first")
    data = services_dir() / "redis"
    backup = backup_redis(data)
    restored = redis_record(p)
    p.work.wave(300)
    run = p.start("restored_under")
    try:
        wait_for(lambda: p.writes(run.run_id, "cache") >= 2, "2 sub-batches committed", run=run)
        run.signal(signal.SIGSTOP)
        restore_redis(data, backup)
        run.signal(signal.SIGCONT)
        assert run.wait() != 0, run.output()[-3000:]
    finally:
        run.signal(signal.SIGKILL)
    assert "the server lost changes it had acknowledged during this run" in run.output(), run.output()[-3000:]
    assert redis_record(p) == restored  # not set over the loss
    named = p.run("named")
    again = re.search(rf"to deliver the missing changes again, tidegate checkpoints rewind {p.name} cache "
                      rf"--to-version (\d+) ", named.stderr)
    assert named.returncode == EXIT_FATAL and again, named.stderr[-3000:]
    r = p.cli("checkpoints", "rewind", p.name, "cache", "--to-version", again[1], "--reason", "restored")
    assert r.returncode == 0, r.stderr[-3000:]
    assert p.catch_up("after_rewind") == []
    assert_exactly_once(p, "Redis restored under a stopped run, then the rewind it named")


def redis_record(p: Pipeline) -> bytes | None:
    with redis_client(p.cdc.redis) as r:
        return r.get(f"tidegate:checkpoint:default/{p.name}::sink::cache")


# --------------------------------------------------------------------------- 4: the sources


def test_mariadb_sigkilled_and_restarted_while_a_run_reads(mysql_pipeline):
    p = mysql_pipeline
    fault_then_catch_up(p, "mysql", source=True)
    assert_exactly_once(p, "MariaDB SIGKILL + restart")


def test_postgres_crash_restart_while_a_run_streams_the_slot(postgres_pipeline):
    p = postgres_pipeline
    # SIGQUIT is PostgreSQL's immediate shutdown: every backend (the run's walsender too) is
    # killed at once and the next start recovers from the WAL, as after a crash.
    fault_then_catch_up(p, "postgres", signal.SIGQUIT, source=True)
    assert_exactly_once(p, "PostgreSQL crash + restart")


# --------------------------------------------------------------------------- 5: a zombie run


def store_writable(store_path: Path) -> bool:
    probe = sqlite3.connect(store_path, timeout=0)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:  # "database is locked": a writer is inside a transaction
        return False
    finally:
        probe.close()


def stop_right_after_a_commit(p: Pipeline, run: Run) -> None:
    """SIGSTOP the run's process group as soon as it has committed another sub-batch's
    checkpoints: its next sub-batch is then usually on its way to the sinks, so once resumed
    the zombie has writes to attempt (which sink meets the fence first is up to timing; the
    waiting-on-redis variant makes one certain). It must hold no SQLite write lock when stopped
    (a writer stopped inside a store transaction would block every other one: not the fault
    under test); if it does, it is resumed and stopped after its next commit."""
    for _ in range(20):
        seen = p.writes(run.run_id)
        while p.writes(run.run_id) == seen:  # no sleep: stop within a millisecond of the commit
            assert run.proc.poll() is None, f"the run ended before it was stopped:\n{run.output()[-3000:]}"
        run.signal(signal.SIGSTOP)
        if store_writable(p.cdc.base / "store.sqlite"):
            return
        run.signal(signal.SIGCONT)
    raise AssertionError("the run held the store's write lock whenever it was stopped")


def stop_while_it_waits_on_redis(p: Pipeline, run: Run) -> None:
    """Stall Redis (SIGSTOP) until the run's next sub-batch waits on it, stop the run there, then
    SIGKILL Redis and restart it from its AOF: the run's pending MULTI/EXEC dies with the server
    unexecuted, so once resumed the zombie still has that Redis write to attempt, whatever the
    timing of its other sinks."""
    pid = server_pid("redis")
    with restarted("redis"):
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(0.5)  # a sub-batch takes ~30 ms: by now the run waits on Redis
            run.signal(signal.SIGSTOP)
        finally:
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: gone(pid), "Redis to end")
    assert store_writable(p.cdc.base / "store.sqlite")


@pytest.mark.parametrize("stop", [stop_right_after_a_commit, stop_while_it_waits_on_redis],
                         ids=["after-a-commit", "waiting-on-redis"])
def test_zombie_run_resumed_after_a_newer_run_writes_nothing(mysql_pipeline, stop):
    p = mysql_pipeline
    p.run_ok("place")
    p.work.wave(300)
    zombie = p.start("zombie")
    try:
        wait_for(lambda: p.writes("zombie") >= 1, "the zombie committed a sub-batch", run=zombie)
        stop(p, zombie)
        taken = p.run("takeover")  # takes the lease and delivers the rest
        assert taken.returncode == 0, taken.stderr[-3000:]
        assert p.catch_up("after_takeover") == []
        before, history = sink_contents(p), p.history()

        zombie.signal(signal.SIGCONT)
        rc = zombie.wait(120)
    finally:
        zombie.signal(signal.SIGKILL)
    out = zombie.output()
    after_ = sink_contents(p)
    extra = {sink: len(after_[sink]) - len(before[sink]) for sink in before}
    print(f"zombie stopped {stop.__name__}: rc={rc}, extra messages per sink {extra}; its last line: "
          f"{[ln for ln in out.splitlines() if ln.startswith('tidegate: ')][-1:]}")
    problems = {sink: f"{n} message(s) written by the zombie" for sink, n in extra.items() if n}
    if p.history() != history:
        problems["store"] = "a checkpoint moved after the takeover"
    # Fenced by a sink (it checks the lease epoch with its write) or by the store (a checkpoint
    # write under the stale epoch): either way the error says another run took over.
    if rc == 0 or not re.search(r"^tidegate: .*(fenced|another run took the lease)", out, re.M):
        problems["exit"] = f"rc={rc}, no error naming the fencing: {out.strip().splitlines()[-1:]}"
    last = ([ln for ln in out.splitlines() if ln.startswith("tidegate: ")] or [""])[-1]
    # Fenced by a sink: a takeover, not a timed-out transaction, and the run that took the lease.
    if "failed fatally" in last and ("timed out" in last or "took the pipeline's lease" not in last):
        problems["fenced"] = f"not told as a takeover: {last}"
    assert problems == {}, out[-4000:]
    assert_exactly_once(p, "zombie run resumed after a takeover")



def stop_after_its_last_commit(p: Pipeline, run: Run) -> bool:
    """SIGSTOP the run as soon as every sink's checkpoint is at the run's upper bound (its
    record's): its delivery is done, its exit not yet. False when it exited first."""
    upto = None
    while run.proc.poll() is None:  # no sleep: stop within a millisecond of the last commit
        if upto is None:
            record = p.cdc.store.runs.record(p.name, run.run_id)
            upto = record and position_from_json(record["bounds"]["upto"])
            continue
        current = p.cdc.store.checkpoints.current(p.name)
        if all(sid in current and current[sid].position >= upto for sid in SINKS):
            run.signal(signal.SIGSTOP)
            if store_writable(p.cdc.base / "store.sqlite"):
                return True
            run.signal(signal.SIGCONT)
    return False


def test_a_zombie_stopped_after_its_last_commit_ends_ok_and_writes_nothing(mysql_pipeline):
    """Campaign seed 5309: a run stopped right after its last commit, taken over (the source
    written between) and woken has nothing left to write, so nothing to be fenced from: it ends
    ok and writes nothing (no message, no checkpoint); every change is there once."""
    p = mysql_pipeline
    p.run_ok("place")
    for attempt in range(8):
        p.work.wave(120)
        zombie = p.start(f"zombie{attempt}")
        try:
            if not stop_after_its_last_commit(p, zombie):  # it exited first: try again
                assert zombie.wait() == 0, zombie.output()[-3000:]
                continue
            p.work.wave(40)
            taken = p.run(f"takeover{attempt}")
            assert taken.returncode == 0, taken.stderr[-3000:]
            before, history = sink_contents(p), p.history()
            zombie.signal(signal.SIGCONT)
            rc = zombie.wait(120)
        finally:
            zombie.signal(signal.SIGKILL)
        print(f"the zombie stopped after its last commit on attempt {attempt + 1}: rc={rc}")
        assert rc == 0, zombie.output()[-3000:]
        assert sink_contents(p) == before and p.history() == history
        assert_exactly_once(p, "zombie stopped after its last commit")
        return
    pytest.fail("the run exited before it could be stopped after its last commit, 8 times")


# --------------------------------------------------------------------------- 6: a transaction past the limits


def committed_of(p: Pipeline, ids: range) -> dict[str, int]:
    """How many changes of the rows ``ids`` each sink holds now (Kafka read_committed)."""
    got = sink_contents(p)
    return {sink: sum(1 for _, e in items if (e.get("after") or e.get("before") or {}).get("id") in ids)
            for sink, items in got.items()}


@pytest.mark.parametrize(("source", "seed"),
                         [("mysql", 61), ("mysql", 62), ("postgres", 63), ("pgoutput", 64)])
def test_a_transaction_past_the_sub_batch_limits_killed_mid_delivery(request, source, seed):
    """A source transaction of hundreds of rows against sub-batches of 10 events: the run keeps it
    on disk and delivers it as one sub-batch (one Kafka transaction, one MULTI/EXEC). Generated
    per seed: the single-row transactions around it, its size, and the moment of the SIGKILL
    (once NATS holds a generated share of it, so the kill lands mid-delivery); then a wave
    and a second large transaction are written before the rerun. Right after the kill, Kafka
    (read_committed) and Redis hold all of the large transaction or none of it; NATS any prefix.
    After the catch-up, every change is on every sink once, in commit order per key."""
    rng = random.Random(seed)
    p = request.getfixturevalue(f"{source}_pipeline")
    p.run_ok("place")
    p.work.wave(rng.randint(1, 20))
    before = p.work.changes  # NATS holds these first (the place run sent nothing)
    rows = p.work.bulk(rng.randint(300, 900))
    p.work.wave(rng.randint(0, 20))
    changes = len(rows) + len(rows) // 3  # the bulk transaction's events (an update per 3rd row)
    share = rng.randint(1, changes - 1)

    run = p.start(f"killed_{seed}")
    try:
        def stored_share() -> bool:
            return run.proc.poll() is not None or nats_count(p.cdc.nats, p.stream, p.topic) >= before + share

        wait_for(stored_share, f"NATS to hold {share} changes of the large transaction")
        run.signal(signal.SIGKILL)
        run.wait()
    finally:
        run.signal(signal.SIGKILL)
    held = committed_of(p, rows)
    print(f"seed {seed}: {len(rows)} rows, {changes} changes in one transaction; killed with NATS at "
          f">= {share}; the sinks then held {held}")
    assert held["kafka"] in (0, changes) and held["redis"] in (0, changes), held
    assert held["nats"] <= changes

    p.db.reconnect()
    p.work.wave(rng.randint(1, 10))
    p.work.bulk(rng.randint(100, 400))
    rerun = p.run_ok(f"rerun_{seed}")
    # Both large transactions are in the rerun's range and read back from disk, unless the killed
    # run had committed the first to the store before the kill (a fresh-clone run of seed 63 did),
    # or to every sink, which the rerun then adopts (a CI run of seeds 61 and 62 on a loaded
    # machine: the kill landed after the three sinks' commits, before the store's). The
    # single-row transactions before it fill sub-batches of SUB_BATCH: it is the next one.
    first_committed = p.writes(f"killed_{seed}") > -(-before // SUB_BATCH)
    # Kafka and Redis hold it whole; NATS holds every message, its commit marker maybe not yet
    everywhere = held["kafka"] == held["redis"] == held["nats"] == changes
    allowed = {1} if first_committed else {1, 2} if everywhere else {2}
    assert rerun["spilled_sub_batches"] in allowed, (first_committed, held, rerun)
    later = p.catch_up(f"after_{seed}")
    print(f"seed {seed}: the runs after the kill ended {later or 'ok'}")
    assert_exactly_once(p, f"seed {seed}: large transaction, SIGKILL mid-delivery")


# --------------------------------------------------------------------------- 7: killed, retried, then cleared


def keys_held(p) -> dict[str, list[str]]:
    """The idempotency keys Kafka (read_committed) and Redis hold, in their order."""
    return {"events": [c["idempotency_key"] for c in kafka_changes(p.cdc.kafka, p.topic)],
            "cache": redis_ids(p.cdc.redis, p.redis_key)}


def test_a_run_killed_after_some_sub_batches_then_retried_and_cleared_resends_both_attempts(
        mysql_pipeline):
    """A run SIGKILLed after it moved some checkpoints, retried to the end, then cleared: the clear
    re-sends everything the run delivered over both attempts, the killed one's sub-batches too.

    MariaDB to Kafka (exactly once, read_committed), NATS and Redis, `tidegate run` processes as the
    fault matrix starts them. The killed attempt never reaches its end, where a run used to journal
    what each sink received; the journal now follows every checkpoint write, so the killed
    attempt's part of the range is journaled up to its last store write (before, a clear re-sent
    only what the retry delivered)."""
    p = mysql_pipeline
    p.run_ok("place")
    p.work.wave(120)  # 120 inserts, 40 updates, 24 deletes: 19 sub-batches of 10
    run = p.start("r1")
    try:
        wait_for(lambda: run.proc.poll() is not None or p.writes("r1") >= 3,
                 "the run to commit three sub-batches to the store")
        run.signal(signal.SIGKILL)
        run.wait()
    finally:
        run.signal(signal.SIGKILL)
    killed_at = p.writes("r1")
    assert killed_at >= 3, "the run ended before it could be killed mid-range"
    p.work.wave(10)  # written between the kill and the retry
    p.run_ok("r1")  # the retry: the run id again, and the killed attempt finished nothing
    delivered = keys_held(p)
    assert len(delivered["events"]) == len(set(delivered["events"])) == p.work.changes

    replay = p.run_ok("r1")  # a clear of the run that finished: a replay of its range
    again = keys_held(p)
    for sid in ("events", "cache"):
        resent = collections.Counter(again[sid]) - collections.Counter(delivered[sid])
        assert resent == collections.Counter(delivered[sid]), (sid, killed_at, replay["sinks"])


def _delivered_since(p: Pipeline, before: dict[str, list[str]]) -> tuple[dict, dict[str, list[str]]]:
    """What Kafka (a multiset: its three partitions are read one after the other) and Redis (in
    order) hold now that they did not hold at ``before``; and what they hold now."""
    now = keys_held(p)
    return {"events": collections.Counter(now["events"]) - collections.Counter(before["events"]),
            "cache": now["cache"][len(before["cache"]):]}, now


# Seeds 1-30 pass; with the journal written only at a run's end, 10 of them fail (6 and 11 among
# them, kept here). TIDEGATE_KILL_CLEAR_SEEDS="1 2 ..." runs others.
KILL_CLEAR_SEEDS = [int(s) for s in os.environ.get("TIDEGATE_KILL_CLEAR_SEEDS", "6 11").split()]


@pytest.mark.parametrize("seed", KILL_CLEAR_SEEDS)
def test_generated_kills_retries_and_clears(mysql_pipeline, seed):
    """Generated schedules of waves, runs, runs SIGKILLed after 1-3 sub-batches reached the store
    and retried under the same run id (writes between, as often as not), and clears of finished
    runs. Each run's deliveries are what Kafka (read_committed) and Redis hold after it that they
    did not before; a clear must re-send exactly that, on Kafka as a multiset (three
    partitions), on Redis in order."""
    rnd = random.Random(seed)
    p = mysql_pipeline
    p.run_ok("place")
    by_run: dict[str, dict[str, list[str]]] = {}
    seen = keys_held(p)
    for step in range(rnd.randint(6, 10)):
        op = rnd.choice(["wave", "run", "kill", "clear"])
        if op == "wave" or p.work.changes == 0:
            p.work.wave(rnd.randint(5, 40))
            continue
        # A run that delivered nothing journals nothing: run again, its id reads new changes.
        done = sorted(r for r in by_run if any(e.status == "success" and e.mode == "incremental"
                                               for e in p.cdc.store.runs.entries(p.name, r)))
        if op == "clear" and done:
            rid = rnd.choice(done)
            p.run_ok(rid)
            got, seen = _delivered_since(p, seen)
            assert got["events"] == by_run[rid]["events"], (seed, step, rid)
            assert got["cache"] == by_run[rid]["cache"], (seed, step, rid)
            continue
        rid = f"r{step}"
        if op == "kill":
            run = p.start(rid)
            k = rnd.randint(1, 3)
            try:
                wait_for(lambda run=run, k=k, rid=rid: run.proc.poll() is not None or p.writes(rid) >= k,
                         f"run {rid} to commit {k} sub-batches")
                run.signal(signal.SIGKILL)
                run.wait()
            finally:
                run.signal(signal.SIGKILL)
            if rnd.random() < 0.5:
                p.work.wave(rnd.randint(1, 10))  # written between the kill and the retry
            finished = any(e.status == "success" for e in p.cdc.store.runs.entries(p.name, rid))
            if not finished:  # else the kill came after its end: a retry would be a clear
                p.run_ok(rid)
        else:
            p.run_ok(rid)
        by_run[rid], seen = _delivered_since(p, seen)
