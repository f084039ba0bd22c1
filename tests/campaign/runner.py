"""The campaign runner: for each seed, a pipeline of its own on MariaDB or PostgreSQL, a random
workload, a random schedule of real faults while `tidegate run` delivers it, runs until caught up
(failed runs retried, as Airflow would), then the oracle (oracle.py) per sink.

Usage (the project's root; `make campaign` wraps it)::

    make campaign SEEDS=20                 # seeds 1..20
    make campaign SEED=7                   # one seed (reproduces a failure it printed)
    make campaign SEEDS=10 FIRST=100       # seeds 100..109
    make campaign SEEDS=10 SOURCES=postgres SINKS=kafka,nats KINDS=run_kill,zombie
    make campaign SEEDS=4 SINKS=delta      # Delta schedules only (Spark Connect clients)
    make campaign SEEDS=4 DELIVERY=executor  # every run delivered by a Spark task on a cluster
    make campaign SEEDS=10 HANGS=past_timeouts  # store and source timeouts of 3 s, hangs past them
    make campaign SEEDS=10 SNAPSHOTS=resnapshot  # one faulted run per schedule re-loads tables
    make campaign SEEDS=10 FAILOVERS=gtid  # MariaDB: the connection moves between GTID primary and replica
    make campaign SEEDS=10 REWINDS=random  # an operator rewinds a message sink, between runs or under one
    make campaign SEEDS=10 RETRIES=same_record  # a failed run delivered again from its record first
    make campaign SEEDS=10 POISON=dlq      # rows too large for Kafka and NATS, dead-lettered there
    make campaign SEEDS=10 POISON=dlq_mixed  # half of them past the Kafka client's own 16 MiB too
    make campaign SEEDS=10 TYPES=edges     # values at the edges of every column type, compared too
    make campaign SEEDS=10 PLUGIN=pgoutput # PostgreSQL read through pgoutput (left out: wal2json)

    python -m tests.campaign.runner --seeds 20 [--first 1] [--seed S] [--sources mysql,postgres]
        [--sinks kafka,nats,redis,delta] [--kinds ...] [--delta-share 0.1] [--delivery executor]
        [--hangs past_timeouts] [--snapshots resnapshot] [--failovers gtid] [--rewinds random|any]
        [--retries same_record] [--poison dlq|dlq_mixed] [--types edges] [--plugin pgoutput] [--keep-going]

Every seed prints its schedule and its verdict; a failed one prints the list of (moment, fault),
what the oracle found, and the command that reproduces it. The figure table at the end: fault
kind x sink x source: schedules, events, duplicates (and of them, those within a limit the README
states), lost, incidents (a schedule with several faults counts under each of its kinds).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import psycopg2
import pymysql
from tidegate.connections import get_connection
from tidegate.plan import EXIT_FATAL
from tidegate.positions import position_from_json
from tidegate.reading import MAX_SLICE_CONF
from tidegate.spec import DELIVERY_CONF
from tidegate.store import open_store

from tests.campaign import faults
from tests.campaign.generator import CLIENT_HUGE_BODY, HUGE_BODY, TABLES, SourceDb, Workload
from tests.campaign.oracle import SinkVerdict, verdicts
from tests.campaign.schedule import (
    DELIVERIES,
    EXECUTOR_FAULTS,
    FAULT_KINDS,
    HANG_TIMEOUT_S,
    KAFKA_TXN_TIMEOUT_MS,
    NATS_WINDOW_S,
    OPT_IN_KINDS,
    SINK_GROUPS,
    SNAPSHOT_CHUNK_ROWS,
    SOURCES,
    Rewind,
    Schedule,
    Step,
    draw,
)
from tests.conftest import services_cmd, services_env
from tests.integration.airflow_support import VENV_BIN
from tests.integration.test_continuity_e2e import wait_replica_has
from tests.integration.test_fault_matrix import IN_PROCESS_READS, Run, explained_failure

RUN_TIMEOUT_S = 180  # a run still going after this is a finding (hung)
REPLICA_CATCH_UP_S = 120  # the replica behind its primary longer than this is a campaign error
DELTA_RUN_TIMEOUT_S = 900  # with Delta sinks: a run may start Spark (local[2])
# Delta runs are clients of the shared Spark Connect server (the spec's spark.conn_id, as the
# DAGs deploy them): no Spark start per run, and a killed run's last Delta write may still be
# finished by the server. CAMPAIGN_DELTA_SPARK=local: each run starts a local Spark instead,
# and a kill takes the writer with it.
DELTA_SPARK = os.environ.get("CAMPAIGN_DELTA_SPARK", "connect")
MAX_RETRIES = 8
HUGE_SHARE = 0.03  # POISON=dlq: new notes rows with a body too large for Kafka and NATS
# Runs delivered by Spark tasks cut a MariaDB range into slices of this many binlog bytes and
# gather them (spark.tidegate.delivery: gathered), so a run's parts are read by tasks of their own
# and shuffled into the delivery task (a kill of the executor then also loses the parts' shuffle
# output, which Spark reads again).
EXECUTOR_SLICE_BYTES = 48 * 1024
WRITER_PAUSE_S = 0.1  # between the transactions written while a resnapshot reads
# What a run says of a sink that lost changes it had acknowledged (coordinator._may_deliver).
LOST = "lost changes it had acknowledged"
VERBOSE = bool(os.environ.get("CAMPAIGN_VERBOSE"))  # failed runs retried before a schedule is declared stuck


@dataclass
class Finding(Exception):
    what: str


@dataclass
class Outcome:
    schedule: Schedule
    verdicts: list[SinkVerdict] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)  # halts, hangs, stuck, silent failures
    failures: list[str] = field(default_factory=list)  # failed runs that said why (then retried)
    incidents: int = 0
    options: str = ""  # the subsets the schedule was drawn within (part of what a seed means)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.findings and all(v.ok for v in self.verdicts)

    def report(self) -> str:
        lines = [self.schedule.describe()]
        lines += [f"  step {n}" for n in self.notes]
        lines += [f"  failed run (retried): {f}" for f in self.failures]
        lines += [f"  FINDING: {f}" for f in self.findings]
        lines += [f"  ORACLE {v.problems()}" for v in self.verdicts if not v.ok]
        repro = f"make campaign SEED={self.schedule.seed}{self.options}"
        verdict = "ok" if self.ok else f"FAILED (reproduce: {repro})"
        lines.append(f"  -> {verdict} in {self.seconds:.0f}s; " + ", ".join(
            f"{v.sink} {v.received}/{v.events}" + (f" ({v.known} repeats the sink's guarantee allows)"
                                                   if v.known else "")
            + (f" ({v.snapshot_rows} snapshot rows)" if v.snapshot_rows else "")
            + (f" ({v.redelivered} delivered again after rewinds)" if v.redelivered else "")
            + (f" ({v.dead_letters} dead-lettered" + (f", {v.dead_letters_past_16mib} of them past 16 MiB"
                                                      if v.dead_letters_past_16mib else "") + ")"
               if v.dead_letters else "")
            + (f" ({v.stale} keys re-sent stale by a zombie)" if v.stale else "")
            + (f" ({v.control} control messages)" if v.control else "")
            for v in self.verdicts))
        return "\n".join(lines)


class Services:
    """The servers (scripts/services) and what every schedule shares."""

    def __init__(self, base: Path):
        services_cmd("up", "mysql", "postgres", "kafka", "redis", "nats")
        self.env = services_env()
        self.base = base
        conns = {c: get_connection(c, self.env) for c in ("cdc_mysql_admin", "cdc_postgres_admin",
                                                          "cdc_kafka", "cdc_nats", "cdc_redis")}
        self.mysql_admin, self.pg_admin = conns["cdc_mysql_admin"], conns["cdc_postgres_admin"]
        self.bootstrap = conns["cdc_kafka"].extra["bootstrap.servers"]
        self.nats, self.redis = conns["cdc_nats"], conns["cdc_redis"]
        self.connect_up = self.cluster_up = self.replica_up = False

    def spark_connect(self) -> None:
        """The Spark Connect server Delta runs are clients of, started on first use."""
        if not self.connect_up:
            services_cmd("up", "spark_connect")
            self.connect_up = True

    def spark_connect_cluster(self) -> None:
        """The Connect server on the standalone cluster that executor schedules deliver through
        (its executors are JVMs of their own), started on first use."""
        if not self.cluster_up:
            services_cmd("up", "spark_connect_cluster")
            self.cluster_up = True

    def mysql_replica(self) -> None:
        """The primary's GTID replica (it replicates with log_slave_updates, so its binlog holds
        the same transactions under the same GTIDs in files and offsets of its own), started on
        first use."""
        if not self.replica_up:
            services_cmd("up", "mysql_replica")
            self.replica_up = True

    def replica_connect(self):
        c = self.mysql_admin  # the users replicate: the primary's admin login, the replica's port
        port = get_connection("cdc_mysql_replica", self.env).port
        return pymysql.connect(host=c.host, port=port, user=c.login, password=c.password,
                               autocommit=True, connect_timeout=5)

    def pg_connect(self, dbname: str | None = None):
        c = self.pg_admin
        conn = psycopg2.connect(host=c.host, port=c.port, dbname=dbname or c.schema, user=c.login,
                                password=c.password, connect_timeout=5)
        conn.autocommit = True
        return conn

    def mysql_connect(self):
        c = self.mysql_admin
        return pymysql.connect(host=c.host, port=c.port, user=c.login, password=c.password,
                               database=c.schema, autocommit=True, connect_timeout=5)

    def pg_store_url(self, dbname: str) -> str:
        c = self.pg_admin
        return f"postgresql://{c.login}:{c.password}@{c.host}:{c.port}/{dbname}"


class Pipe:
    """One schedule's pipeline: its spec, store, runs and readers."""

    def __init__(self, sv: Services, sched: Schedule):
        self.sv, self.sched = sv, sched
        self.name = f"cg{sched.seed}_{random.Random().getrandbits(24):06x}"
        self.schema = self.name
        self.dir = sv.base / self.name
        (self.dir / "pipelines").mkdir(parents=True)
        self.lake = self.dir / "lake"
        self.sinks = sched.sinks
        self.bootstrap, self.nats, self.redis = sv.bootstrap, sv.nats, sv.redis
        if sched.store == "postgres":
            self.store_db = f"{self.name}_store"
            conn = sv.pg_connect()
            with conn.cursor() as c:
                c.execute(f'CREATE DATABASE "{self.store_db}"')
            conn.close()
            self.store_url = sv.pg_store_url(self.store_db)
            self.store_free = faults.postgres_store_free(sv.pg_connect, self.store_db)
        else:
            self.store_db = None
            self.store_url = f"sqlite:///{self.dir / 'store.sqlite'}"
            self.store_free = faults.sqlite_free(self.dir / "store.sqlite")
        kafka_conn = {"conn_type": "kafka", "extra": {"bootstrap.servers": sv.bootstrap,
                                                      "transaction.timeout.ms": KAFKA_TXN_TIMEOUT_MS}}
        self.env = dict(os.environ, **sv.env, TIDEGATE_PIPELINES_DIR=str(self.dir / "pipelines"),
                        TIDEGATE_CHECKPOINT_STORE=self.store_url,
                        TIDEGATE_READER_PROCESS_MIN_BYTES=IN_PROCESS_READS,
                        AIRFLOW_CONN_CAMPAIGN_KAFKA=json.dumps(kafka_conn),
                        PATH=f"{VENV_BIN}:{os.environ['PATH']}")
        if sched.past_timeouts:  # a run waiting on a hung store or source gives up after this
            self.env.update(TIDEGATE_STORE_TIMEOUT_S=str(HANG_TIMEOUT_S),
                            TIDEGATE_SOURCE_READ_TIMEOUT_S=str(HANG_TIMEOUT_S))
        if "delta_merge" in self.sinks and DELTA_SPARK == "connect":
            sv.spark_connect()
        if sched.delivery == "executor":
            sv.spark_connect_cluster()
        # what a delivering process is connected to (the executor faults find the task by them)
        self.ports = {(sv.mysql_admin if sched.source == "mysql" else sv.pg_admin).port,
                      int(sv.bootstrap.rsplit(":", 1)[1]), sv.nats.port, sv.redis.port}
        self.on_replica = False  # where the pipeline's connection points (failovers)
        self.rewound: list[tuple] = []  # (sink, position restored, checkpoint before the rewind)
        self.redis_data = Path(sv.env["TIDEGATE_SERVICES_DIR"]) / "redis"  # restore_redis
        self.redis_backup: Path | None = None
        self.named_last: dict[str, str] = {}  # sink -> the version a run named since the last restore
        # sinks the operator rewound as a run named: their data is held to exactly once still (a
        # table skips what it holds), their control messages may come again, as after any rewind
        self.named_rewinds: set[str] = set()
        self.restores = any(step.fault in ("restore_redis", "restore_delta") for step in sched.steps)
        self.delta_before: int | None = None  # restore_delta: the table's version before the step's run
        if sched.failover_steps:
            sv.mysql_replica()
            self.ports.add(get_connection("cdc_mysql_replica", sv.env).port)
        connect = sv.mysql_connect if sched.source == "mysql" else sv.pg_connect
        self.db = SourceDb(sched.source, connect, self.schema, typed=sched.types == "edges",
                           longest=CLIENT_HUGE_BODY if sched.huge_mixed else HUGE_BODY)
        self.db.create_tables()
        # as an operator would do for pgoutput: the tables' owner publishes them
        if sched.plugin == "pgoutput" and sched.source == "postgres":
            self.db.execute(f"CREATE PUBLICATION {self.name}_pub FOR TABLE "
                            + ", ".join(f"{self.schema}.{t}" for t in TABLES))
        (self.dir / "pipelines" / f"{self.name}.yaml").write_text(self.spec())
        self._store = None
        self.runs = 0
        self.live: list[Run] = []
        self.run_timeout = DELTA_RUN_TIMEOUT_S if "delta_merge" in self.sinks else RUN_TIMEOUT_S

    def spec(self) -> str:
        s = self.sched
        tables = ", ".join(f"{self.schema}.{t}" for t in TABLES)
        if s.source == "mysql":
            source = (f"{{kind: mysql, conn_id: cdc_mysql, tables: [{tables}], "
                      f"server_id: {49000 + s.seed % 10000}, start: head}}")
        else:
            # a rewind reads the slot again from an older checkpoint: the slot keeps that window
            # (otherwise the rewind is refused, naming this setting: seed 5832; the rewind a
            # restored sink's loss names too: seed 9808)
            keep = ", replay_retention: 1h" if s.rewinds or self.restores else ""
            # left out: wal2json, since the pipeline's user may not create a publication of the
            # tables (it owns none); pgoutput reads the one the workload's admin made (Pipe)
            keep += f", plugin: {s.plugin}" if s.plugin else ""
            keep += f", publication: {self.name}_pub" if s.plugin == "pgoutput" else ""
            source = f"{{kind: postgres, conn_id: cdc_postgres, tables: [{tables}], slot: {self.name}{keep}}}"
        batch = f"{{max_events: {s.max_events}, commit_policy: {s.policy}" + (
            f", quorum: {s.quorum}}}" if s.quorum else "}")
        sinks = {
            "kafka": '{id: kafka, kind: kafka, conn_id: campaign_kafka, topic: "{pipeline}.{table}", '
                     f"exactly_once: {str(s.kafka_exactly_once).lower()}, partitions: 3",
            "nats": f"{{id: nats, kind: nats, conn_id: cdc_nats, stream: {self.name.upper()}, "
                    f'subject: "{{pipeline}}.{{table}}", duplicate_window: {NATS_WINDOW_S}',
            "redis": '{id: redis, kind: redis, conn_id: cdc_redis, stream: "{pipeline}:{table}"',
            "delta_merge": f'{{id: delta_merge, kind: delta, mode: merge, '
                           f'path: "{self.lake}/{{pipeline}}/merged/{{schema}}/{{table}}"',
            "delta_log": f'{{id: delta_log, kind: delta, mode: changelog, '
                         f'path: "{self.lake}/{{pipeline}}/log/{{schema}}/{{table}}"',
        }
        poison = {"kafka", "nats"} if s.poison else set()  # the sinks the huge rows are poison to
        if s.envelope == "debezium":  # the BEGIN/END records too: the oracle checks their counts
            sinks["kafka"] += ", envelope: debezium, debezium: {transaction_metadata: true}"
        lines = [sinks[k] + (", on_poison: dlq" if k in poison else "")
                 + (", required: false}" if k in s.optional else "}") for k in s.sinks]
        connect = "delta_merge" in s.sinks and DELTA_SPARK == "connect"
        conf = f"{MAX_SLICE_CONF}: {EXECUTOR_SLICE_BYTES}, {DELIVERY_CONF}: gathered"
        cluster = f"{{conn_id: spark_connect_cluster, conf: {{{conf}}}}}"
        spark = ("spark: {conn_id: spark_connect}\n" if connect else
                 f"spark: {cluster}\n" if s.delivery == "executor" else "")
        snapshot = (f"snapshot: {{chunk_rows: {SNAPSHOT_CHUNK_ROWS}}}\n"
                    if s.resnapshot_step is not None else "")
        return textwrap.dedent(f"""\
            pipeline: {self.name}
            source: {source}
            batch: {batch}
            """) + snapshot + spark + "sinks:\n" + "".join(
            f"  - {ln}\n" for ln in lines)

    def delta_table(self, target: str) -> Path:
        """The Delta table of a restore_delta target ("merged/<table>" or "log/<table>")."""
        kind, table = target.split("/")
        return self.lake / self.name / kind / self.schema / table

    def delta_commits(self) -> int:
        """Commits in the Delta data tables' logs (the sinks' checkpoint tables left out)."""
        return sum(1 for f in self.lake.glob("*/*/*/*/_delta_log/*.json") if "_tidegate" not in f.parts)

    # ------------------------------------------------------------------ the store

    def history(self) -> dict[str, list]:
        return {sid: self._store_call(lambda st, sid=sid: st.checkpoints.history(self.name, sid))
                for sid in self.sinks}

    def writes(self, run_id: str) -> int:
        """Sub-batches the run has committed to the store (for any sink)."""
        try:
            if self._store is None:
                self._store = open_store(self.store_url)
            return max(sum(1 for h in self._store.checkpoints.history(self.name, sid)
                           if h.kind == "write" and h.run_id == run_id) for sid in self.sinks)
        except Exception:  # noqa: BLE001 - the store's server is down: nothing seen to move
            self.close_store()
            return -1

    def range_delivered(self, run_id: str) -> bool:
        """Whether every sink's checkpoint is at or past the run's upper bound (its record's):
        the run has nothing left to deliver."""
        def done(st) -> bool:
            upto = position_from_json(st.runs.record(self.name, run_id)["bounds"]["upto"])
            current = st.checkpoints.current(self.name)
            return all(sid in current and current[sid].position >= upto for sid in self.sinks)
        return self._store_call(done)

    def _store_call(self, fn):
        for attempt in range(30):
            try:
                if self._store is None:
                    self._store = open_store(self.store_url)
                return fn(self._store)
            except Exception:
                self.close_store()
                if attempt == 29:
                    raise
                time.sleep(1)

    def close_store(self) -> None:
        if self._store is not None:
            try:
                self._store.close()
            except Exception:  # noqa: BLE001, S110 - a broken connection
                pass
            self._store = None

    # ------------------------------------------------------------------ runs

    def start(self, run_id: str, args: tuple[str, ...] = (), log: str | None = None) -> Run:
        self.runs += 1
        run = Run.start(self.name, run_id, self.env, self.dir / f"{log or run_id}.log", args)
        run.started = time.monotonic()
        self.live.append(run)
        return run

    def settle(self, outcome: Outcome) -> None:
        """After a finding: every run still there woken and waited for (a zombie finishes or
        fails), so the oracle reads sinks nobody writes to."""
        for run in self.live:
            if run.proc.poll() is None:
                run.signal(signal.SIGCONT)
                try:
                    self.finish(run, outcome, zombie=True)  # a stopped leftover: fenced is right
                except Finding as f:
                    outcome.findings.append(f.what)
        self.live = []

    def finish(self, run: Run, outcome: Outcome, killed: bool = False, zombie: bool = False,
               refused: str = "") -> str:
        """Wait for a run: "ok", "idle" (nothing to do), "killed" (``killed``: SIGKILLed by the
        schedule) or its one-line error (a halt or a silent failure is a finding; a hang too; and
        an error classified fatal after a transient fault, which Airflow would not retry, unless
        it says ``refused``: a fault an operator must repair, which fails fast by design)."""
        try:
            rc = run.wait(self.run_timeout)
        except AssertionError:
            raise Finding(f"run {run.run_id} hung (still running after {self.run_timeout}s; "
                          f"its log: {run.out})") from None
        finally:
            run.signal(signal.SIGKILL)
        text = run.output()
        if VERBOSE:
            print(f"    {time.strftime('%H:%M:%S')} run {run.run_id} rc={rc} "
                  f"{time.monotonic() - run.started:.1f}s", flush=True)
        if rc == 0:
            return "idle" if '"nothing_to_do": true' in text else "ok"
        if killed and rc == -signal.SIGKILL:
            return "killed"
        try:
            said = explained_failure(text)
            # The CLI's exit status says how the engine classed the error (a server's own words
            # quoted in it, e.g. PostgreSQL's "FATAL:  the database system is shutting down",
            # seed 2976, do not). A fenced zombie must stop for good.
            if rc == EXIT_FATAL and not zombie and not (refused and refused in said):
                outcome.findings.append(f"run {run.run_id} failed fatally (Airflow would not retry) "
                                        f"after a transient fault: {said[:400]}")
            return said
        except AssertionError as exc:
            outcome.findings.append(f"run {run.run_id}: {str(exc).splitlines()[0][:400]}")
            if "halted" in str(exc):
                outcome.incidents += 1
                raise Finding(str(exc)) from None
            return "silent failure"

    def fail_over(self) -> str:
        """Point the pipeline's connection at the other server of the GTID pair (the workload
        keeps writing to the primary), once the replica holds every transaction the primary
        logged: the switch an operator makes after promoting a replica that was in sync. The
        primary's binlog is rotated first, so the two servers' files and offsets differ more."""
        primary = self.sv.mysql_connect()
        try:
            with primary.cursor() as c:
                c.execute("FLUSH BINARY LOGS")
        finally:
            primary.close()
        self.wait_replica()
        self.on_replica = not self.on_replica
        self.env["AIRFLOW_CONN_CDC_MYSQL"] = self.sv.env[
            "AIRFLOW_CONN_CDC_MYSQL_REPLICA" if self.on_replica else "AIRFLOW_CONN_CDC_MYSQL"]
        return "the replica" if self.on_replica else "the primary"

    def rewind(self, rw: Rewind) -> str:
        """`tidegate checkpoints rewind` of ``rw.sink``, ``rw.back`` versions before its latest,
        as an operator runs it; remembered for the oracle (what follows the restored position
        is delivered again)."""
        hist = self._store_call(lambda st: st.checkpoints.history(self.name, rw.sink))
        latest, target = hist[-1], hist[max(0, len(hist) - 1 - rw.back)]
        if target.version == latest.version:
            return f"rewind of {rw.sink} skipped: one version only"
        said = ""
        done = self._rewind_cli(rw.sink, target.version)
        refused = re.search(r"still running: .* Rewind to version (\d+)", done.stdout + done.stderr)
        if done.returncode != 0 and refused:  # as an operator would: to the version it names
            said = f" (v{target.version}, before a running snapshot's handoff, was refused)"
            target = next(h for h in hist if h.version == int(refused.group(1)))
            done = self._rewind_cli(rw.sink, target.version)
        if done.returncode != 0:
            raise Finding(f"tidegate checkpoints rewind of {rw.sink} to v{target.version} exited "
                          f"{done.returncode}")
        restored = self._store_call(lambda st: st.checkpoints.get(self.name, rw.sink)).position
        self.rewound.append((rw.sink, restored, latest.position))
        return f"{rw.sink} rewound from v{latest.version} to v{target.version} ({restored}){said}"

    def rewind_named(self, run: Run, outcome: Outcome) -> bool:
        """Whether the ended ``run`` named a sink's loss (the schedule restores Redis from older
        copies, or a Delta table to an older version): it must then name the rewind that delivers
        what was lost, which the operator runs, as soon as a run names it (a run with nothing to
        deliver opens no sink, nor a Delta sink a table with no change, so the first to tell may
        come steps later). Not remembered as a rewind: the oracle holds the sink to exactly
        once, so a rewind that restores too early (a duplicate) or too late (a loss) is a finding."""
        if not self.restores:
            return False
        said = run.output()  # (a run that met the restore in flight fails saying so, naming none)
        named = {m[1]: m[2] for m in re.finditer(
            r"`tidegate checkpoints rewind \S+ (\S+) --to-version (\d+|N) --reason \.\.\.` "
            r"\(delivers them again\)", said)}
        ran = [self._run_named(run, sink, version, outcome) for sink, version in named.items()]
        return any(ran)

    def _run_named(self, run: Run, sink: str, version: str, outcome: Outcome) -> bool:
        if version == "N":
            outcome.findings.append(f"run {run.run_id} told {sink}'s loss without naming the version")
            return False
        if self.named_last.get(sink) == version:  # it did not help (seed 9704)
            outcome.findings.append(f"run {run.run_id} named {sink}'s rewind to v{version} again, "
                                    f"right after it was run")
            return False
        self.named_last[sink] = version
        self.named_rewinds.add(sink)
        done = self._rewind_cli(sink, int(version))
        instead = re.search(r"still running: .* Rewind to version (\d+)", done.stdout + done.stderr)
        if done.returncode != 0 and instead:  # before a running snapshot's handoff: as it says
            done = self._rewind_cli(sink, int(instead[1]))
        if done.returncode != 0:
            raise Finding(f"the named rewind of {sink} to v{version} exited {done.returncode}")
        outcome.notes.append(f"run {run.run_id} named {sink}'s rewind to v{version}, which the operator ran")
        return True

    def _rewind_cli(self, sink: str, version: int) -> subprocess.CompletedProcess:
        return run_cli(["checkpoints", "rewind", self.name, sink, "--to-version", str(version),
                        "--reason", "campaign", "--who", "campaign"], self.env)

    def written_after_rewind(self, sink: str, run_id: str) -> list[int]:
        """The versions of ``sink``'s checkpoint that ``run_id`` wrote after the sink's last rewind
        (none: a rewind takes the lease, so a run in flight then can no longer write)."""
        hist = self._store_call(lambda st: st.checkpoints.history(self.name, sink))
        rewound_at = max((h.version for h in hist if h.kind == "rewind"), default=None)
        if rewound_at is None:
            return []
        return [h.version for h in hist if h.version > rewound_at and h.run_id == run_id]

    def failovers_recorded(self) -> int:
        return self._store_call(lambda st: sum(i.kind == "failover" for i in st.incidents.all(self.name)))

    def wait_replica(self) -> None:
        """Until the replica has applied every transaction the primary logged (a run reading
        the replica sees what the workload wrote; a source fault restarts the primary, and the
        replica reconnects to it within a second or so)."""
        primary, replica = self.sv.mysql_connect(), self.sv.replica_connect()
        try:
            # a replica started after the primary took many transactions replays them first
            wait_replica_has(primary, replica, timeout=REPLICA_CATCH_UP_S)
        finally:
            primary.close()
            replica.close()

    def catch_up(self, tag: str, outcome: Outcome, judged: bool = True) -> None:
        """Runs until one finds nothing to do; failed runs retried up to MAX_RETRIES. On the
        replica, once it has what the primary logged. ``judged``: a failed run is a finding too.
        These runs start after the fault is over (the server back, the stopped run woken or
        fenced, a zombie's takeovers must fence it): an Airflow retry would hide their failure,
        and the oracle, which judges only what the sinks hold at the end, would not see it
        (seed 6101's runs timed out three times before one got through)."""
        if self.on_replica:
            self.wait_replica()
        failed = 0
        for i in range(100):
            run = self.start(f"{tag}_{i}")
            ended = self.finish(run, outcome, refused=LOST if self.restores else "")
            if self.rewind_named(run, outcome):
                continue
            if ended == "idle":
                return
            if ended != "ok":
                outcome.failures.append(f"{tag}_{i}: {ended[:300]}")
                if judged:
                    outcome.findings.append(f"run {tag}_{i} failed with no fault in progress: {ended[:300]}")
                failed += 1
                if failed > MAX_RETRIES:
                    raise Finding(f"{tag}: not caught up after {failed} failed runs")
                time.sleep(1)
        raise Finding(f"{tag}: still delivering after 100 runs")

    def trigger(self, i: int) -> tuple[str, ...]:
        """The arguments of step ``i``'s faulted run: a resnapshot where the schedule says so."""
        if i != self.sched.resnapshot_step:
            return ()
        tables = ",".join(f"{self.schema}.{t}" for t in self.sched.resnapshot_tables)
        return ("--resolve", "resnapshot", "--tables", tables, "--reason", "campaign")

    def drop(self) -> None:
        self.close_store()
        try:
            self.db.drop()
            if self.sched.plugin == "pgoutput" and self.sched.source == "postgres":
                self.db.execute(f"DROP PUBLICATION IF EXISTS {self.name}_pub")
            if self.sched.source == "postgres":
                self.db.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                                f"WHERE slot_name = '{self.name}' AND NOT active")
            if self.store_db:
                conn = self.sv.pg_connect()
                with conn.cursor() as c:
                    c.execute(f'DROP DATABASE IF EXISTS "{self.store_db}" WITH (FORCE)')
                conn.close()
        except Exception as exc:  # noqa: BLE001 - clean-up only
            print(f"  (clean-up of {self.name}: {exc})")


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """`tidegate ARGS` in a process of its own, with the pipeline's environment."""
    done = subprocess.run([str(VENV_BIN / "tidegate"), *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    if done.returncode != 0:
        print(done.stdout[-2000:], done.stderr[-2000:], flush=True)
    return done


# --------------------------------------------------------------------------- one step


def wait_moment(p: Pipe, run: Run, moment: tuple[str, float]) -> bool:
    """Until the moment: k sub-batches committed, k Delta table commits made, or s seconds.
    False when the run ended first."""
    what, n = moment
    deadline = time.monotonic() + (n if what == "delay" else p.run_timeout)
    before = p.delta_commits() if what == "delta_commits" else 0
    while run.proc.poll() is None:
        if what == "commits" and p.writes(run.run_id) >= n:
            return True
        if what == "delta_commits" and p.delta_commits() - before >= n:
            return True
        if time.monotonic() >= deadline:
            return what == "delay"
        time.sleep(0.05 if what == "delay" else 0.02)
    return False


class Writer:
    """Transactions written while a run goes on, one every ``WRITER_PAUSE_S``, in a thread of its
    own; ``join`` raises what it raised."""

    def __init__(self, work: Workload, n: int):
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._wave, args=(work, n), daemon=True)
        self.thread.start()

    def _wave(self, work: Workload, n: int) -> None:
        try:
            for _ in range(n):
                work.transaction()
                time.sleep(WRITER_PAUSE_S)
        except BaseException as exc:  # noqa: BLE001 - given to join
            self.error = exc

    def join(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


def start_faulted(p: Pipe, work: Workload, i: int, step: Step, out: Outcome) -> tuple[Run, Writer | None]:
    """The step's wave and its faulted run. A resnapshot's run starts with the sinks caught up,
    so its handoff is the head and the rows no later change touches are snapshot rows. A fifth
    of its wave is written while it reads (keys changed during the snapshot: their rows are left
    to the log), unless the fault strikes the source's or the store's server (a transaction cut
    by it is not known to have committed, so the workload's model could not follow)."""
    if i != p.sched.resnapshot_step:
        work.wave(step.wave)
        return p.start(f"s{i}_fault"), None
    during = 0 if step.fault.endswith(("_source", "_store")) else max(3, step.wave // 5)
    work.wave(step.wave - during)
    p.catch_up(f"s{i}_before", out)
    run = p.start(f"s{i}_fault", p.trigger(i))
    return run, Writer(work, during) if during else None


def apply_step(p: Pipe, work: Workload, i: int, step: Step, out: Outcome) -> None:
    if step.fault in ("restore_redis", "restore_delta") and i == p.sched.resnapshot_step:
        # What a sink loses of a snapshot that completes only a second resnapshot re-loads (no
        # rewind does), and the oracle models one: the restore is left out of that step.
        out.notes.append(f"{i + 1}: {step.fault} left out: the step's run is a resnapshot")
        step = dataclasses.replace(step, fault="none")
    elif step.fault == "restore_redis":  # the backup the fault restores: before the step's run
        p.redis_backup = faults.backup_redis(p.redis_data)
    elif step.fault == "restore_delta":  # the version the fault restores: before the step's run
        table = p.delta_table(step.target)
        if faults.delta_version(table) is None:  # (a Delta schedule's one step: its run writes first)
            touch(work, step.target.split("/")[1])
            p.catch_up(f"s{i}_table", out)
        p.delta_before = faults.delta_version(table)
    run, writer = start_faulted(p, work, i, step, out)
    if step.fault == "zombie":
        zombie(p, work, i, step, run, out, writer)
        return
    if not wait_moment(p, run, step.moment):
        out.notes.append(f"{i + 1}: {step.fault} missed: the run ended before {step.moment}")
        p.finish(run, out)
        p.rewind_named(run, out)
        if writer:
            writer.join()
        if i in p.sched.failover_steps or any(r.step == i for r in p.sched.rewinds):
            recover(p, i, out)
        return
    rewind = next((r for r in p.sched.rewinds
                   if r.step == i and r.in_flight and not hides_loss(step, r)), None)
    if rewind:  # the run in flight is fenced from here on: failing for it is right
        out.notes.append(f"{i + 1}: while the run delivers, {p.rewind(rewind)}")
    at = p.writes(run.run_id)
    if step.fault in EXECUTOR_FAULTS:
        executor_fault(p, run, step, i, out)
    elif step.fault == "run_kill":
        run.signal(signal.SIGKILL)
    elif step.fault.startswith("run_"):  # run_stop, run_stall_nats, run_stall_kafka
        run.signal(signal.SIGSTOP)
        time.sleep(step.hold)
        run.signal(signal.SIGCONT)
    elif step.fault == "retype_redis":
        faults.retype_stream(p.redis, f"{p.name}:{step.target}")
    elif step.fault == "restore_redis":
        faults.restore_redis(p.redis_data, p.redis_backup, step.hold)
        p.named_last.pop("redis", None)
    elif step.fault == "restore_delta":
        restore_delta(p, step, out)
    elif step.fault == "none":  # left out (above)
        pass
    else:
        how, role = step.fault.split("_", 1)
        name = faults.server_name(role, p.sched.source)
        if how == "kill":
            faults.kill_server(name, step.hold)
        else:
            faults.hang_server(name, step.hold)
        if name in ("mysql", "postgres"):
            p.close_store()
    retyped = step.fault == "retype_redis"
    ended = p.finish(run, out, killed=step.fault == "run_kill", zombie=rewind is not None,
                     refused="not a stream" if retyped else LOST if p.restores else "")
    out.notes.append(f"{i + 1}: {step.fault} after {at} sub-batches; the run ended {ended[:200]}")
    p.rewind_named(run, out)
    if retyped:  # the operator's repair, before any other run
        faults.restore_stream(p.redis, f"{p.name}:{step.target}")
    late = p.written_after_rewind(rewind.sink, run.run_id) if rewind else []
    if late:
        out.findings.append(f"step {i + 1}: the run in flight wrote {rewind.sink}'s checkpoint after "
                            f"the rewind (versions {late}): it was not fenced")
    if writer:
        writer.join()
    if step.writes_between:
        work.wave(step.writes_between)  # between the crash and the rerun
    if step.fault == "restore_delta":  # what the sink promises: the next run with a change of the table tells
        touch(work, step.target.split("/")[1])
    # Airflow retries a failed deliver task, not one that failed fast (a fatal error: a fenced
    # zombie, a halt), which an operator clears by hand after resolving it.
    if p.sched.retries and ended not in ("ok", "idle") and run.proc.returncode != EXIT_FATAL:
        retry = p.start(run.run_id, ("--retry",), log=f"{run.run_id}_retry")
        retried = p.finish(retry, out, refused=LOST if p.restores else "")
        out.notes.append(f"{i + 1}: the run retried from its record ended {retried[:200]}")
        # The fault is over: its retry has nothing to fail on, but a sink's loss the operator
        # has just been told (and has run the rewind for).
        if not p.rewind_named(retry, out) and retried not in ("ok", "idle"):
            out.findings.append(f"step {i + 1}: the run retried from its record failed: {retried[:300]}")
    recover(p, i, out)


def restore_delta(p: Pipe, step: Step, out: Outcome) -> None:
    """The step's Delta table taken back to its version before the step's run (none: left out)."""
    if p.delta_before is None:
        out.notes.append(f"restore_delta left out: {step.target} had no commit before the run")
        return
    faults.restore_delta(p.delta_table(step.target), p.delta_before, p.env)
    p.named_last.pop("delta_merge" if step.target.startswith("merged/") else "delta_log", None)


def touch(work: Workload, table: str) -> None:
    """Transactions until one changes ``table``."""
    def changes() -> int:
        return sum(len(v) for k, v in work.expected.items() if k[0] == table)

    before = changes()
    while changes() == before:
        work.transaction()


def hides_loss(step: Step, rw: Rewind) -> bool:
    """A rewind of Redis drawn for the step that restores it from an older copy is left out: the
    restore takes back some of the copies that rewind asks for, which the oracle counts exactly.
    (The runs do tell a loss such a rewind leaves out, naming the version that delivers it:
    seeds 9724 and 9727 ended with Redis exact, every change once, and only the oracle's count
    of the rewind's copies off; test_fault_matrix.py holds it on its own.)"""
    return step.fault == "restore_redis" and rw.sink == "redis"


def recover(p: Pipe, i: int, out: Outcome) -> None:
    """The runs after step ``i``'s fault, until caught up: after the step's rewind between runs,
    if it has one (the reruns deliver again what follows the restored position), and on the
    other server of the GTID pair when the schedule fails over there (the first of them then
    translates the checkpoints, or a killed run's sink-side records, by GTID set)."""
    for rw in p.sched.rewinds:
        if rw.step == i and not rw.in_flight and not hides_loss(p.sched.steps[i], rw):
            out.notes.append(f"{i + 1}: {p.rewind(rw)}")
    if i not in p.sched.failover_steps:
        p.catch_up(f"s{i}_after", out)
        return
    before = p.failovers_recorded()
    out.notes.append(f"{i + 1}: failed over to {p.fail_over()}")
    p.catch_up(f"s{i}_after", out)
    if p.failovers_recorded() != before + 1:  # the runs on the other server did not notice it
        out.findings.append(f"step {i + 1}: the failover to the other server is not one 'failover' "
                            f"incident in the store ({before} before, {p.failovers_recorded()} after)")


def executor_fault(p: Pipe, run: Run, step: Step, i: int, out: Outcome) -> None:
    """A fault of the Spark task that delivers the run (its client, `tidegate run`, waits). At
    an early moment the task may not have started yet: it is waited for while the run lasts."""
    deadline = time.monotonic() + 15
    while (not faults.delivering_workers(p.ports) and run.proc.poll() is None
           and time.monotonic() < deadline):
        time.sleep(0.05)
    if step.fault == "task_worker_kill":
        found = faults.kill_delivery_worker(p.ports)
    elif step.fault == "executor_kill":
        found = faults.kill_executors()
    else:
        found = faults.stall_delivery(p.ports, step.hold)
    if not found:
        out.notes.append(f"{i + 1}: {step.fault} missed: no delivering Spark task found")


def zombie(p: Pipe, work: Workload, i: int, step: Step, run: Run, out: Outcome,
           writer: Writer | None = None) -> None:
    """Stop the run right after a commit, let takeover runs finish the work (with source writes
    between), then wake it: it must write nothing and fail naming the fencing, unless it was
    stopped after its last commit (nothing left for it to write: it may end ok)."""
    if not wait_moment(p, run, step.moment) or not faults.stop_clean(run, lambda: p.writes(run.run_id),
                                                                       p.store_free):
        out.notes.append(f"{i + 1}: zombie missed: the run ended first")
        p.finish(run, out)
        if writer:
            writer.join()
        if i in p.sched.failover_steps or any(r.step == i for r in p.sched.rewinds):
            recover(p, i, out)
        return
    if writer:  # the wave written while the run read, before the takeovers write theirs
        writer.join()
    at, done = p.writes(run.run_id), p.range_delivered(run.run_id)
    try:
        for t in range(step.takeovers):
            if step.writes_between:
                work.wave(step.writes_between)
            p.catch_up(f"s{i}_takeover{t}", out)
    finally:
        run.signal(signal.SIGCONT)
    ended = p.finish(run, out, zombie=True)
    out.notes.append(f"{i + 1}: zombie stopped after {at} sub-batches, woken after {step.takeovers} "
                     f"takeover(s); it ended {ended[:200]}")
    if ended in ("ok", "idle") and done and p.writes(run.run_id) == at:
        # Stopped after its last commit (seed 5309): nothing was left to fence, and it wrote
        # no checkpoint after the takeovers; its data is the oracle's to judge.
        out.notes.append(f"{i + 1}: the zombie had delivered its whole range when stopped: "
                         f"nothing left to fence")
    elif ended in ("ok", "idle"):
        out.findings.append(f"the zombie of step {i + 1} exited 0 after a takeover (not fenced)")
    recover(p, i, out)


# --------------------------------------------------------------------------- one schedule


def run_schedule(sv: Services, sched: Schedule, options: str = "") -> Outcome:
    out = Outcome(sched, options=options)
    t0 = time.monotonic()
    p = Pipe(sv, sched)
    work = Workload(random.Random(f"{sched.seed}/workload"), p.db,
                    huge_share=HUGE_SHARE if sched.poison else 0.0, huge_mixed=sched.huge_mixed)
    try:
        try:
            p.catch_up("place", out)  # the sinks placed at the source's head
            for i, step in enumerate(sched.steps):
                apply_step(p, work, i, step, out)
            if "delta_merge" not in sched.sinks:  # (a Delta run is slow: one run fewer)
                work.wave(10)  # the pipeline still delivers after the faults
                p.catch_up("final", out)
        except Finding as f:
            out.findings.append(f.what)
            p.settle(out)
            try:  # what is lost for good, rather than what a stuck run has not delivered yet
                p.catch_up("recover", out, judged=False)  # after a finding: its consequences
            except Finding as again:
                out.findings.append(again.what)
            p.settle(out)
        out.verdicts = verdicts(p, work, p.history())
    except Exception:  # noqa: BLE001 - the campaign's own trouble, reported with the seed
        out.findings.append("campaign error: " + traceback.format_exc()[-1500:])
    except KeyboardInterrupt:  # the campaign is stopped: no run of it left behind
        for run in p.live:
            run.signal(signal.SIGCONT)
            run.signal(signal.SIGKILL)
        raise
    finally:
        p.drop()
        out.seconds = time.monotonic() - t0
    return out


# --------------------------------------------------------------------------- the figure table


def figure_table(outcomes: list[Outcome]) -> str:
    """Fault kind x sink x source. ``of them stated``: duplicates within a limit the README's
    guarantees state (a NATS zombie's client buffer), which the oracle lets pass."""
    rows: dict[tuple, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0, 0, 0])
    for o in outcomes:
        for kind in sorted({s.fault for s in o.schedule.steps}):
            for v in o.verdicts:
                r = rows[(kind, v.sink, o.schedule.source)]
                r[0] += 1
                r[1] += v.events
                r[2] += v.duplicates
                r[3] += v.known
                r[4] += v.lost
                r[5] += o.incidents
    head = ("| fault kind | sink | source | schedules | events | duplicates | of them stated | lost "
            "| incidents |")
    lines = [head, "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for (kind, sink, source), r in sorted(rows.items()):
        lines.append(f"| {kind} | {sink} | {source} | " + " | ".join(map(str, r)) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="make campaign", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10, help="how many seeds (from --first)")
    ap.add_argument("--first", type=int, default=1)
    ap.add_argument("--seed", type=int, help="one seed (overrides --seeds)")
    ap.add_argument("--sources", default=",".join(SOURCES))
    ap.add_argument("--sinks", default="kafka,nats,redis,delta", help="subset of " + ",".join(SINK_GROUPS))
    ap.add_argument("--kinds", default=",".join(FAULT_KINDS),
                    help="fault kinds to draw from; also " + ",".join(OPT_IN_KINDS)
                    + ", drawn only when named")
    ap.add_argument("--delta-share", type=float, default=0.1, help="share of seeds with Delta sinks")
    ap.add_argument("--delivery", default="process", choices=DELIVERIES,
                    help="executor: every run delivered by a Spark task (a Connect server on a standalone "
                         "cluster), with the faults of that task")
    ap.add_argument("--hangs", default="within_timeouts", choices=("within_timeouts", "past_timeouts"),
                    help=f"past_timeouts: the runs' store and source timeouts {HANG_TIMEOUT_S:g}s, and hangs "
                         f"of those servers drawn past them as often as not")
    ap.add_argument("--snapshots", default="none", choices=("none", "resnapshot"),
                    help="resnapshot: in every schedule, one step's faulted run re-loads some tables "
                         "(resolve=resnapshot), in chunks of a few rows")
    ap.add_argument("--failovers", default="none", choices=("none", "gtid"),
                    help="gtid: in MariaDB schedules, after one or more steps' faults the connection "
                         "moves between the GTID primary and its replica")
    ap.add_argument("--rewinds", default="none", choices=("none", "random", "any"),
                    help="random: after (or while) one or more steps' faults, an operator rewinds a "
                         "message sink a few versions (not with --failovers); any: any sink, a "
                         "Delta sink's included (its tables must come out unchanged)")
    ap.add_argument("--retries", default="none", choices=("none", "same_record"),
                    help="same_record: a faulted run that failed is delivered again from its record "
                         "(`tidegate run --retry`: an Airflow retry of its deliver task) before the reruns")
    ap.add_argument("--poison", default="none", choices=("none", "dlq", "dlq_mixed"),
                    help=f"dlq: a share ({HUGE_SHARE:g}) of new notes rows are larger than Kafka's and "
                         "NATS's limits; those sinks dead-letter every change of them (on_poison: dlq); "
                         "dlq_mixed: half of them past the Kafka client's own 16 MiB limit too")
    ap.add_argument("--envelope", default="tidegate", choices=("tidegate", "debezium"),
                    help="debezium: the Kafka sink writes Debezium's records (envelope: debezium), "
                         "with tombstones and transaction metadata, which the oracle checks too")
    ap.add_argument("--kafka", default="exactly_once", choices=("exactly_once", "idempotent"),
                    help="idempotent: the Kafka sink's idempotent producer (exactly_once: false), judged "
                         "at least once: every change, per key in order, repeats allowed (with --envelope "
                         "debezium, BEGIN/END at least once too)")
    ap.add_argument("--types", default="plain", choices=("plain", "edges"),
                    help="edges: the items table has a column of every type the source offers, filled "
                         "with values at the edges of their types, compared with the source's in the "
                         "envelope's form")
    ap.add_argument("--plugin", default="", choices=("", "wal2json", "pgoutput"),
                    help="PostgreSQL schedules: the slot's plugin (source.plugin); left out: wal2json "
                         "(the pipeline's user may not publish the tables); pgoutput reads a "
                         "publication of them the workload's admin makes (source.publication)")
    ap.add_argument("--keep-going", action="store_true", help="exit 0 even when a seed failed")
    ap.add_argument("--keep", metavar="DIR", type=Path,
                    help="work in DIR and keep it (the runs' logs and specs) to diagnose a failed seed")
    a = ap.parse_args(argv)
    seeds = [a.seed] if a.seed is not None else list(range(a.first, a.first + a.seeds))
    # a seed means a schedule only together with the subsets it was drawn within
    options = "".join(f" {var}={val}" for var, val, default in (
        ("SOURCES", a.sources, ",".join(SOURCES)), ("SINKS", a.sinks, "kafka,nats,redis,delta"),
        ("KINDS", a.kinds, ",".join(FAULT_KINDS)), ("DELIVERY", a.delivery, "process"),
        ("HANGS", a.hangs, "within_timeouts"), ("SNAPSHOTS", a.snapshots, "none"),
        ("FAILOVERS", a.failovers, "none"), ("REWINDS", a.rewinds, "none"),
        ("RETRIES", a.retries, "none"), ("POISON", a.poison, "none"),
        ("ENVELOPE", a.envelope, "tidegate"), ("KAFKA", a.kafka, "exactly_once"),
        ("TYPES", a.types, "plain"), ("PLUGIN", a.plugin, "")) if val != default)
    if a.delta_share != 0.1:
        options += f" (--delta-share {a.delta_share})"
    work_dir = contextlib.nullcontext(a.keep) if a.keep else tempfile.TemporaryDirectory(prefix="campaign-")
    with work_dir as tmp:
        Path(tmp).mkdir(parents=True, exist_ok=True)
        sv = Services(Path(tmp))
        outcomes = []
        try:
            for seed in seeds:
                sched = draw(seed, tuple(a.sources.split(",")), tuple(a.sinks.split(",")),
                             tuple(a.kinds.split(",")), a.delta_share, a.delivery,
                             a.hangs == "past_timeouts", a.snapshots == "resnapshot",
                             a.failovers == "gtid", a.rewinds if a.rewinds != "none" else False,
                             a.retries == "same_record", a.poison != "none", a.envelope,
                             a.kafka == "exactly_once", a.types, a.plugin or None)
                sched = dataclasses.replace(sched, huge_mixed=a.poison == "dlq_mixed")
                o = run_schedule(sv, sched, options)
                print(o.report(), flush=True)
                outcomes.append(o)
        except KeyboardInterrupt:  # Ctrl-C: the figures of the seeds that ran
            print(f"\ninterrupted during seed {seed}: the table covers the seeds before it")
    print()
    print(figure_table(outcomes))
    failed = [o.schedule.seed for o in outcomes if not o.ok]
    print(f"\n{len(outcomes) - len(failed)} of {len(outcomes)} seeds passed" + (
        f"; failed: {failed}" if failed else ""))
    return 1 if failed and not a.keep_going else 0


if __name__ == "__main__":
    # SIGTERM (timeout, kill) stops the campaign as Ctrl-C does: its runs killed, the table printed
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background
    sys.exit(main())
