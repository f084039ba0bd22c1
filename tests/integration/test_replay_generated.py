"""Generated schedules of runs, clears and replays against real servers, with real faults of the
optional sink, and the source's table as the oracle.

A MariaDB table to a required Kafka topic (exactly once, one partition) and an optional Redis
stream. Per seed: writes (transactions of inserts, updates, deletes), runs, clears of finished
runs (the run id again: a replay of its range) and explicit replays of a finished run to a
random subset of the sinks (``mode: replay``). A run may lose Redis half way in one of two real
ways: its ACL user loses XADD (every later XADD is refused), or a relay holds the reply of an
EXEC the server ran and then refuses every connection (the run never hears of the sub-batch).

The oracle. Each run's deliveries are what the sinks hold after it that they did not before
(Kafka through a read_committed consumer). Outside replays, each sink holds every change once,
in log order, and replaying them per key gives the source table; a replay of a run gives each
sink it covers exactly what that run gave it (a part whose acknowledgement no run has heard of
yet excepted: the store does not know it), and the other sinks nothing.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
import uuid

import orjson
import pymysql
import pytest
import redis
from confluent_kafka.admin import AdminClient
from tidegate import bounds_step
from tidegate.parts import Parts
from tidegate.plan import RunPlan
from tidegate.run import RunContext
from tidegate.spec import load_spec
from tidegate.store import open_store

from tests.integration.nats_gate import NatsGate
from tests.integration.sink_readers import kafka_changes
from tests.runs import whole_run
from tests.seeds import seeds_from_env

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

SUB_BATCH = 6


class Schedule:
    def __init__(self, seed, tmp_path, mysql, kafka, kafka_bootstrap, redis_service):
        self.rnd, self.seed = random.Random(seed), seed
        tag = uuid.uuid4().hex[:6]
        self.db, self.pipeline, self.user = f"rg_{tag}", f"rg_{tag}", f"tg_{tag}"
        self.stream, self.topic = f"{self.pipeline}:t", f"{self.pipeline}.t"
        self.bootstrap, self.redis_service = kafka_bootstrap, redis_service
        self.admin_redis = redis.Redis(host="127.0.0.1", port=redis_service.port,
                                       username=redis_service.cdc.login, password=redis_service.cdc.password)
        password = uuid.uuid4().hex
        self.admin_redis.execute_command("ACL", "SETUSER", self.user, "on", f">{password}", "~*", "&*",
                                         "+@all")
        self.redis_conn = dataclasses.replace(redis_service.cdc, login=self.user, password=password)
        self.conns = {"src": mysql.cdc, "kafka": kafka.cdc, "redis": self.redis_conn}
        path = tmp_path / "p.yaml"
        path.write_text(f"""pipeline: {self.pipeline}
source: {{kind: mysql, conn_id: src, tables: [{self.db}.t], server_id: {48500 + seed}, start: head}}
batch: {{max_events: {SUB_BATCH}}}
sinks:
  - {{id: events, kind: kafka, conn_id: kafka, topic: "{{pipeline}}.{{table}}", exactly_once: true,
     partitions: 1}}
  - {{id: cache, kind: redis, conn_id: redis, stream: "{{pipeline}}:{{table}}", required: false}}
""")
        self.spec = load_spec(str(path))
        self.store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
        self.admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
        self.rows: dict[int, int] = {}
        self.by_run: dict[str, dict[str, list[str]]] = {}  # run id -> sink -> what it got outside replays
        self.finished: list[str] = []
        self.unheard: tuple[str, list[str]] | None = None  # (run id, Redis keys the store does not know)
        self.seen = {"events": 0, "cache": 0}

    # ------------------------------------------------------------------ the source

    def sql(self, *stmts: str) -> None:
        with self.admin.cursor() as c:
            for st in stmts:
                c.execute(st)

    def setup(self) -> None:
        self.sql(f"CREATE DATABASE {self.db}", f"CREATE TABLE {self.db}.t (id INT PRIMARY KEY, v INT)")
        run = RunContext(self.spec, parts=Parts(self.conns.__getitem__), store=self.store)
        bounds_step.prepare_bounds(run)

    def write(self) -> None:
        for _ in range(self.rnd.randint(2, 8)):
            stmts = ["BEGIN"]
            for _ in range(self.rnd.randint(1, 5)):
                op = self.rnd.choice(["insert", "insert", "update", "delete"]) if self.rows else "insert"
                if op == "insert":
                    i = self.rnd.randint(1, 10**6)
                    if i in self.rows:
                        continue
                    self.rows[i] = self.rnd.randint(0, 99)
                    stmts.append(f"INSERT INTO {self.db}.t VALUES ({i}, {self.rows[i]})")
                elif op == "update":
                    i = self.rnd.choice(sorted(self.rows))
                    self.rows[i] = self.rnd.randint(0, 99)
                    stmts.append(f"UPDATE {self.db}.t SET v = {self.rows[i]} WHERE id = {i}")
                else:
                    i = self.rnd.choice(sorted(self.rows))
                    del self.rows[i]
                    stmts.append(f"DELETE FROM {self.db}.t WHERE id = {i}")
            self.sql(*stmts, "COMMIT")

    # ------------------------------------------------------------------ the sinks

    def held(self) -> dict[str, list[dict]]:
        r = redis.Redis(host="127.0.0.1", port=self.redis_service.port, username=self.redis_service.cdc.login,
                        password=self.redis_service.cdc.password)
        try:
            cache = [orjson.loads(f[b"event"]) for _, f in r.xrange(self.stream)]
        finally:
            r.close()
        topics = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=10).topics
        events = kafka_changes(self.bootstrap, self.topic) if self.topic in topics else []
        return {"events": events, "cache": cache}

    def new(self) -> dict[str, list[dict]]:
        """What each sink got since the last look."""
        now = self.held()
        got = {sid: now[sid][self.seen[sid]:] for sid in now}
        self.seen = {sid: len(now[sid]) for sid in now}
        return got

    # ------------------------------------------------------------------ the steps

    def run(self, step: int) -> None:
        rid = f"r{step}"
        fault = self.rnd.choice(["none", "none", "acl", "lost ack"])
        before = self.admin_redis.xlen(self.stream) if self.admin_redis.exists(self.stream) else 0
        reports: list[dict] = []
        with NatsGate(self.redis_service.port, hold_on=b"EXEC") as gate:
            conns = self.conns
            if fault == "lost ack":
                conns = {**conns, "redis": dataclasses.replace(self.redis_conn, port=gate.port)}
            thread = threading.Thread(target=lambda: reports.append(whole_run(RunContext(
                self.spec, run_id=rid, parts=Parts(conns.__getitem__), store=self.store))))
            thread.start()
            if fault != "none":  # once Redis holds this run's first sub-batch
                while thread.is_alive() and self.admin_redis.xlen(self.stream) <= before:
                    time.sleep(0.001)
                if fault == "acl":
                    self.admin_redis.execute_command("ACL", "SETUSER", self.user, "-xadd")
                else:
                    gate.armed = True
                    while thread.is_alive() and not gate.holding.wait(0.01):
                        pass
                    if gate.holding.is_set():
                        time.sleep(0.2)  # the EXEC runs on the server
                        gate.cut_and_refuse()
            thread.join(120)
            self.admin_redis.execute_command("ACL", "SETUSER", self.user, "+xadd")
        assert reports, f"seed {self.seed}: run {rid} failed"
        got = self.new()
        self.by_run[rid] = {sid: [e["idempotency_key"] for e in got[sid]] for sid in got}
        self.heard(rid)
        heard = {s["id"]: s["events"] for s in reports[0]["sinks"]}["cache"]
        if len(got["cache"]) > heard:  # the sub-batch whose acknowledgement was lost
            self.unheard = (rid, self.by_run[rid]["cache"][heard:])
        self.finished.append(rid)

    def heard(self, rid: str) -> None:
        """An unheard Redis part is known once a run adopted the sink's record."""
        if self.unheard and any(v.kind == "adopt" and v.run_id == rid
                                for v in self.store.checkpoints.history(self.pipeline, "cache")):
            self.unheard = None

    def again(self, step: int) -> None:
        rid = self.rnd.choice(self.finished)
        chosen = None
        if self.rnd.random() < 0.5:
            chosen = sorted(self.rnd.sample(["cache", "events"], self.rnd.randint(1, 2)))
        unknown = set(self.unheard[1]) if self.unheard and self.unheard[0] == rid else set()
        if chosen is None:  # a clear: the run id again
            whole_run(RunContext(self.spec, run_id=rid, parts=Parts(self.conns.__getitem__),
                                 store=self.store))
        else:
            plan = RunPlan(mode="replay", replay_of=rid, sinks=chosen)
            whole_run(RunContext(self.spec, plan, run_id=f"m{step}",
                                 parts=Parts(self.conns.__getitem__), store=self.store))
        got = self.new()
        self.heard(rid if chosen is None else f"m{step}")
        for sid in ("events", "cache"):
            want = self.by_run[rid][sid] if chosen is None or sid in chosen else []
            if sid == "cache":
                want = [k for k in want if k not in unknown]
            assert [e["idempotency_key"] for e in got[sid]] == want, (self.seed, step, rid, chosen, sid)

    def caught_up(self) -> tuple[dict[int, int], dict[str, list[str]], dict[int, int]]:
        """A last run catches both sinks up: (the source table; per sink, the keys it got
        outside replays, in order; the table those changes make, replayed per key)."""
        self.run_quietly("catch-up")
        with self.admin.cursor() as c:
            c.execute(f"SELECT id, v FROM {self.db}.t")
            table = dict(c.fetchall())
        keys = {sid: [k for r in self.by_run.values() for k in r[sid]] for sid in ("events", "cache")}
        every = {e["idempotency_key"]: e for e in self.held()["events"]}
        state: dict[int, int] = {}
        for k in keys["events"]:
            ev = every[k]
            if ev["op"] == "d":
                state.pop(ev["before"]["id"], None)
            else:
                state[ev["after"]["id"]] = ev["after"]["v"]
        return table, keys, state

    def run_quietly(self, rid: str) -> None:
        whole_run(RunContext(self.spec, run_id=rid, parts=Parts(self.conns.__getitem__),
                             store=self.store))
        got = self.new()
        self.by_run[rid] = {sid: [e["idempotency_key"] for e in got[sid]] for sid in got}

    def close(self) -> None:
        self.sql(f"DROP DATABASE IF EXISTS {self.db}")
        self.admin.close()
        self.store.close()
        self.admin_redis.delete(self.stream)
        self.admin_redis.execute_command("ACL", "DELUSER", self.user)
        self.admin_redis.close()


# Seeds 0-219 pass (0-99: 59 lost acknowledgements, 43 Redis ACL losses, 190 clears and replays). Without
# the fix of a replay's reach (a sink moved no further than its own range), 8 of seeds 0-39 fail,
# 10 and 14 among them; without the adopted stretch credited to the attempt that delivered it,
# seed 19 of 0-19. TIDEGATE_REPLAY_SEEDS picks others (tests/seeds.py: N, A-B or a,b,c).
SEEDS = seeds_from_env("TIDEGATE_REPLAY_SEEDS", [0, 10, 14, 19])


@pytest.mark.parametrize("seed", SEEDS)
def test_generated_runs_clears_and_replays_with_redis_failing_half_way(seed, tmp_path, mysql, kafka,
                                                                       kafka_bootstrap, redis_service):
    sched = Schedule(seed, tmp_path, mysql, kafka, kafka_bootstrap, redis_service)
    try:
        sched.setup()
        for step in range(sched.rnd.randint(8, 16)):
            op = sched.rnd.choice(["write", "write", "run", "run", "again"])
            if op == "write" or not sched.rows:
                sched.write()
            elif op == "again" and sched.finished:
                sched.again(step)
            else:
                sched.run(step)
        table, keys, state = sched.caught_up()
        assert table == sched.rows, seed
        assert len(keys["events"]) == len(set(keys["events"])), (seed, "a change twice on Kafka")
        assert keys["cache"] == keys["events"], (seed, "Redis: not every change once, in log order")
        assert state == table, (seed, "the changes outside replays do not make the source table")
    finally:
        sched.close()
