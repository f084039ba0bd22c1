"""Airflow as users run it: the `airflow` service of scripts/services (api-server, scheduler,
dag-processor, LocalExecutor, metadata DB on the project's PostgreSQL), not `airflow dags test`.
Every pipeline here delivers as a Spark Connect client of the shared `spark_connect` server
(``spark.conn_id: spark_connect``): a deliver task starts no JVM.

One deployment for the whole module (started with this module's pipelines folder, checkpoint
store and StatsD listener; stopped at the end). In file order:

- REST API triggers (`/api/v2/dags/{dag_id}/dagRuns`, bearer token): `mode=dry_run` delivers
  nothing and reports what it would; `sinks=[one]` with `max_events` delivers to that sink only,
  in sub-batches of that size.
- The trigger form: Airflow's own form shows each of the pipeline's fields (a screenshot), and the
  API server refuses a run whose conf breaks one (HTTP 400 naming the field).
- A `*/1 * * * *` pipeline, unpaused: workloads written between scheduled runs are delivered
  exactly once (Kafka read_committed per key in order; NATS and Redis by idempotency_key).
- `airflow backfill create` over two of those scheduled intervals, created while a scheduled
  run's deliver is running: the backfill's deliver waits for it (one deliver per pipeline at a
  time), both succeed, the replays carry exactly the journaled ranges to the chosen sink and no
  checkpoint moves back. A backfill over an interval whose scheduled run had nothing to do
  succeeds without starting Spark.
- A purged binlog halts a pipeline: the failed run still sends `tidegate.incidents_open` and
  `tidegate.checkpoint_age_seconds` to a real UDP StatsD listener; the tidegate page in headless
  Chromium shows the incident's range after login and nothing without; `resolve=accept_gap`
  with a reason through the REST API resumes the pipeline.
- A deliver task whose process group (the task process, which delivers as the Connect client)
  is SIGKILLed mid-delivery is retried by the scheduler; the retry adopts what the sinks committed
  and every change arrives once on Kafka (read_committed), NATS and Redis, in order per key.
- Assets and lineage: a DAG of the extra DAG bundle scheduled on a pipeline's topic asset runs
  after a delivering run and not after an idle one (asset events and their extra through the REST
  API); the OpenLineage events of the delivering run, as a real HTTP receiver got them.

- The page (two users besides admin, with rights on different DAGs through the test auth manager
  of dag_allowlist_auth.py): each sees only its pipelines, on the page and in /api/status, and
  gets 403 on an action against another's DAG (401 without login; a cookie without the form's
  CSRF token, or from another origin, is refused); pause and resume from the page set the DAG's
  is_paused; the lag and events charts have one bar per journaled run, with the journal's
  values; a dropped slot resolved from the page with a reason (a blank one is refused) is
  recorded with the page user, the next run delivers, and `tidegate status` shows who and why.

The screenshots of the page are kept in .artifacts/ui/ (git-ignored).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import psycopg2
import pymysql
import pytest
from tidegate.store import open_store

from tests.conftest import SERVICES, services_env
from tests.integration import airflow_support as support
from tests.integration.airflow_support import (
    browser_login,
    chart_bars,
    page_call,
    page_users,
    spark_connect_server,  # noqa: F401 - the spark_connect fixture
    wait_for,
)
from tests.integration.sink_readers import kafka_changes, nats_ids, nats_payloads, redis_events, redis_ids

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / ".artifacts" / "ui"


# --------------------------------------------------------------------------- StatsD


class StatsdListener:
    """A real UDP StatsD endpoint: keeps every metric line it receives."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65535)
            except TimeoutError:
                continue
            except OSError:
                return
            self.lines.extend(data.decode(errors="replace").splitlines())

    def values(self, name: str) -> list[str]:
        """Values of ``name`` (after Airflow's ``airflow.`` prefix), e.g. ['1|g']."""
        return [line.split(":", 1)[1] for line in list(self.lines) if line.split(":", 1)[0] == name]

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


# --------------------------------------------------------------------------- REST API


class AirflowApi:
    """Airflow's public REST API with a bearer token from /auth/token."""

    def __init__(self, url: str, user: str, password: str):
        self.url = url.rstrip("/")
        self.token = self.call("POST", "/auth/token", {"username": user, "password": password},
                               auth=False)["access_token"]

    def call(self, method: str, path: str, body: dict | None = None, *, auth: bool = True) -> dict:
        req = urllib.request.Request(self.url + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        if auth:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{method} {path}: HTTP {exc.code}: {exc.read()[:500]!r}") from None

    @staticmethod
    def q(run_id: str) -> str:
        return urllib.parse.quote(run_id, safe="")

    def wait_dag(self, dag_id: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.call("GET", f"/api/v2/dags/{dag_id}")
                return
            except AssertionError:
                time.sleep(2)
        errors = self.call("GET", "/api/v2/importErrors")
        raise AssertionError(f"DAG {dag_id} did not appear in {timeout:.0f}s; import errors: {errors}")

    def set_paused(self, dag_id: str, paused: bool) -> None:
        self.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": paused})

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        run = self.call("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}})
        return run["dag_run_id"]

    def run(self, dag_id: str, run_id: str) -> dict:
        return self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{self.q(run_id)}")

    def runs(self, dag_id: str) -> list[dict]:
        return self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns?order_by=run_after&limit=100")["dag_runs"]

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 300) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.run(dag_id, run_id)["state"]
            if state in ("success", "failed"):
                return state
            time.sleep(2)
        raise AssertionError(f"{dag_id} {run_id} not finished after {timeout:.0f}s: "
                             f"{self.tasks(dag_id, run_id)}")

    def tasks(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        tis = self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{self.q(run_id)}/taskInstances")
        return {t["task_id"]: t["state"] for t in tis["task_instances"]}

    def xcom(self, dag_id: str, run_id: str, task_id: str):
        v = self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{self.q(run_id)}/taskInstances/{task_id}"
                             "/xcomEntries/return_value")["value"]
        return json.loads(v) if isinstance(v, str) else v


# --------------------------------------------------------------------------- the deployment


def services(*args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, str(SERVICES), *args], capture_output=True, text=True, env=env,
                       timeout=600)
    if check and r.returncode != 0:
        pytest.fail(f"scripts/services {' '.join(args)} failed:\n{r.stdout[-2000:]}{r.stderr[-3000:]}",
                    pytrace=False)
    return r


@pytest.fixture(scope="module")
def deployment(service_env, mysql, postgres, kafka, redis_service, nats_service, spark_connect):
    base = Path(tempfile.mkdtemp(prefix="tidegate-airflow-sched-"))
    (base / "pipelines").mkdir()
    tag = uuid.uuid4().hex[:6]
    names = {k: f"af_{k}_{tag}" for k in ("rest", "sched", "halt", "pg")}
    db = f"af_{tag}"
    specs = {
        "rest": f"""
            pipeline: {names['rest']}
            source: {{kind: mysql, conn_id: cdc_mysql, tables: [{db}.items], server_id: 48401, start: head}}
            sinks:
              - {{id: events, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}",
                  exactly_once: true}}
              - {{id: cache, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:{{table}}"}}
            spark: {{conn_id: spark_connect}}
        """,
        "sched": f"""
            pipeline: {names['sched']}
            schedule: "*/1 * * * *"
            source: {{kind: mysql, conn_id: cdc_mysql, tables: [{db}.orders], server_id: 48402, start: head}}
            sinks:
              - {{id: events, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}",
                  exactly_once: true}}
              - {{id: bus, kind: nats, conn_id: cdc_nats, stream: AF_{tag.upper()},
                  subject: "{{pipeline}}.{{table}}"}}
              - {{id: cache, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:{{table}}",
                  required: false}}
            spark: {{conn_id: spark_connect}}
        """,
        "halt": f"""
            pipeline: {names['halt']}
            source: {{kind: mysql, conn_id: cdc_mysql, tables: [{db}.t], server_id: 48403, start: head}}
            sinks: [{{id: cache, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:{{table}}"}}]
            spark: {{conn_id: spark_connect}}
        """,
        "pg": f"""
            pipeline: {names['pg']}
            source: {{kind: postgres, conn_id: cdc_postgres, tables: [{db}.t], slot: {names['pg']}}}
            sinks: [{{id: cache, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:{{table}}"}}]
            spark: {{conn_id: spark_connect}}
        """,
    }
    pg = psycopg2.connect(postgres.admin_dsn)
    pg.autocommit = True
    with pg.cursor() as c:
        c.execute(f"CREATE SCHEMA {db}")
        c.execute(f"CREATE TABLE {db}.t (id int PRIMARY KEY, status text)")
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    with admin.cursor() as c:
        c.execute(f"CREATE DATABASE {db}")
        for table in ("items", "orders", "t"):
            c.execute(f"CREATE TABLE {db}.{table} (id INT PRIMARY KEY, status VARCHAR(20))")
    for key, text in specs.items():
        (base / "pipelines" / f"{names[key]}.yaml").write_text(textwrap.dedent(text))

    statsd = StatsdListener()
    store_url = f"sqlite:///{base / 'store.sqlite'}"
    # Two page users besides admin, each with rights on its own DAGs only ("the page").
    page_env, page_passwords = page_users(base, {
        "halt_ops": [f"cdc_{names['halt']}", f"cdc_{names['pg']}"],
        "feed_ops": [f"cdc_{names['rest']}", f"cdc_{names['sched']}"]})
    lineage = support.LineageReceiver()  # (assets and lineage): OpenLineage events, and DAGs on assets
    (base / "extra_dags").mkdir()
    env = dict(os.environ, TIDEGATE_PIPELINES_DIR=str(base / "pipelines"),
               TIDEGATE_CHECKPOINT_STORE=store_url, TIDEGATE_STATSD=f"127.0.0.1:{statsd.port}",
               TIDEGATE_AIRFLOW_EXTRA_DAGS=str(base / "extra_dags"),
               AIRFLOW__OPENLINEAGE__TRANSPORT=lineage.transport, **page_env)
    t0 = time.monotonic()
    services("up", "airflow", env=env)
    senv = services_env()
    api = AirflowApi(senv["TIDEGATE_AIRFLOW_URL"], senv["TIDEGATE_AIRFLOW_USER"],
                     senv["TIDEGATE_AIRFLOW_PASSWORD"])
    dags = {k: f"cdc_{v}" for k, v in names.items()}
    for dag_id in dags.values():
        api.wait_dag(dag_id)
    # DAGs are created paused, and a paused DAG runs nothing, triggered or not. The scheduled
    # one's first run happens while the REST test runs.
    for dag_id in dags.values():
        api.set_paused(dag_id, False)
    print(f"airflow deployment ready in {time.monotonic() - t0:.0f}s", file=sys.stderr)
    store = open_store(store_url)
    d = {"api": api, "names": names, "dags": dags, "db": db, "admin": admin, "store": store,
         "statsd": statsd, "env": env, "senv": senv, "base": base, "pg": pg,
         "page_passwords": page_passwords, "lineage": lineage}
    yield d
    for dag_id in dags.values():
        try:
            api.set_paused(dag_id, True)
        except AssertionError:
            pass
    store.close()
    statsd.close()
    lineage.close()
    with admin.cursor() as c:
        c.execute(f"DROP DATABASE IF EXISTS {db}")
    admin.close()
    with pg.cursor() as c:
        c.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                  "WHERE slot_name = %s AND NOT active", (names["pg"],))
        c.execute(f"DROP SCHEMA IF EXISTS {db} CASCADE")
    pg.close()
    # Stop it: it was started with this module's folders, and it costs memory and CPU.
    services("down", "airflow", check=False)


def sql(d, *stmts: str) -> None:
    with d["admin"].cursor() as c:
        for s in stmts:
            c.execute(s)


def ckpts(d, key: str) -> dict[str, tuple]:
    current = d["store"].checkpoints.current(d["names"][key])
    return {sid: (r.version, r.position) for sid, r in current.items()}


def kafka_or_empty(bootstrap: str, topic: str) -> list[dict]:
    from confluent_kafka.admin import AdminClient

    if topic not in AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics:
        return []
    return kafka_changes(bootstrap, topic)


def per_key(changes: list[dict]) -> dict[int, list[tuple]]:
    out: dict[int, list[tuple]] = collections.defaultdict(list)
    for ch in changes:
        out[ch["key"]["id"]].append((ch["op"], (ch["after"] or {}).get("status")))
    return dict(out)


# --------------------------------------------------------------------------- REST API triggers


def test_rest_api_triggers_dry_run_one_sink_and_max_events(deployment, kafka_bootstrap, redis_service):
    d, api = deployment, deployment["api"]
    dag, p, db = d["dags"]["rest"], d["names"]["rest"], d["db"]
    run = api.trigger(dag)  # first run: sinks placed at the binlog head, no Spark
    assert api.wait_run(dag, run) == "success", api.tasks(dag, run)
    assert api.tasks(dag, run)["deliver"] == "skipped"
    before = ckpts(d, "rest")

    # Five transactions of one row change each.
    sql(d, f"INSERT INTO {db}.items VALUES (1, 'new')", f"INSERT INTO {db}.items VALUES (2, 'new')",
        f"INSERT INTO {db}.items VALUES (3, 'new')", f"UPDATE {db}.items SET status = 'paid' WHERE id = 1",
        f"DELETE FROM {db}.items WHERE id = 2")

    run = api.trigger(dag, {"mode": "dry_run"})
    assert api.wait_run(dag, run) == "success", api.tasks(dag, run)
    report = api.xcom(dag, run, "deliver")
    assert (report["mode"], report["events"], report["sub_batches"]) == ("dry_run", 5, 1)
    assert api.xcom(dag, run, "report")["mode"] == "dry_run"
    assert kafka_or_empty(kafka_bootstrap, f"{p}.items") == []
    assert redis_ids(redis_service.cdc, f"{p}:items") == []
    assert ckpts(d, "rest") == before  # nothing moved

    run = api.trigger(dag, {"sinks": ["cache"], "max_events": 2})
    assert api.wait_run(dag, run) == "success", api.tasks(dag, run)
    report = api.xcom(dag, run, "deliver")
    assert (report["events"], report["sub_batches"]) == (5, 3)
    assert [s["id"] for s in report["sinks"]] == ["cache"]
    keys = redis_ids(redis_service.cdc, f"{p}:items")
    assert len(keys) == len(set(keys)) == 5
    assert kafka_or_empty(kafka_bootstrap, f"{p}.items") == []  # not chosen: nothing
    after = ckpts(d, "rest")
    assert after["events"] == before["events"] and after["cache"][1] > before["cache"][1]
    entry = d["store"].runs.entries(p, run)[-1]
    assert (entry.status, list(entry.sinks), entry.sinks["cache"].events) == ("success", ["cache"], 5)


# --------------------------------------------------------------------------- the scheduler


def scheduled(api, dag: str) -> list[dict]:
    return [r for r in api.runs(dag) if r["dag_run_id"].startswith("scheduled__")]


def wait_scheduled(api, dag: str, pred, what: str, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in scheduled(api, dag):
            if pred(r):
                return r
        time.sleep(2)
    raise AssertionError(f"{dag}: no scheduled run {what} within {timeout:.0f}s: "
                         f"{[(r['run_id'], r['state']) for r in scheduled(api, dag)]}")


def quiet_point(api, dag: str, timeout: float = 240) -> dict:
    """The latest scheduled run, once it has finished and the next cron tick is more than 12 s
    away: a change written now is read by the next scheduled run and by no earlier one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = scheduled(api, dag)
        if runs and runs[-1]["state"] in ("success", "failed") and 60 - time.gmtime().tm_sec > 12:
            return runs[-1]
        time.sleep(1)
    raise AssertionError(f"{dag}: no finished scheduled run between ticks in {timeout:.0f}s")


def after_bounds(api, dag: str, run: dict) -> None:
    """Wait until the run's upper bound is captured: a change written now belongs to a later run."""
    deadline = time.monotonic() + 240
    while api.tasks(dag, run["dag_run_id"]).get("bounds") not in ("success", "failed", "upstream_failed"):
        assert time.monotonic() < deadline, api.tasks(dag, run["dag_run_id"])
        time.sleep(1)


def test_scheduled_runs_deliver_the_workload_between_them_exactly_once(deployment, kafka_bootstrap,
                                                                     nats_service, redis_service):
    d, api = deployment, deployment["api"]
    dag, p, db = d["dags"]["sched"], d["names"]["sched"], d["db"]
    first = quiet_point(api, dag)
    sql(d, f"INSERT INTO {db}.orders VALUES (1, 'new'), (2, 'new')",
        "BEGIN", f"UPDATE {db}.orders SET status = 'paid' WHERE id = 1",
        f"INSERT INTO {db}.orders VALUES (3, 'new')", "COMMIT")
    second = wait_scheduled(api, dag, lambda r: r["run_after"] > first["run_after"], "after the first")
    after_bounds(api, dag, second)
    sql(d, f"DELETE FROM {db}.orders WHERE id = 2", f"UPDATE {db}.orders SET status = 'shipped' WHERE id = 1")
    third = wait_scheduled(api, dag, lambda r: r["run_after"] > second["run_after"], "after the second")
    for r in (first, second, third):
        assert api.wait_run(dag, r["dag_run_id"]) == "success", api.tasks(dag, r["dag_run_id"])
    assert api.tasks(dag, second["dag_run_id"])["deliver"] == "success"
    assert api.tasks(dag, third["dag_run_id"])["deliver"] == "success"

    changes = kafka_changes(kafka_bootstrap, f"{p}.orders")
    assert per_key(changes) == {1: [("c", "new"), ("u", "paid"), ("u", "shipped")],
                                2: [("c", "new"), ("d", None)], 3: [("c", "new")]}
    keys = [ch["idempotency_key"] for ch in changes]
    assert len(keys) == len(set(keys)) == 6
    assert collections.Counter(nats_ids(nats_service.cdc, f"AF_{p.rsplit('_', 1)[1].upper()}")) == \
        collections.Counter(keys)
    assert redis_ids(redis_service.cdc, f"{p}:orders") == keys
    journal = {e.run_id: e for e in d["store"].runs.entries(p)}
    assert [journal[r["dag_run_id"]].sinks["events"].events for r in (second, third)] == [4, 2]
    assert api.tasks(dag, first["dag_run_id"])["deliver"] == "skipped"  # nothing was written before it
    d["scheduled"] = (first, second, third, keys)


def ti(api, dag: str, run_id: str, task_id: str) -> dict:
    return api.call("GET", f"/api/v2/dags/{dag}/dagRuns/{api.q(run_id)}/taskInstances/{task_id}")


def backfill(d, dag: str, start: dict, end: dict) -> None:
    """`airflow backfill create` (once the scheduler has closed the DAG's previous backfill:
    Airflow allows one running backfill per DAG)."""
    deadline = time.monotonic() + 120
    while True:
        r = services("airflow", "backfill", "create", "--dag-id", dag,
                     "--from-date", start["logical_date"], "--to-date", end["logical_date"],
                     "--reprocess-behavior", "completed", "--max-active-runs", "1",
                     "--dag-run-conf", json.dumps({"sinks": ["cache"]}), env=d["env"], check=False)
        if r.returncode == 0 or "AlreadyRunningBackfill" not in r.stderr or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert r.returncode == 0, r.stderr[-3000:]
    print(r.stdout[-1500:], file=sys.stderr)


def test_backfill_overlapping_a_scheduled_run_waits_for_it_and_replays_exactly(deployment, kafka_bootstrap,
                                                                              redis_service, spark_connect):
    from tests.integration.test_fault_matrix import server_pid

    d, api = deployment, deployment["api"]
    dag, p, db = d["dags"]["sched"], d["names"]["sched"], d["db"]
    first, second, third, keys = d["scheduled"]
    originals = {r["dag_run_id"]: d["store"].runs.entries(p, r["dag_run_id"])[0] for r in (second, third)}

    # A scheduled run with something to deliver; the backfill is created while its deliver runs.
    # A deliver of one row takes under a second (it reads in-process and opens no Spark
    # session), less than it takes to see the run through the API: Redis, the `cache` sink, is
    # stopped (SIGSTOP) before the row is written, so that deliver waits at opening its sinks
    # (up to the sink's 30 s socket timeout, then it retries) until its task process is found
    # and stopped in turn; Redis is continued once it is, and the deliver once the backfill's
    # deliver is scheduled, so the backfill's deliver must wait for it.
    last = quiet_point(api, dag)
    server = server_pid("redis")
    os.kill(server, signal.SIGSTOP)
    try:
        sql(d, f"INSERT INTO {db}.orders VALUES (10, 'late')")
        late = wait_scheduled(api, dag, lambda r: r["run_after"] > last["run_after"], "after the late row")
        late_ti = ti(api, dag, late["dag_run_id"], "deliver")["id"]
        deadline = time.monotonic() + 240
        while (group := task_process_group(late_ti)) is None:
            assert time.monotonic() < deadline, ("no deliver process", api.tasks(dag, late["dag_run_id"]))
            time.sleep(0.2)
        os.killpg(group, signal.SIGSTOP)
    finally:
        os.kill(server, signal.SIGCONT)
    before = ckpts(d, "sched")
    try:
        backfill(d, dag, second, third)
        # The backfill re-runs the scheduled run `second`: its deliver, cleared, is scheduled
        # again once its guard and bounds ran, and waits there for the stopped one.
        wait_for(lambda: ti(api, dag, second["dag_run_id"], "deliver")["state"] == "scheduled", 240,
                 "the backfill's deliver scheduled")
    finally:
        os.killpg(group, signal.SIGCONT)

    def replays() -> dict:
        return {rid: [e for e in d["store"].runs.entries(p, rid) if e.mode == "replay"] for rid in originals}

    deadline = time.monotonic() + 420
    while not all(e and e[-1].status in ("success", "failed") for e in replays().values()):
        assert time.monotonic() < deadline, (replays(), [api.tasks(dag, rid) for rid in originals])
        time.sleep(3)
    assert api.wait_run(dag, late["dag_run_id"]) == "success", api.tasks(dag, late["dag_run_id"])
    for rid in originals:
        assert api.wait_run(dag, rid) == "success", api.tasks(dag, rid)
        replay = replays()[rid][-1]
        assert replay.status == "success" and list(replay.sinks) == ["cache"]
        orig = originals[rid].sinks["cache"]
        got = replay.sinks["cache"]
        assert (got.start, got.end, got.events) == (orig.start, orig.end, orig.events)

    # The backfill's first deliver was scheduled while the scheduled run's deliver ran, and
    # waited for it to end (no two Spark jobs of the pipeline at once: no fencing).
    held = ti(api, dag, late["dag_run_id"], "deliver")
    waiting = ti(api, dag, second["dag_run_id"], "deliver")
    assert waiting["scheduled_when"] < held["end_date"] <= waiting["start_date"], (held, waiting)
    spans = sorted((t["start_date"], t["end_date"]) for t in
                   (held, waiting, ti(api, dag, third["dag_run_id"], "deliver")))
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), spans

    # Redis got the late row, then exactly those two ranges again, in order; Kafka (not chosen)
    # only the late row.
    late_key = [c["idempotency_key"] for c in kafka_changes(kafka_bootstrap, f"{p}.orders")][len(keys):]
    assert len(late_key) == 1
    assert redis_ids(redis_service.cdc, f"{p}:orders") == keys + late_key + keys
    # Checkpoints only moved forward, and only by the scheduled run (a replay moves none).
    after = ckpts(d, "sched")
    for sid, (version, position) in before.items():
        assert after[sid][1] >= position, f"{sid} moved back from {position} to {after[sid][1]}"
        movers = {h.run_id for h in d["store"].checkpoints.history(p, sid) if h.version > version}
        assert movers <= {late["dag_run_id"]}, (sid, movers)
    d["scheduled_after"] = after


def test_backfill_over_an_interval_that_had_nothing_to_do_skips_spark(deployment):
    d, api = deployment, deployment["api"]
    dag, p = d["dags"]["sched"], d["names"]["sched"]
    first = d["scheduled"][0]
    before = ckpts(d, "sched")
    backfill(d, dag, first, first)
    deadline = time.monotonic() + 240
    while api.run(dag, first["dag_run_id"]).get("run_type") != "backfill" or \
            api.run(dag, first["dag_run_id"])["state"] not in ("success", "failed"):
        assert time.monotonic() < deadline, api.tasks(dag, first["dag_run_id"])
        time.sleep(2)
    assert api.run(dag, first["dag_run_id"])["state"] == "success", api.tasks(dag, first["dag_run_id"])
    tasks = api.tasks(dag, first["dag_run_id"])
    assert tasks["deliver"] == "skipped" and tasks["bounds"] == "success", tasks
    assert api.xcom(dag, first["dag_run_id"], "bounds")["replay_of"] == first["dag_run_id"]
    assert [e for e in d["store"].runs.entries(p, first["dag_run_id"])] == []  # nothing ran, nothing recorded
    after = ckpts(d, "sched")
    assert all(after[sid][1] >= pos for sid, (_, pos) in before.items())


# --------------------------------------------------------------------------- halt, metrics, page


def chromium(profile: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={profile}", "--window-size=1400,1000"):
        opts.add_argument(arg)
    return webdriver.Chrome(options=opts, service=Service("/usr/bin/chromedriver"))


def test_the_guard_sends_retention_headroom_on_both_sources(deployment):
    """On every run the guard task sends how much log the source keeps beyond the oldest
    checkpoint: MariaDB's binlog expiry minus the checkpoint's age (seconds), the PostgreSQL
    slot's safe_wal_size (bytes), to the real StatsD listener, so an alert can fire before a
    purge or an invalidation. Both limits are set on the shared servers for this test only."""
    d, api, statsd = deployment, deployment["api"], deployment["statsd"]
    week, keep = 7 * 86400, 4 << 30
    with d["admin"].cursor() as c:
        c.execute("SELECT @@GLOBAL.binlog_expire_logs_seconds")
        (expire_was,) = c.fetchone()
        c.execute(f"SET GLOBAL binlog_expire_logs_seconds = {week}")
    with d["pg"].cursor() as c:
        c.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '4GB'")
        c.execute("SELECT pg_reload_conf()")
    try:
        for key in ("rest", "pg"):  # a run with checkpoints (the first one places them)
            for _ in range(2):
                run = api.trigger(d["dags"][key])
                assert api.wait_run(d["dags"][key], run) == "success", api.tasks(d["dags"][key], run)
        mysql_name = f"airflow.tidegate.retention_headroom_seconds.{d['names']['rest']}"
        pg_name = f"airflow.tidegate.retention_headroom_bytes.{d['names']['pg']}"
        seconds = wait_for(lambda: statsd.values(mysql_name), 60, f"{mysql_name} in {statsd.lines[-20:]}")
        wal = wait_for(lambda: statsd.values(pg_name), 60, f"{pg_name} in {statsd.lines[-20:]}")
        # a checkpoint written minutes ago: a week less a few minutes of binlog left
        assert all(v.endswith("|g") and week - 900 < float(v[:-2]) <= week for v in seconds), seconds
        # the slot holds next to nothing: about the whole 4 GB (less the WAL since its restart_lsn,
        # give or take the segment it is in)
        low, high = keep - (256 << 20), keep + (64 << 20)
        assert all(v.endswith("|g") and low < float(v[:-2]) <= high for v in wal), wal
        assert not statsd.values(f"airflow.tidegate.retention_headroom_bytes.{d['names']['rest']}")
        assert not statsd.values(f"airflow.tidegate.retention_headroom_seconds.{d['names']['pg']}")
    finally:
        with d["admin"].cursor() as c:
            c.execute(f"SET GLOBAL binlog_expire_logs_seconds = {int(expire_was)}")
        with d["pg"].cursor() as c:
            c.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            c.execute("SELECT pg_reload_conf()")


def test_purge_halts_failed_run_emits_metrics_page_shows_incident_accept_gap_resumes(
        deployment, redis_service, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    from tests.integration.test_smoke_mysql import purge_to

    d, api = deployment, deployment["api"]
    dag, p, db = d["dags"]["halt"], d["names"]["halt"], d["db"]
    api.set_paused(d["dags"]["sched"], True)  # the purge below would halt it too
    run = api.trigger(dag)
    assert api.wait_run(dag, run) == "success", api.tasks(dag, run)
    with d["admin"].cursor() as c:
        c.execute(f"INSERT INTO {db}.t VALUES (1, 'lost')")
        c.execute("FLUSH BINARY LOGS")
        c.execute("SHOW MASTER STATUS")
        newest = c.fetchone()[0]
    purge_to(d["admin"], newest)

    run = api.trigger(dag)
    assert api.wait_run(dag, run) == "failed"
    tasks = api.tasks(dag, run)
    assert tasks["guard"] == "failed" and tasks["deliver"] in ("upstream_failed", None), tasks
    inc = d["store"].incidents.all(p)[0]
    assert (inc.kind, inc.resolved, inc.to_position.file) == ("binlog_purged", False, newest)

    # The failure callback reported through Airflow's Stats to the StatsD listener.
    statsd = d["statsd"]
    wait_for(lambda: "1|g" in statsd.values(f"airflow.tidegate.incidents_open.{p}"), 60,
             f"incidents_open of {p} in {statsd.lines[-20:]}")
    ages = statsd.values(f"airflow.tidegate.checkpoint_age_seconds.{p}.cache")
    assert ages and all(v.endswith("|g") and float(v.split("|")[0]) >= 0 for v in ages), ages

    # The page: nothing without login; after login the pipelines, their sinks, the incident.
    url = d["senv"]["TIDEGATE_AIRFLOW_URL"] + "/tidegate/"
    browser = chromium(tmp_path / "chromium-profile")
    try:
        browser.set_page_load_timeout(60)
        browser.get(url)
        wait_for(lambda: "/auth/login" in browser.current_url, 30, "redirect to the login page")
        assert p not in browser.page_source
        user = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "input:not([type=password])"), 30,
                        "the login form")[0]
        user.send_keys(d["senv"]["TIDEGATE_AIRFLOW_USER"])
        pw = browser.find_element(By.CSS_SELECTOR, "input[type=password]")
        pw.send_keys(d["senv"]["TIDEGATE_AIRFLOW_PASSWORD"], Keys.ENTER)
        wait_for(lambda: "/auth/login" not in browser.current_url, 30, "login")
        if not browser.current_url.rstrip("/").endswith("/tidegate"):
            browser.get(url)
        section = wait_for(lambda: browser.find_elements(By.ID, f"pipeline-{p}"), 30,
                           "the pipeline on the page")[0]
        text = section.text
        assert "HALTED" in text and "binlog_purged" in text and newest in text
        assert inc.from_position.file in text  # the range: from the checkpoint to the oldest binlog
        assert '"resolve": "accept_gap"' in text
        for key in ("rest", "sched"):
            other = browser.find_element(By.ID, f"pipeline-{d['names'][key]}").text
            assert "events" in other and "cache" in other
        assert "bus" in browser.find_element(By.ID, f"pipeline-{d['names']['sched']}").text
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "tidegate_page.png"))
    finally:
        browser.quit()

    run = api.trigger(dag, {"resolve": "accept_gap", "reason": "row 1 re-entered by hand"})
    assert api.wait_run(dag, run) == "success", api.tasks(dag, run)
    resolved = d["store"].incidents.get(inc.id)
    assert (resolved.resolved, resolved.resolution, resolved.reason) == (
        True, "accept_gap", "row 1 re-entered by hand")
    wait_for(lambda: "0|g" in statsd.values(f"airflow.tidegate.incidents_open.{p}"), 60,
             "incidents_open back to 0 after the report task")


def gone(exc) -> bool:
    """Whether a WebDriver error says the element's page or node is gone. Chromium reports it as
    a stale element, or, when the page is replaced during the call, as an inspector error whose
    node "does not belong to the document" (found by CI)."""
    from selenium.common.exceptions import StaleElementReferenceException

    return isinstance(exc, StaleElementReferenceException) or (
        "does not belong to the document" in str(exc))


def rendered(read):
    """``read()``, or None while React replaces the elements it was reading (a stale element)."""
    from selenium.common.exceptions import WebDriverException

    try:
        return read()
    except WebDriverException as exc:
        if not gone(exc):
            raise
        return None


def test_airflow_trigger_form_shows_every_field_and_the_api_refuses_bad_values(deployment, tmp_path):
    """The form's fields name the draft-07 dialect (params.SCHEMA_DIALECT): Airflow's own trigger
    form still shows each of them, and the API server still validates a run's conf with them."""
    from selenium.webdriver.common.by import By

    d, api = deployment, deployment["api"]
    dag = d["dags"]["rest"]
    for conf, field in (({"max_events": 0}, "max_events"), ({"mode": "everything"}, "mode"),
                        ({"tables": ["no_schema"]}, "tables")):
        with pytest.raises(AssertionError, match=r"HTTP 400.*" + field):
            api.call("POST", f"/api/v2/dags/{dag}/dagRuns", {"logical_date": None, "conf": conf})
    browser = page_browser(d, tmp_path, "admin")
    try:
        browser.get(d["senv"]["TIDEGATE_AIRFLOW_URL"] + f"/dags/{dag}")
        wait_for(lambda: rendered(lambda: [b.click() for b in browser.find_elements(By.TAG_NAME, "button")
                                           if b.text.strip() == "Trigger"][:1]), 60, "the Trigger button")

        def form_text() -> str:
            dialogs = lambda: browser.find_elements(By.CSS_SELECTOR, "[role=dialog]")  # noqa: E731
            return rendered(lambda: "".join(e.text for e in dialogs() if "Run Parameters" in e.text)) or ""

        titles = ("Mode", "Sinks", "Max events per sub-batch", "Replay of run", "Resolve incident", "Reason",
                  "Tables to re-load")
        text = wait_for(lambda: all(t in form_text() for t in titles) and form_text(), 60,
                        f"the fields {titles} in the form")
        assert "incremental" in text  # the mode's default
        # resolve's default, labelled by params.NO_RESOLUTION (Airflow showed "null")
        assert "(none: resolve nothing)" in text, text
        shot(browser, "airflow_trigger_form.png")
    finally:
        browser.quit()


def test_statsd_names_are_plain_metric_lines(deployment):
    """Every tidegate metric the deployment sent is a valid StatsD line named by pipeline."""
    lines = [ln for ln in deployment["statsd"].lines if ln.startswith("airflow.tidegate.")]
    assert lines
    names = {ln.split(":", 1)[0].split(".")[2] for ln in lines}
    assert {"incidents_open", "checkpoint_age_seconds", "events", "bytes", "lag_bytes",
            "lag_seconds"} <= names
    assert all(ln.rsplit("|", 1)[1] in ("c", "g") for ln in lines), lines[:5]




# --------------------------------------------------------------------------- a killed deliver, retried


def task_process_group(ti_id: str) -> int | None:
    """The process group of the running task instance ``ti_id``: its task process names itself
    ``airflow worker -- <ti id>``, and the task supervisor gives it a group of its own (with the
    Connect client's threads and a reader process, if any, inside)."""
    wanted = f"airflow worker -- {ti_id}".encode()  # not "... -- LocalExecutor: <id>", its executor
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
            if cmdline.split(b"\0")[0].strip() == wanted:
                return os.getpgid(int(entry.name))
        except (OSError, ValueError):
            continue
    return None


@pytest.mark.chaos
def test_deliver_killed_under_the_scheduler_is_retried_and_delivers_exactly_once(
        deployment, kafka_bootstrap, nats_service, redis_service):
    """The deliver task's process group (the task process, a Spark Connect client) is SIGKILLed
    mid-delivery; the scheduler retries the task (the DAG's default args give it
    retries), the retry adopts what the sinks had committed, and every change arrives once."""
    from tests.integration.test_fault_matrix import Workload

    d, api = deployment, deployment["api"]
    tag = uuid.uuid4().hex[:6]
    p, table, stream = f"af_kill_{tag}", f"kill_{tag}", f"AFK_{tag.upper()}"
    sql(d, f"CREATE TABLE {d['db']}.{table} (id INT PRIMARY KEY, status VARCHAR(20))")
    (d["base"] / "pipelines" / f"{p}.yaml").write_text(textwrap.dedent(f"""
        pipeline: {p}
        source: {{kind: mysql, conn_id: cdc_mysql, tables: [{d['db']}.{table}], server_id: 48404}}
        batch: {{max_events: 10}}
        sinks:
          - {{id: events, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}",
              exactly_once: true, partitions: 3}}
          - {{id: bus, kind: nats, conn_id: cdc_nats, stream: {stream}, subject: "{{pipeline}}.{{table}}"}}
          - {{id: cache, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:{{table}}"}}
        spark: {{conn_id: spark_connect}}
    """))
    dag = f"cdc_{p}"
    api.wait_dag(dag)
    api.set_paused(dag, False)
    run = api.trigger(dag)  # places the sinks at the binlog head
    assert api.wait_run(dag, run) == "success", api.tasks(dag, run)
    work = Workload(lambda stmt: sql(d, stmt), f"{d['db']}.{table}")
    work.wave(600)  # ~90 sub-batches: a few seconds of delivery to kill it in

    run = api.trigger(dag)
    history = d["store"].checkpoints.history

    def writes() -> int:
        return sum(1 for h in history(p, "events") if h.kind == "write" and h.run_id == run)

    def running_deliver() -> str | None:
        found = ti(api, dag, run, "deliver")
        return found["id"] if found["state"] == "running" else None

    ti_id = wait_for(running_deliver, 300, f"the deliver task of {dag} {run} running")
    group = wait_for(lambda: task_process_group(ti_id), 60, f"the process of the deliver task {ti_id}")
    scheduler = int((Path(d["senv"]["TIDEGATE_SERVICES_DIR"]) / "airflow" / "scheduler.pid").read_text())
    assert group not in (os.getpgid(0), os.getpgid(scheduler))  # the task's own group, nothing more
    wait_for(lambda: writes() >= 2, 300, "two sub-batches delivered")
    os.killpg(group, signal.SIGKILL)
    killed_at = writes()
    assert api.wait_run(dag, run, timeout=420) == "success", api.tasks(dag, run)
    tries = ti(api, dag, run, "deliver")["try_number"]
    print(f"{dag}: deliver killed after {killed_at} sub-batches, try {tries} delivered up to {writes()}",
          file=sys.stderr)
    assert tries >= 2  # the scheduler ran it again
    assert killed_at < writes(), (killed_at, writes())  # the retry delivered the rest

    changes = kafka_changes(kafka_bootstrap, f"{p}.{table}")
    keys = collections.Counter(ch["idempotency_key"] for ch in changes)
    assert per_key(changes) == work.expected
    assert set(keys.values()) == {1} and len(keys) == work.changes
    data_ids = [i for i in nats_ids(nats_service.cdc, stream) if "|__control|" not in i]
    assert collections.Counter(data_ids) == keys
    assert per_key(nats_payloads(nats_service.cdc, stream, f"{p}.{table}")) == work.expected
    cached = [json.loads(e) for e in redis_events(redis_service.cdc, f"{p}:{table}")]
    assert per_key(cached) == work.expected
    assert collections.Counter(e["idempotency_key"] for e in cached) == keys



# --------------------------------------------------------------------------- assets and lineage


def asset_events(api, dag: str, run_id: str) -> dict[str, dict]:
    """{asset URI: event} of the asset events the deliver task of DAG run ``run_id`` emitted (the
    REST API's /api/v2/assets/events)."""
    events = api.call("GET", f"/api/v2/assets/events?source_dag_id={dag}&source_run_id={api.q(run_id)}"
                             "&limit=100")["asset_events"]
    by_uri = {e["uri"]: e for e in events}
    assert len(by_uri) == len(events), events  # one event per target
    return by_uri


def lineage_events(d, dag: str, run: str, expected: int) -> list[dict]:
    """The OpenLineage events the receiver got for DAG run ``run`` once all ``expected`` arrived
    (a DAG run's COMPLETE is sent by the scheduler after the run is marked done)."""
    wait_for(lambda: len(d["lineage"].of_run(dag, run)) >= expected, 60,
             f"{expected} OpenLineage events of {dag} {run}; got "
             f"{[(e['eventType'], e['job']['name']) for e in d['lineage'].of_run(dag, run)]}")
    return d["lineage"].of_run(dag, run)


def test_assets_trigger_downstream_after_delivering_runs_only(deployment, kafka_bootstrap, mysql,
                                                               redis_service):
    """The deliver task emits one asset event per delivered target through the pipeline's alias;
    a DAG scheduled on one target's asset (a file of the deployment's extra DAG bundle) runs after
    a run that delivered, and not after an idle one. The event's extra holds the sink's range and
    the target's counts. The same delivering run's OpenLineage events, as a real HTTP receiver
    got them, event by event."""
    d, api = deployment, deployment["api"]
    # A pipeline of its own (the module's others are halted or moved by earlier tests).
    tag = uuid.uuid4().hex[:6]
    p, db = f"af_assets_{tag}", d["db"]
    sql(d, f"CREATE TABLE {db}.items_{tag} (id INT PRIMARY KEY, status VARCHAR(20))")
    (d["base"] / "pipelines" / f"{p}.yaml").write_text(textwrap.dedent(f"""
        pipeline: {p}
        source: {{kind: mysql, conn_id: cdc_mysql, tables: [{db}.items_{tag}], server_id: 48405, start: head}}
        sinks:
          - {{id: events, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}",
              exactly_once: true}}
          - {{id: cache, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:{{table}}"}}
        spark: {{conn_id: spark_connect}}
    """))
    dag = f"cdc_{p}"
    api.wait_dag(dag)
    api.set_paused(dag, False)
    first = api.trigger(dag)  # places the sinks at the binlog head
    assert api.wait_run(dag, first) == "success", api.tasks(dag, first)

    topic_uri = f"kafka://{kafka_bootstrap}/{p}.items_{tag}"
    downstream = f"on_asset_{p}"
    support.write_asset_consumer(d["base"] / "extra_dags", downstream, topic_uri)
    api.wait_dag(downstream, timeout=180)  # the extra bundle is scanned every refresh_interval (30 s)
    api.set_paused(downstream, False)
    assert api.runs(downstream) == []

    # A delivering run: three row changes on the pipeline's table.
    table = f"{db}.items_{tag}"
    sql(d, f"INSERT INTO {table} VALUES (101, 'new')", f"INSERT INTO {table} VALUES (102, 'new')",
        f"UPDATE {table} SET status = 'paid' WHERE id = 101")
    run = api.trigger(dag)
    assert api.wait_run(dag, run) == "success", api.tasks(dag, run)
    report = api.xcom(dag, run, "deliver")
    sinks = {s["id"]: s for s in report["sinks"]}
    assert sinks["events"]["targets"] == {f"{p}.items_{tag}": {"events": 3, "tables": [table]}}
    assert sinks["cache"]["targets"] == {f"{p}:items_{tag}": {"events": 3, "tables": [table]}}

    triggered = wait_for(lambda: api.runs(downstream), 120, f"a run of {downstream}")
    assert [r["run_type"] for r in triggered] == ["asset_triggered"]
    assert api.wait_run(downstream, triggered[0]["dag_run_id"]) == "success"

    stream_uri = f"redis://127.0.0.1:{redis_service.port}/0/{p}:items_{tag}"
    emitted = asset_events(api, dag, run)
    assert set(emitted) == {topic_uri, stream_uri}, emitted
    for uri, sink in ((topic_uri, "events"), (stream_uri, "cache")):
        event = emitted[uri]
        assert (event["source_dag_id"], event["source_task_id"]) == (dag, "deliver")
        s = sinks[sink]
        assert event["extra"] == {
            "pipeline": p, "run_id": run, "sink": sink, "kind": s["kind"], "from": s["start"],
            "to": s["end"], "events": 3, "tables": [table], "sink_events": 3,
            "sink_bytes": s["bytes"]}, event["extra"]
        assert s["start"] != s["end"] and s["events"] == 3

    # An idle run: nothing new on the table; deliver is skipped, no asset event, no downstream run.
    idle = api.trigger(dag)
    assert api.wait_run(dag, idle) == "success", api.tasks(dag, idle)
    assert api.tasks(dag, idle)["deliver"] == "skipped"
    time.sleep(45)  # a bounded wait: the scheduler would have queued a run within a few loops
    assert len(api.runs(downstream)) == 1
    assert asset_events(api, dag, idle) == {}

    # OpenLineage: the delivering run's events, START and COMPLETE of the DAG run and each task.
    tasks = ("guard", "bounds", "deliver", "release", "report")
    events = lineage_events(d, dag, run, 2 + 2 * len(tasks))
    got = collections.Counter((e["eventType"], e["job"]["name"]) for e in events)
    assert got == collections.Counter(
        [("START", dag), ("COMPLETE", dag)]
        + [(kind, f"{dag}.{t}") for t in tasks for kind in ("START", "COMPLETE")]), got
    by = {(e["eventType"], e["job"]["name"]): e for e in events}
    for t in tasks:
        start, done = by[("START", f"{dag}.{t}")], by[("COMPLETE", f"{dag}.{t}")]
        assert events.index(start) < events.index(done)
        assert start["run"]["runId"] == done["run"]["runId"]
        assert done["run"]["facets"]["parent"]["job"]["name"] == dag
        if t != "deliver":
            assert (done["inputs"], done["outputs"]) == ([], []), (t, done["inputs"], done["outputs"])
    deliver = by[("COMPLETE", f"{dag}.deliver")]
    [source] = deliver["inputs"]
    assert (source["namespace"], source["name"]) == (f"mysql://127.0.0.1:{mysql.port}", table)
    assert [(f["name"], f["type"]) for f in source["facets"]["schema"]["fields"]] == [
        ("id", "int(11)"), ("status", "varchar(20)")]
    outputs = {(o["namespace"], o["name"]): o["outputFacets"]["outputStatistics"]["rowCount"]
               for o in deliver["outputs"]}
    assert outputs == {(f"kafka://{kafka_bootstrap}", f"{p}.items_{tag}"): 3,
                       (f"redis://127.0.0.1:{redis_service.port}/0", f"{p}:items_{tag}"): 3}
    assert by[("START", f"{dag}.deliver")]["inputs"] == []  # the run's tables are known once it ran
    # The idle run's deliver was skipped: its lineage names no dataset.
    idle_events = lineage_events(d, dag, idle, 2)
    assert all(not e.get("inputs") and not e.get("outputs") for e in idle_events)
    print(f"deliver of {dag} {run}: {ti(api, dag, run, 'deliver')['duration']:.2f}s with OpenLineage on",
          file=sys.stderr)


# --------------------------------------------------------------------------- the page


def page_token(d, user: str) -> str:
    """A bearer token of a page user (POST /auth/token)."""
    return AirflowApi(d["senv"]["TIDEGATE_AIRFLOW_URL"], user, d["page_passwords"][user]).token


def page_browser(d, tmp_path: Path, user: str):
    """Headless Chromium logged in to the tidegate page as ``user`` (its own profile)."""
    browser = chromium(tmp_path / f"chromium-{user}")
    browser.set_page_load_timeout(60)
    password = d["senv"]["TIDEGATE_AIRFLOW_PASSWORD"] if user == "admin" else d["page_passwords"][user]
    browser_login(browser, d["senv"]["TIDEGATE_AIRFLOW_URL"] + "/tidegate/", user, password)
    return browser


def shot(browser, name: str, element=None) -> None:
    """A screenshot of the page (or of one element of it) kept in .artifacts/ui/."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    if element is not None:
        element.screenshot(str(ARTIFACTS / name))
    else:
        browser.save_screenshot(str(ARTIFACTS / name))


def is_paused(d, dag_id: str) -> bool:
    return d["api"].call("GET", f"/api/v2/dags/{dag_id}")["is_paused"]


def test_page_lists_only_pipelines_whose_dag_a_user_may_read_and_refuses_other_actions(deployment, tmp_path):
    from selenium.webdriver.common.by import By

    d, n = deployment, deployment["names"]
    url = d["senv"]["TIDEGATE_AIRFLOW_URL"]
    tokens = {user: page_token(d, user) for user in d["page_passwords"]}
    seen = {}
    for user, token in [*tokens.items(), ("admin", d["api"].token)]:
        code, doc = page_call(url, "/api/status", token=token)
        assert code == 200, doc
        seen[user] = {p["pipeline"] for p in doc["pipelines"]}
    assert seen["halt_ops"] == {n["halt"], n["pg"]}
    assert seen["feed_ops"] == {n["rest"], n["sched"]}
    assert seen["admin"] >= set(n.values())

    rest_paused = is_paused(d, d["dags"]["rest"])
    # 403: an action on a pipeline whose DAG the user may not touch, naming user, DAG and fix.
    code, body = page_call(url, f"/pipelines/{n['halt']}/pause", token=tokens["feed_ops"], form={})
    assert code == 403 and "'feed_ops' may not pause" in body["detail"], body
    assert d["dags"]["halt"] in body["detail"]
    code, body = page_call(url, f"/pipelines/{n['rest']}/resolve", token=tokens["halt_ops"],
                           form={"resolve": "accept_gap", "reason": "not mine"})
    assert code == 403 and "may not trigger runs" in body["detail"], body
    # 401 without login, for reads and actions.
    assert page_call(url, "/api/status")[0] == 401
    assert page_call(url, f"/pipelines/{n['rest']}/pause", form={})[0] == 401
    # CSRF: the session cookie alone does not make an action (no form token; a foreign origin).
    code, body = page_call(url, f"/pipelines/{n['rest']}/pause", cookie=tokens["feed_ops"], form={},
                           headers={"Origin": url})
    assert code == 403 and "csrf_token" in body["detail"], body
    code, body = page_call(url, f"/pipelines/{n['rest']}/pause", cookie=tokens["feed_ops"],
                           form={"csrf_token": "0" * 64}, headers={"Origin": "http://evil.example"})
    assert code == 403 and "Origin" in body["detail"], body
    assert is_paused(d, d["dags"]["rest"]) == rest_paused  # nothing happened

    # In the browser each user sees exactly its pipelines.
    for user, mine in (("halt_ops", {"halt", "pg"}), ("feed_ops", {"rest", "sched"})):
        browser = page_browser(d, tmp_path, user)
        try:
            sections = wait_for(lambda b=browser: b.find_elements(By.CSS_SELECTOR, "section.pipeline"), 30,
                                f"{user}'s pipelines")
            assert {s.get_attribute("id") for s in sections} == {f"pipeline-{n[k]}" for k in mine}
            assert f"logged in as {user}" in browser.page_source
            shot(browser, f"tidegate_page_{user}.png")
        finally:
            browser.quit()


def stale(element) -> bool:
    """Whether ``element`` belongs to a page the browser has left."""
    from selenium.common.exceptions import WebDriverException

    try:
        element.is_enabled()
    except WebDriverException as exc:
        if not gone(exc):
            raise
        return True
    return False


def test_pause_and_resume_from_the_page_set_the_dags_is_paused(deployment, tmp_path):
    from selenium.webdriver.common.by import By

    d, n = deployment, deployment["names"]
    dag = d["dags"]["rest"]
    browser = page_browser(d, tmp_path, "feed_ops")
    try:
        for _ in range(2):  # pause, then resume (or the other way round): the state comes back
            before = is_paused(d, dag)
            section = browser.find_element(By.ID, f"pipeline-{n['rest']}")
            assert section.get_attribute("data-paused") == str(before).lower()
            section.find_element(By.CSS_SELECTOR, "h2 form button").click()
            # The action redirects to a new page: until it loads, the old page (and, the second
            # time round, the first action's note) is still there (found by CI, a slow hour).
            wait_for(lambda old=section: stale(old), 30, "the page after the action")
            note = wait_for(lambda: browser.find_elements(By.ID, "done"), 30, "the action's note")[0].text
            assert note == f"{dag} {'resumed' if before else 'paused'} by feed_ops"
            assert is_paused(d, dag) is (not before)  # through the REST API
            section = browser.find_element(By.ID, f"pipeline-{n['rest']}")
            assert ("PAUSED" in section.find_element(By.TAG_NAME, "h2").text) is (not before)
            if not before:
                shot(browser, "tidegate_page_paused.png")
    finally:
        browser.quit()


def test_lag_and_events_charts_have_one_bar_per_journaled_run_matching_the_journal(deployment, tmp_path):
    import datetime as dt
    import re

    from selenium.webdriver.common.by import By

    # The PostgreSQL pipeline: the MariaDB ones are behind the binlogs the purge test purged.
    d, api, n = deployment, deployment["api"], deployment["names"]
    dag, p, db = d["dags"]["pg"], n["pg"], d["db"]
    for i in range(8):  # at least 5 journaled runs (the first run only places checkpoints)
        if len(d["store"].runs.entries(p)) >= 5:
            break
        with d["pg"].cursor() as c:
            c.execute(f"INSERT INTO {db}.t VALUES ({900 + i}, 'charted')")
        run = api.trigger(dag)
        assert api.wait_run(dag, run) == "success", api.tasks(dag, run)
    journal = d["store"].runs.entries(p)[-20:]
    assert len(journal) >= 5

    def seconds(a: str, b: str) -> float:
        ta, tb = (dt.datetime.fromisoformat(t) for t in (a, b))
        return round((tb - ta).total_seconds(), 3)

    full = d["store"].runs.entries(p)
    before = {e.id: full[k - 1] if k else None for k, e in enumerate(full)}
    def largest(values) -> str:
        known = [v for v in values if v is not None]
        return str(max(known)) if known else ""

    expected = {
        "events": [largest(js.events for js in e.sinks.values()) for e in journal],
        "lag_bytes": [largest(js.start.bytes_to(js.end) for js in e.sinks.values() if js.start and js.end)
                      for e in journal],
        "lag_seconds": [str(seconds(before[e.id].started_at, e.finished_at)) if before[e.id] else ""
                        for e in journal],
    }
    assert any(v not in ("", "0") for v in expected["events"])  # the rows inserted above
    browser = page_browser(d, tmp_path, "halt_ops")
    try:
        section = browser.find_element(By.ID, f"pipeline-{p}")
        for series, values in expected.items():
            svg = section.find_element(By.CSS_SELECTOR, f"svg.chart[data-series={series}]")
            assert chart_bars(svg) == list(zip([e.run_id for e in journal], values, strict=True)), series
        browser.execute_script("arguments[0].scrollIntoView()", section.find_element(By.CLASS_NAME, "charts"))
        shot(browser, "tidegate_page_charts.png", section)
        # Checkpoints read as an LSN X/Y, the raw JSON one click away.
        ck = d["store"].checkpoints.current(p)["cache"].position
        row = section.find_element(By.CSS_SELECTOR, "tr.sink[data-sink=cache]")
        lsn = row.find_element(By.CSS_SELECTOR, "code.pos").text
        assert lsn == str(ck) and re.fullmatch(r"[0-9A-F]+/[0-9A-F]+", lsn), lsn
        raw = row.find_element(By.CSS_SELECTOR, "details pre")
        assert not raw.is_displayed()
        row.find_element(By.CSS_SELECTOR, "details summary").click()
        assert raw.is_displayed() and json.loads(raw.text) == ck.to_json()
    finally:
        browser.quit()


def test_an_incident_resolved_from_the_page_records_who_and_why_and_the_next_run_delivers(
        deployment, redis_service, tmp_path):
    import re

    from selenium.webdriver.common.by import By

    d, api, n = deployment, deployment["api"], deployment["names"]
    dag, p, db = d["dags"]["pg"], n["pg"], d["db"]
    if not d["store"].checkpoints.current(p):  # a first run creates the slot, places the checkpoints
        run = api.trigger(dag)
        assert api.wait_run(dag, run) == "success", api.tasks(dag, run)

    def drop_slot() -> bool:
        with d["pg"].cursor() as c:
            c.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                      "WHERE slot_name = %s AND NOT active", (p,))
            return c.rowcount == 1
    wait_for(drop_slot, 30, f"slot {p} dropped")
    with d["pg"].cursor() as c:
        c.execute(f"INSERT INTO {db}.t VALUES (1, 'lost')")
    run = api.trigger(dag)
    assert api.wait_run(dag, run) == "failed"
    inc = [i for i in d["store"].incidents.all(p) if not i.resolved][0]
    assert inc.kind == "slot_dropped"

    reason = "slot dropped by a DBA cleanup; row 1 re-sent by the app team"
    url = d["senv"]["TIDEGATE_AIRFLOW_URL"] + "/tidegate/"
    browser = page_browser(d, tmp_path, "halt_ops")
    try:
        def resolve_form():
            return browser.find_element(By.CSS_SELECTOR, f"#pipeline-{p} form.resolve")
        assert browser.find_element(By.ID, f"pipeline-{p}").get_attribute("data-halted") == "true"
        assert [o.get_attribute("value") for o in resolve_form().find_elements(By.TAG_NAME, "option")] == [
            "accept_gap", "resnapshot"]
        # A blank reason is refused by the server, with a message naming the field.
        resolve_form().find_element(By.NAME, "reason").send_keys("   ")
        resolve_form().find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        error = wait_for(lambda: browser.find_elements(By.CLASS_NAME, "error"), 30, "the refusal")[0].text
        assert error.startswith("reason: required. Say why the incident is resolved this way")
        shot(browser, "tidegate_page_reason_refused.png")
        assert [i.resolved for i in d["store"].incidents.all(p)][-1] is False  # no run was made

        browser.get(url)
        resolve_form().find_element(By.NAME, "reason").send_keys(reason)
        resolve_form().find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        note = wait_for(lambda: browser.find_elements(By.ID, "done"), 30, "the trigger's note")[0].text
        run = re.fullmatch(rf"{dag}: run (\S+) triggered by halt_ops with resolve=accept_gap", note).group(1)
        assert api.wait_run(dag, run) == "success", api.tasks(dag, run)
        assert api.run(dag, run)["triggering_user_name"] == "halt_ops"
        done = d["store"].incidents.get(inc.id)
        assert (done.resolved, done.resolution, done.resolved_by, done.reason) == (
            True, "accept_gap", "halt_ops", reason)
        browser.get(url)
        row = browser.find_element(By.CSS_SELECTOR, f"#pipeline-{p} tr.incident.resolved")
        assert (row.find_element(By.CLASS_NAME, "who").text, row.find_element(By.CLASS_NAME, "why").text) == (
            "halt_ops", reason)
        shot(browser, "tidegate_page_resolved.png")
    finally:
        browser.quit()

    # The next run delivers: the row after the gap reaches the sink, the lost one never does.
    delivered = len(redis_events(redis_service.cdc, f"{p}:t"))
    with d["pg"].cursor() as c:
        c.execute(f"INSERT INTO {db}.t VALUES (2, 'after the gap')")
    run = api.trigger(dag)
    assert api.wait_run(dag, run) == "success", api.tasks(dag, run)
    cached = [json.loads(e) for e in redis_events(redis_service.cdc, f"{p}:t")]
    assert [(e["after"]["id"], e["after"]["status"]) for e in cached[delivered:]] == [(2, "after the gap")]
    assert 1 not in [e["after"]["id"] for e in cached]
    control = map(json.loads, redis_events(redis_service.cdc, f"{p}:__control"))
    gaps = [g for g in control if g["type"] == "gap"]
    assert [(g["incident"], g["reason"]) for g in gaps] == [(inc.id, reason)]

    # `tidegate status` tells who resolved it, when and why.
    r = subprocess.run([sys.executable, "-m", "tidegate.cli", "status", p], env=d["env"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(ln for ln in r.stdout.splitlines() if f"resolved #{inc.id} " in ln)
    assert line.strip() == (f"resolved #{inc.id} slot_dropped: accept_gap by halt_ops at "
                            f"{done.resolved_at}: {reason}"), r.stdout
