"""Snapshots as users meet them, through `airflow dags test` against the real servers, the
deliver tasks as clients of the `spark_connect` service (the snapshot's chunks are Spark tasks of
its server; test_tls_sources reads a snapshot through spark-submit).

Two tables of 10k rows in all, in 1000-row chunks (``orders``, key ``id``; ``lines``, composite key
``(order_id, line)``), a pipeline with ``start: snapshot`` delivering to Kafka (exactly-once),
NATS and Redis, and a writer that inserts, updates and deletes rows of both tables while the
snapshot is read. Then:

- MariaDB: an UPDATE of a row of the first chunk waits for its semi-synchronous ack (in the binlog,
  not visible) while the snapshot's handoff is chosen; the deliver task of the
  snapshot run is SIGKILLed mid-snapshot; the rerun resumes at
  the next chunk; two more runs (`tidegate run`) stream what the writer did. A binlog purge past
  the checkpoint then halts the pipeline, and a run triggered with ``resolve=resnapshot`` and a
  reason re-loads the tables and resolves the incident. Then a third table is added to
  ``source.tables`` while an UPDATE of one of its rows waits for its semi-sync ack behind the
  checkpoints (the run before read past it), and gets a snapshot of its own under a writer.
- PostgreSQL: the snapshot run, then two more runs; then a third table is added to
  ``source.tables`` and gets a snapshot of its own while a writer updates its first rows and the
  orders, then two more runs; then a resnapshot of that table (``tables`` param) while a commit
  of one of its rows waits for a synchronous standby that never answers.

Each time every sink is checked: replaying its events per key (``r``, ``c``, ``u``, ``d`` in
order) gives exactly the tables' content; every change the writer committed after the handoff
(and the waiting UPDATE) arrives once, in order per key; no key's delivered state goes back in
time (``qty`` only grows: snapshot rows and log events together); Kafka (read_committed) holds
no duplicate ``idempotency_key`` and NATS and Redis hold the same keys, each once; the control channels carry
``snapshot_started`` and ``snapshot_completed`` with the rows delivered.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import re
import subprocess
import textwrap
import threading
import time
import uuid

import psycopg2
import pymysql
import pytest
from tidegate.positions import SnapshotPosition
from tidegate.store import open_store

from tests.integration.airflow_support import (
    VENV_BIN,
    dags_test,
    dags_test_killed_when,
    make_airflow_env,
    spark_connect_server,  # noqa: F401 - the spark_connect fixture
    task_ended,
)
from tests.integration.semisync import SemiSync
from tests.integration.sink_readers import is_marker, kafka_changes, redis_events

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

# 10k rows; lines: 8 per order of the first 500 orders. What the tests prove is a matter of how
# many chunks and sub-batches there are, not of rows: 1000-row chunks (6 + 4, each table's last
# open-ended: 12) and 400-event sub-batches (2.5 per chunk) cut them as 100k rows in 10k-row
# chunks and 4000-event sub-batches did, at a tenth of the rows to deliver and read back.
ORDERS, LINES = 6_000, 4_000
EXTRA = 3_000  # the table added to a running pipeline (3 chunks)
CHUNK_ROWS = 1000
SEMISYNC_ORDER = 500  # the orders row whose UPDATE waits for its semi-sync ack: in the first chunk
SYNC_EXTRA = 2000  # the extra row whose commit waits for a synchronous standby: in its second chunk


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory, service_env, mysql, postgres, kafka, redis_service, nats_service,
                spark_connect):
    base = tmp_path_factory.mktemp("snapshots")
    return make_airflow_env(base, service_env), base


def spec_text(pipeline: str, kind: str, conn_id: str, tables: list[str], extra: str) -> str:
    return textwrap.dedent(f"""
        pipeline: {pipeline}
        source: {{kind: {kind}, conn_id: {conn_id}, tables: [{', '.join(tables)}], {extra} start: snapshot}}
        batch: {{max_events: 400}}
        snapshot: {{chunk_rows: {CHUNK_ROWS}, parallelism: 2}}
        spark: {{conn_id: spark_connect}}
        sinks:
          - {{id: events, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}",
              exactly_once: true, partitions: 3}}
          - {{id: bus, kind: nats, conn_id: cdc_nats, stream: {pipeline.upper()},
              subject: "{{pipeline}}.{{table}}"}}
          - {{id: cache, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:{{table}}"}}
    """)


# --------------------------------------------------------------------------- the writer


class LoopWriter(threading.Thread):
    """Calls ``one()`` (one single-row transaction) every few ms until ``finish()``."""

    def __init__(self, execute):
        super().__init__(daemon=True)
        self.execute = execute
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def one(self) -> None:
        raise NotImplementedError

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.one()
                time.sleep(0.004)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def finish(self) -> None:
        self.stop.set()
        self.join(30)
        assert self.error is None, self.error


class Writer(LoopWriter):
    """Single-row transactions on both tables (inserts of new keys, updates that change a value,
    deletes of live keys), remembering each key's ops in commit order."""

    def __init__(self, execute, orders: str, lines: str):
        super().__init__(execute)
        self.orders, self.lines = orders, lines
        self.rng = random.Random(7)
        # the keys it works on: the first rows of each table (spread over the first chunks) and
        # those it inserts (beyond the last chunk bound)
        self.hot_orders = list(range(1, 401))
        self.hot_lines = [(o, n) for o in range(1, 51) for n in range(1, 9)]
        self.dead: set[tuple] = set()
        self.next_order, self.next_line = ORDERS + 1, 9
        self.ops: dict[tuple, list[str]] = collections.defaultdict(list)

    def _live(self, keys: list) -> tuple | int:
        while True:
            k = self.rng.choice(keys)
            if k not in self.dead:
                return k

    def one(self) -> None:
        r = self.rng.random()
        if r < 0.15:
            k = self.next_order
            self.next_order += 1
            self.execute(f"INSERT INTO {self.orders} VALUES ({k}, 'new', 1)")
            self.hot_orders.append(k)
            self.ops[("orders", k)].append("c")
        elif r < 0.4:
            k = self._live(self.hot_orders)
            self.execute(f"UPDATE {self.orders} SET qty = qty + 1, status = 'paid' WHERE id = {k}")
            self.ops[("orders", k)].append("u")
        elif r < 0.5:
            k = self._live(self.hot_orders)
            self.execute(f"DELETE FROM {self.orders} WHERE id = {k}")
            self.dead.add(k)
            self.ops[("orders", k)].append("d")
        elif r < 0.65:
            k = (self.rng.randint(1, 60), self.next_line)
            self.next_line += 1
            self.execute(f"INSERT INTO {self.lines} VALUES ({k[0]}, {k[1]}, 'sku-new', 1)")
            self.hot_lines.append(k)
            self.ops[("lines", *k)].append("c")
        elif r < 0.9:
            k = self._live(self.hot_lines)
            self.execute(f"UPDATE {self.lines} SET qty = qty + 1 WHERE order_id = {k[0]} AND line = {k[1]}")
            self.ops[("lines", *k)].append("u")
        else:
            k = self._live(self.hot_lines)
            self.execute(f"DELETE FROM {self.lines} WHERE order_id = {k[0]} AND line = {k[1]}")
            self.dead.add(k)
            self.ops[("lines", *k)].append("d")


def start_writer_at_handoff(store, pipeline: str, writer: Writer) -> None:
    """Start ``writer`` once the snapshot is planned (its handoff captured): every change it
    makes is then after the handoff."""
    start_when(lambda: bool(store.snapshots.all(pipeline)), writer)


class HotWriter(LoopWriter):
    """Updates (``qty = qty + 1``) of a few rows of some tables, round and round."""

    def __init__(self, execute, keys: list[tuple[str, range]]):
        super().__init__(execute)
        self.keys = keys
        self.rng = random.Random(11)
        self.updates = 0

    def one(self) -> None:
        table, ids = self.rng.choice(self.keys)
        self.execute(f"UPDATE {table} SET qty = qty + 1 WHERE id = {self.rng.choice(ids)}")
        self.updates += 1


def start_when(ready, writer: threading.Thread) -> None:
    """Start ``writer`` once ``ready()`` holds (a snapshot is planned: its handoff captured)."""

    def wait_then_start() -> None:
        deadline = time.monotonic() + 300
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.05)
        writer.start()

    threading.Thread(target=wait_then_start, daemon=True).start()


# --------------------------------------------------------------------------- reading the sinks


def nats_messages(conn, stream: str, subject: str) -> list[tuple[str, str, dict]]:
    """(subject, Nats-Msg-Id, payload) of every message of ``subject`` in the stream, in stream
    order (a pull consumer without acks: fast for 100k messages), the sinks' commit markers left
    out."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    async def go():
        nc = await nats.connect(f"nats://127.0.0.1:{conn.port}", user=conn.login, password=conn.password)
        try:
            js = nc.jetstream()
            sub = await js.pull_subscribe(subject, stream=stream, config=ConsumerConfig(
                ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL))
            total = (await sub.consumer_info()).num_pending
            out = []
            stalled = time.monotonic() + 60  # a bound on a read that makes no progress, not a speed check
            while len(out) < total:
                assert time.monotonic() < stalled, f"read {len(out)} of {total} messages of {stream}"
                try:
                    msgs = await sub.fetch(min(1000, total - len(out)), timeout=5)
                except nats.errors.TimeoutError:
                    continue
                out += msgs
                stalled = time.monotonic() + 60
            return [(m.subject, m.headers["Nats-Msg-Id"], json.loads(m.data))
                    for m in out if not is_marker(m.subject)]
        finally:
            await nc.close()

    return asyncio.run(go())


def key_of(table: str, ev: dict) -> tuple:
    k = ev["key"]
    return ("lines", k["order_id"], k["line"]) if table == "lines" else (table, k["id"])


def replay(events: list[tuple[str, dict]]) -> dict[tuple, tuple]:
    """Each key's final (status|sku, qty) after applying the events in order."""
    state: dict[tuple, tuple] = {}
    for table, ev in events:
        k = key_of(table, ev)
        if ev["op"] == "d":
            state.pop(k, None)
        else:
            a = ev["after"]
            state[k] = (a.get("status", a.get("sku")), a["qty"])
    return state


def log_ops(events: list[tuple[str, dict]]) -> dict[tuple, list[str]]:
    out: dict[tuple, list[str]] = collections.defaultdict(list)
    for table, ev in events:
        if ev["op"] != "r":
            out[key_of(table, ev)].append(ev["op"])
    return dict(out)


def assert_no_time_travel(sid: str, events: list[tuple[str, dict]], since_tx: str | None = None) -> None:
    """Every change adds to ``qty`` (the writer's updates, the waiting commit), so the states a
    sink delivers for a key (snapshot rows and log events together) must show a strictly
    growing ``qty``, and nothing after the key's delete: no state older than one already
    delivered, none delivered twice. ``since_tx``: only from each key's row of that snapshot."""
    per_key: dict[tuple, list[dict]] = collections.defaultdict(list)
    for table, ev in events:
        per_key[key_of(table, ev)].append(ev)
    for k, evs in per_key.items():
        if since_tx is not None:
            rows = [i for i, e in enumerate(evs) if e["transaction"]["id"] == since_tx]
            if not rows:
                continue
            evs = evs[rows[0]:]
        path = [(e["op"], e["after"] and e["after"]["qty"]) for e in evs]
        qty, deleted = None, False
        for op, q in path:
            assert not deleted, (sid, k, "an event after the delete", path)
            if op == "d":
                deleted = True
                continue
            assert qty is None or q > qty, (sid, k, "a state older than one delivered before", path)
            qty = q


def sink_events(pipeline: str, bootstrap: str, nats_conn, redis_conn,
                tables: tuple[str, ...] = ("orders", "lines")) -> dict[str, list[tuple[str, dict]]]:
    """Per sink, its (table, envelope) data events in delivery order per key."""
    out = {"events": [], "bus": [], "cache": []}
    for table in tables:
        out["events"] += [(table, e) for e in kafka_changes(bootstrap, f"{pipeline}.{table}")]
        out["cache"] += [(table, json.loads(e)) for e in redis_events(redis_conn, f"{pipeline}:{table}")]
    for subject, _, payload in nats_messages(nats_conn, pipeline.upper(), f"{pipeline}.>"):
        table = subject.rsplit(".", 1)[1]
        if table in tables:
            out["bus"].append((table, payload))
    return out


def controls(pipeline: str, bootstrap: str, nats_conn, redis_conn) -> dict[str, list[dict]]:
    return {"events": kafka_changes(bootstrap, f"{pipeline}.__control"),
            "bus": [p for s, _, p in nats_messages(nats_conn, pipeline.upper(), f"{pipeline}.__control")],
            "cache": [json.loads(e) for e in redis_events(redis_conn, f"{pipeline}:__control")]}


def check_sinks(pipeline: str, bootstrap: str, nats_conn, redis_conn, content: dict, writer: Writer,
                since_snapshot: str | None = None) -> dict[str, list[tuple[str, dict]]]:
    """The checks of the module docstring, for every sink."""
    got = sink_events(pipeline, bootstrap, nats_conn, redis_conn)
    kafka_keys = [e["idempotency_key"] for _, e in got["events"]]
    assert len(kafka_keys) == len(set(kafka_keys)), "a duplicate in Kafka (exactly-once)"
    for sid, events in got.items():
        keys = [e["idempotency_key"] for _, e in events]
        assert collections.Counter(keys) == collections.Counter(kafka_keys), sid
        assert_no_time_travel(sid, events, since_snapshot)
        if since_snapshot is None:
            assert replay(events) == content, sid
            assert log_ops(events) == {k: v for k, v in writer.ops.items()}, sid
        else:  # nothing changed after the resnapshot's handoff: its rows are exactly the tables
            rows = [(t, e) for t, e in events if e["transaction"]["id"] == since_snapshot]
            assert replay(rows) == content, sid
    return got


# --------------------------------------------------------------------------- MariaDB


def purge_to(execute, query, file: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        execute(f"PURGE BINARY LOGS TO '{file}'")
        if query("SHOW BINARY LOGS")[0][0] >= file:
            return
        assert time.monotonic() < deadline, "binlogs not purged"
        execute("FLUSH ENGINE LOGS")
        time.sleep(0.2)


def table_content(query, where: str) -> dict:
    """The two tables' rows by key: what replaying every sink must give."""
    rows = {("orders", i): (s, q) for i, s, q in query(f"SELECT id, status, qty FROM {where}.orders")}
    rows.update({("lines", o, n): (s, q) for o, n, s, q in
                 query(f"SELECT order_id, line, sku, qty FROM {where}.lines")})
    return rows


def test_mariadb_snapshot_killed_resumed_streamed_then_resnapshot_after_a_purge(
        airflow_env, mysql, kafka_bootstrap, nats_service, redis_service):
    env, base = airflow_env
    tag = uuid.uuid4().hex[:6]
    db = pipeline = f"snapm_{tag}"
    (base / "pipelines" / f"{pipeline}.yaml").write_text(spec_text(
        pipeline, "mysql", "cdc_mysql", [f"{db}.orders", f"{db}.lines"],
        f"server_id: {48400 + random.randint(0, 99)},"))
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    writer_conn = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))

    def on(conn):
        def execute(stmt: str) -> None:
            with conn.cursor() as c:
                c.execute(stmt)
        return execute

    def query(stmt: str) -> list:
        with admin.cursor() as c:
            c.execute(stmt)
            return list(c.fetchall())

    sql = on(admin)
    semisync = SemiSync(mysql.mysql_kwargs()["port"], sql)
    sql(f"CREATE DATABASE {db}")
    sql(f"CREATE TABLE {db}.orders (id INT PRIMARY KEY, status VARCHAR(20), qty INT)")
    sql(f"CREATE TABLE {db}.lines (order_id INT, line INT, sku VARCHAR(20), qty INT, "
        f"PRIMARY KEY (order_id, line))")
    sql(f"INSERT INTO {db}.orders SELECT seq, 'new', seq % 10 FROM {db}.seq_1_to_{ORDERS}")
    sql(f"INSERT INTO {db}.lines SELECT 1 + (seq - 1) DIV 8, 1 + (seq - 1) % 8, CONCAT('sku-', seq), 1 "
        f"FROM {db}.seq_1_to_{LINES}")

    def content() -> dict:
        return table_content(query, db)

    dag = f"cdc_{pipeline}"
    store = open_store(env["TIDEGATE_CHECKPOINT_STORE"])
    writer = Writer(on(writer_conn), f"{db}.orders", f"{db}.lines")
    waiter_conn = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    try:
        # Semi-sync AFTER_SYNC with no replica: an UPDATE of a row of the first chunk is in the
        # binlog and invisible while the snapshot's handoff is chosen. The handoff must lie before
        # it, so it arrives in every sink from the log. (It is released once the snapshot is
        # planned: while one commit waits for its ack, a second one queued behind it makes SHOW
        # MASTER STATUS wait too, and every head read with it.)
        semisync.on()
        head = query("SHOW MASTER STATUS")[0][:2]
        update = f"UPDATE {db}.orders SET qty = qty + 100, status = 'semisync' WHERE id = {SEMISYNC_ORDER}"
        waiting = threading.Thread(target=on(waiter_conn), args=(update,), daemon=True)
        waiting.start()
        deadline = time.monotonic() + 10
        while (logged := query("SHOW MASTER STATUS")[0][:2]) == head:
            assert time.monotonic() < deadline, "the waiting UPDATE never reached the binlog"
            time.sleep(0.05)
        assert query(f"SELECT qty FROM {db}.orders WHERE id = {SEMISYNC_ORDER}") == [(0,)], "visible already"
        writer.ops[("orders", SEMISYNC_ORDER)].append("u")

        def release_then_write() -> None:
            semisync.off()
            waiting.join(10)
            writer.start()

        # the snapshot run, killed once two chunks are committed
        start_when(lambda: bool(store.snapshots.all(pipeline)), threading.Thread(target=release_then_write,
                                                                                 daemon=True))

        def two_chunks_in() -> bool:
            rec = store.checkpoints.get(pipeline, "events")
            return rec is not None and isinstance(rec.position, SnapshotPosition) and rec.position.chunk >= 2

        dags_test_killed_when(env, dag, two_chunks_in)
        assert not waiting.is_alive()
        handoff = store.snapshots.all(pipeline)[0].handoff  # before the UPDATE, so the log carries it
        assert (handoff.file, handoff.pos) < (logged[0], int(logged[1])), (handoff, logged)
        [snap] = store.snapshots.all(pipeline)
        assert len(snap.chunks) == 6 + 4 + 2  # CHUNK_ROWS-row chunks, each table's last open-ended
        killed_at = min(r.position.chunk for r in store.checkpoints.current(pipeline).values())
        assert killed_at >= 1
        assert store.checkpoints.current(pipeline)["events"].position.snapshot_id == snap.snapshot_id

        rc, log = dags_test(env, dag)  # resumes at the next chunk
        assert rc == 0 and task_ended(log, "deliver"), log[-3000:]
        first = int(re.search(rf"snapshot {snap.snapshot_id}: reading chunks (\d+)\.\.", log).group(1))
        assert 2 <= first <= killed_at + 2, (first, killed_at)  # not from chunk 1 again
        writer.finish()
        for i in (1, 2):  # two more runs stream what the writer did after the handoff
            r = subprocess.run([str(VENV_BIN / "tidegate"), "run", pipeline, "--run-id", f"more_{i}"],
                               env=env, capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr[-3000:]
        assert store.snapshots.get(pipeline, snap.snapshot_id).status == "completed"
        assert sum(len(v) for v in writer.ops.values()) > 100, "the writer made too few changes"
        got = check_sinks(pipeline, kafka_bootstrap, nats_service.cdc, redis_service.cdc, content(), writer)
        rows = sum(1 for _, e in got["events"] if e["op"] == "r")
        assert rows == store.snapshots.get(pipeline, snap.snapshot_id).rows >= ORDERS + LINES - 1000
        lasts = [e["source"]["snapshot"] for _, e in got["events"] if e["op"] == "r"]
        assert lasts.count("last") <= 2 and set(lasts) <= {"true", "last"}
        assert {e["source"]["snapshot"] for _, e in got["events"] if e["op"] != "r"} == {"false"}
        for sid, msgs in controls(pipeline, kafka_bootstrap, nats_service.cdc, redis_service.cdc).items():
            assert [m["type"] for m in msgs] == ["snapshot_started", "snapshot_completed"], sid
            assert msgs[1]["tables"] == [f"{db}.orders", f"{db}.lines"] and msgs[1]["rows"] == rows, sid

        # a purge past the checkpoint halts the pipeline; resolve=resnapshot re-loads the tables
        for _ in range(50):  # changes the purge loses (the resnapshot covers them)
            writer.one()
        sql("FLUSH BINARY LOGS")
        purge_to(sql, query, query("SHOW MASTER STATUS")[0][0])
        rc, log = dags_test(env, dag)
        assert rc != 0 and "binlog_purged" in log, log[-3000:]
        [inc] = store.incidents.all(pipeline, unresolved_only=True)
        rc, log = dags_test(env, dag, {"resolve": "resnapshot", "reason": "binlog purged before delivery"})
        assert rc == 0 and task_ended(log, "deliver"), log[-3000:]
        done = store.incidents.get(inc.id)
        assert done.resolved and done.resolution == "resnapshot"
        assert done.reason == "binlog purged before delivery"
        resnap = store.snapshots.all(pipeline)[-1]
        assert resnap.kind == "resnapshot" and resnap.status == "completed"
        check_sinks(pipeline, kafka_bootstrap, nats_service.cdc, redis_service.cdc, content(), writer,
                    since_snapshot=f"snapshot:{resnap.snapshot_id}")
        out = subprocess.run([str(VENV_BIN / "tidegate"), "status", pipeline, "--json"], env=env,
                             capture_output=True, text=True, check=True).stdout
        status = json.loads(out)["pipelines"][0]
        assert status["halted"] is False
        add_a_table_while_a_commit_waits(env, base, pipeline, db, sql, semisync, query, on(waiter_conn),
                                         on(writer_conn), store, kafka_bootstrap, nats_service.cdc,
                                         redis_service.cdc)
    finally:
        semisync.off()
        writer.stop.set()
        store.close()
        sql(f"DROP DATABASE IF EXISTS {db}")
        admin.close()
        writer_conn.close()
        waiter_conn.close()


def tidegate_run(env: dict, pipeline: str, run_id: str) -> None:
    r = subprocess.run([str(VENV_BIN / "tidegate"), "run", pipeline, "--run-id", run_id],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def add_a_table_while_a_commit_waits(env, base, pipeline, db, sql, semisync, query, waiter, writer_sql, store,
                                     bootstrap, nats_conn, redis_conn) -> None:
    """A table added to the running MariaDB pipeline, with an UPDATE of one of its rows in the
    binlog but still waiting for its semi-sync ack when a run moves every checkpoint past it (the
    table is not captured yet, so that run skips it). The added table's snapshot hands off at
    the lowest checkpoint, after the UPDATE, and its chunks cannot see it: the handoff must move
    before it, so the log delivers it, once, with no state going back in time."""
    sql(f"CREATE TABLE {db}.extra (id INT PRIMARY KEY, status VARCHAR(20), qty INT)")
    sql(f"INSERT INTO {db}.extra SELECT seq, 'new', 0 FROM {db}.seq_1_to_{EXTRA}")
    tidegate_run(env, pipeline, "more_3")  # the checkpoints pass the fill: extra is not captured
    semisync.on()
    head = query("SHOW MASTER STATUS")[0][:2]
    update = f"UPDATE {db}.extra SET qty = qty + 100, status = 'semisync' WHERE id = 5"
    waiting = threading.Thread(target=waiter, args=(update,), daemon=True)
    waiting.start()
    deadline = time.monotonic() + 10
    while (logged := query("SHOW MASTER STATUS")[0][:2]) == head:
        assert time.monotonic() < deadline, "the waiting UPDATE never reached the binlog"
        time.sleep(0.05)
    logged = (logged[0], int(logged[1]))
    tidegate_run(env, pipeline, "more_4")  # reads the binlog past the waiting UPDATE
    assert query(f"SELECT qty FROM {db}.extra WHERE id = 5") == [(0,)] and waiting.is_alive()
    lowest = min(r.position for r in store.checkpoints.current(pipeline).values())
    assert (lowest.file, lowest.pos) >= logged, (lowest, logged)  # the race: checkpoints past it

    (base / "pipelines" / f"{pipeline}.yaml").write_text(spec_text(
        pipeline, "mysql", "cdc_mysql", [f"{db}.orders", f"{db}.lines", f"{db}.extra"],
        _server_id_of(base, pipeline)))
    hot = HotWriter(writer_sql, [(f"{db}.extra", range(1, 301)), (f"{db}.orders", range(1, 401))])

    def release_then_write() -> None:
        semisync.off()
        waiting.join(10)
        hot.start()

    snapshots_before = len(store.snapshots.all(pipeline))
    start_when(lambda: len(store.snapshots.all(pipeline)) > snapshots_before,
               threading.Thread(target=release_then_write, daemon=True))
    try:
        rc, log = dags_test(env, f"cdc_{pipeline}")
        assert rc == 0 and task_ended(log, "deliver"), log[-3000:]
        assert not waiting.is_alive()
        hot.finish()
        assert hot.updates > 50, "the writer made too few changes"
        for i in (5, 6):
            tidegate_run(env, pipeline, f"more_{i}")
    finally:
        hot.stop.set()
    added = store.snapshots.all(pipeline)[-1]
    assert added.kind == "added" and added.status == "completed"
    assert [f"{t['schema']}.{t['table']}" for t in added.tables] == [f"{db}.extra"]
    assert (added.handoff.file, added.handoff.pos) < logged, (added.handoff, logged)
    extra = {("extra", i): (st, q) for i, st, q in query(f"SELECT id, status, qty FROM {db}.extra")}
    assert extra[("extra", 5)][0] == "semisync"
    got = sink_events(pipeline, bootstrap, nats_conn, redis_conn, ("extra",))
    kafka_keys = [e["idempotency_key"] for _, e in got["events"]]
    assert len(kafka_keys) == len(set(kafka_keys)), "a duplicate in Kafka (exactly-once)"
    for sid, events in got.items():
        assert collections.Counter(e["idempotency_key"] for _, e in events) == collections.Counter(kafka_keys)
        assert_no_time_travel(sid, events)
        assert replay(events) == extra, sid
        waited = [e for _, e in events if key_of("extra", e) == ("extra", 5) and e["after"]["qty"] == 100]
        assert [(e["op"], e["after"]["status"]) for e in waited] == [("u", "semisync")], (sid, waited)
    for sid, msgs in controls(pipeline, bootstrap, nats_conn, redis_conn).items():
        assert msgs[-2]["type"] == "snapshot_started" and msgs[-2]["kind"] == "added", sid
        assert msgs[-1]["type"] == "snapshot_completed" and msgs[-1]["tables"] == [f"{db}.extra"], sid


def _server_id_of(base, pipeline: str) -> str:
    """The ``server_id: N,`` of the pipeline's spec file as written (kept when tables change)."""
    text = (base / "pipelines" / f"{pipeline}.yaml").read_text()
    return re.search(r"server_id: \d+,", text).group(0)


# --------------------------------------------------------------------------- PostgreSQL


def test_postgres_snapshot_with_a_concurrent_writer_then_two_runs(
        airflow_env, postgres, kafka_bootstrap, nats_service, redis_service):
    env, base = airflow_env
    tag = uuid.uuid4().hex[:6]
    schema = pipeline = f"snapp_{tag}"
    (base / "pipelines" / f"{pipeline}.yaml").write_text(spec_text(
        pipeline, "postgres", "cdc_postgres", [f"{schema}.orders", f"{schema}.lines"], f"slot: {pipeline},"))
    admin = psycopg2.connect(postgres.admin_dsn)
    admin.autocommit = True
    writer_conn = psycopg2.connect(postgres.admin_dsn)
    writer_conn.autocommit = True
    waiter_conn = psycopg2.connect(postgres.admin_dsn)
    waiter_conn.autocommit = True

    def on(conn):
        def execute(stmt: str) -> None:
            with conn.cursor() as c:
                c.execute(stmt)
        return execute

    def query(stmt: str) -> list:
        with admin.cursor() as c:
            c.execute(stmt)
            return c.fetchall()

    sql = on(admin)
    sql(f"CREATE SCHEMA {schema}")
    sql(f"CREATE TABLE {schema}.orders (id int PRIMARY KEY, status text, qty int)")
    sql(f"CREATE TABLE {schema}.lines (order_id int, line int, sku text, qty int, "
        f"PRIMARY KEY (order_id, line))")
    sql(f"INSERT INTO {schema}.orders SELECT g, 'new', g % 10 FROM generate_series(1, {ORDERS}) g")
    sql(f"INSERT INTO {schema}.lines SELECT 1 + (g - 1) / 8, 1 + (g - 1) % 8, 'sku-' || g, 1 "
        f"FROM generate_series(1, {LINES}) g")

    def content() -> dict:
        return table_content(query, schema)

    dag = f"cdc_{pipeline}"
    store = open_store(env["TIDEGATE_CHECKPOINT_STORE"])
    writer = Writer(on(writer_conn), f"{schema}.orders", f"{schema}.lines")
    hot = HotWriter(on(writer_conn), [(f"{schema}.extra", range(1, 301)),
                                      (f"{schema}.orders", range(1, 401))])
    try:
        start_writer_at_handoff(store, pipeline, writer)
        rc, log = dags_test(env, dag)
        assert rc == 0 and task_ended(log, "deliver"), log[-3000:]
        writer.finish()
        # a table the pipeline does not capture yet, filled before the next checkpoints
        sql(f"CREATE TABLE {schema}.extra (id int PRIMARY KEY, status text, qty int)")
        sql(f"INSERT INTO {schema}.extra SELECT g, 'new', 0 FROM generate_series(1, {EXTRA}) g")
        for i in (1, 2):  # two more runs stream what the writer did after the handoff
            r = subprocess.run([str(VENV_BIN / "tidegate"), "run", pipeline, "--run-id", f"more_{i}"],
                               env=env, capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr[-3000:]
        [snap] = store.snapshots.all(pipeline)
        assert snap.status == "completed" and len(snap.chunks) == 12
        assert sum(len(v) for v in writer.ops.values()) > 100, "the writer made too few changes"
        got = check_sinks(pipeline, kafka_bootstrap, nats_service.cdc, redis_service.cdc, content(), writer)
        rows = sum(1 for _, e in got["events"] if e["op"] == "r")
        assert rows == snap.rows >= ORDERS + LINES - 1000
        for sid, msgs in controls(pipeline, kafka_bootstrap, nats_service.cdc, redis_service.cdc).items():
            assert [m["type"] for m in msgs] == ["snapshot_started", "snapshot_completed"], sid
            assert msgs[1]["rows"] == rows, sid

        # a table added to source.tables of the running pipeline gets a snapshot of its own, while
        # a writer keeps changing its first rows and the orders (which go on streaming)
        (base / "pipelines" / f"{pipeline}.yaml").write_text(spec_text(
            pipeline, "postgres", "cdc_postgres", [f"{schema}.orders", f"{schema}.lines", f"{schema}.extra"],
            f"slot: {pipeline},"))
        start_when(lambda: len(store.snapshots.all(pipeline)) == 2, hot)
        rc, log = dags_test(env, dag)
        assert rc == 0 and task_ended(log, "deliver"), log[-3000:]
        hot.finish()
        assert hot.updates > 50, "the writer made too few changes"
        for i in (3, 4):
            r = subprocess.run([str(VENV_BIN / "tidegate"), "run", pipeline, "--run-id", f"more_{i}"],
                               env=env, capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr[-3000:]
        added = store.snapshots.all(pipeline)[-1]
        assert added.kind == "added" and added.status == "completed"
        assert EXTRA - 300 <= added.rows <= EXTRA, added.rows  # rows the writer changed come from the log
        assert [f"{t['schema']}.{t['table']}" for t in added.tables] == [f"{schema}.extra"]
        got = sink_events(pipeline, kafka_bootstrap, nats_service.cdc, redis_service.cdc,
                          ("orders", "lines", "extra"))
        everything = {**content(), **{("extra", i): (st, q) for i, st, q in
                                      query(f"SELECT id, status, qty FROM {schema}.extra")}}
        kafka_keys = [e["idempotency_key"] for _, e in got["events"]]
        assert len(kafka_keys) == len(set(kafka_keys)), "a duplicate in Kafka (exactly-once)"
        for sid, events in got.items():
            keys = collections.Counter(e["idempotency_key"] for _, e in events)
            assert keys == collections.Counter(kafka_keys), sid
            assert_no_time_travel(sid, events)
            assert replay(events) == everything, sid
        for sid, msgs in controls(pipeline, kafka_bootstrap, nats_service.cdc, redis_service.cdc).items():
            assert [m["type"] for m in msgs] == ["snapshot_started", "snapshot_completed"] * 2, sid
            assert msgs[2]["tables"] == [f"{schema}.extra"] and msgs[2]["kind"] == "added", sid

        # a resnapshot of one table of the live pipeline while a commit of one of its rows waits
        # for a synchronous standby that never answers (only that session waits: the others
        # commit locally). A healthy pipeline's resnapshot hands off at its lowest checkpoint,
        # before that commit record: the handoff has nothing to wait for, the chunk reads the row
        # without the commit, and the log after the handoff (which has it) replaces the chunk's
        # row. (A handoff at the head waits for such a commit: test_pg_handoff_privilege.)
        for conn in (admin, writer_conn):
            on(conn)("SET synchronous_commit = local")
        sql("ALTER SYSTEM SET synchronous_standby_names = 'tidegate_nobody'")
        sql("SELECT pg_reload_conf()")
        time.sleep(0.5)
        update = f"UPDATE {schema}.extra SET qty = qty + 100, status = 'sync' WHERE id = {SYNC_EXTRA}"
        waiting = threading.Thread(target=on(waiter_conn), args=(update,), daemon=True)
        waiting.start()
        time.sleep(1.0)
        assert query(f"SELECT qty FROM {schema}.extra WHERE id = {SYNC_EXTRA}") == [(0,)]
        assert waiting.is_alive()
        rc, log = dags_test(env, dag, {"resolve": "resnapshot", "reason": "rebuild extra",
                                       "tables": [f"{schema}.extra"]})
        assert rc == 0 and task_ended(log, "deliver"), log[-3000:]
        # the chunks are read by Spark tasks of their own, the slot only by the delivery task,
        # which holds the run's lease: a stalled reader of the slot can always be taken over
        assert re.search(rf"pipeline {pipeline}: the log \(\S+, \S+\] is read in the delivery task, "
                         rf"under the run's lease \(lease epoch \d+\)", log), log[-3000:]
        assert waiting.is_alive(), "the standby answered: the commit was not held across the resnapshot"
        resnap = store.snapshots.all(pipeline)[-1]
        assert resnap.kind == "resnapshot" and resnap.status == "completed"
        sql("ALTER SYSTEM RESET synchronous_standby_names")
        sql("SELECT pg_reload_conf()")
        waiting.join(30)
        assert not waiting.is_alive()
        r = subprocess.run([str(VENV_BIN / "tidegate"), "run", pipeline, "--run-id", "more_5"],
                           env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        got = sink_events(pipeline, kafka_bootstrap, nats_service.cdc, redis_service.cdc,
                          ("orders", "lines", "extra"))
        everything = {**content(), **{("extra", i): (st, q) for i, st, q in
                                      query(f"SELECT id, status, qty FROM {schema}.extra")}}
        assert everything[("extra", SYNC_EXTRA)] == ("sync", 100)
        for sid, events in got.items():
            assert_no_time_travel(sid, events, f"snapshot:{resnap.snapshot_id}")
            assert replay(events) == everything, sid
    finally:
        sql("ALTER SYSTEM RESET synchronous_standby_names")
        sql("SELECT pg_reload_conf()")
        hot.stop.set()
        writer.stop.set()
        store.close()
        with admin.cursor() as c:
            c.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                      "WHERE slot_name = %s", (pipeline,))
        sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        admin.close()
        writer_conn.close()
        waiter_conn.close()
