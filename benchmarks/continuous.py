"""Commit-to-Kafka latency of a `@continuous` pipeline under a steady load, through the real
Airflow deployment (`scripts/services up airflow`: scheduler, LocalExecutor), its deliver task a
Spark Connect client of the `spark_connect` service (``--spark-conn spark_connect``, the
default) or spark-submitting per run (``--spark-conn spark_default``).

A MariaDB table gets ``--rate`` row changes per second (``--rows-per-tx`` rows per
transaction) for ``--seconds``; a read_committed Kafka consumer notes when each row becomes
visible. Latency = visible in Kafka (read_committed) - the workload's COMMIT returned. Prints
the percentiles, rows written/seen/duplicated, the runs Airflow made, and where a run's time goes:
each task's median duration and the median wait before it starts (the upstream task's end, or
for the first task the run's start, to its own start: scheduling, queueing, the task process).
After the load, ``--one-event-runs`` single rows, each written once the last is visible: each
one's commit-to-Kafka and the own time of the deliver task that delivered it alone.

    export TIDEGATE_..._PORT=...   # the servers' ports, as for the tests
    .venv/bin/python benchmarks/continuous.py --rate 200 --seconds 180 [--idle-sleep 0.2]

``--idle-sleep`` sets the scheduler's ``scheduler_idle_sleep_time`` (how long a scheduler loop
that found nothing to do sleeps; Airflow's default 1 s, scripts/services' 0.1 s) for this
benchmark's deployment. The deployment's other settings can be compared through the
environment, which scripts/services passes on, e.g. ``AIRFLOW__SCHEDULER__MP_START_METHOD=fork``:
task processes without the forkserver's preloaded modules. Also printed: the CPU the
scheduler, api-server and dag-processor used during the load.

The Airflow deployment is (re)started with this benchmark's pipelines folder and checkpoint
store, and stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
import uuid
from pathlib import Path

from servers import services, services_env  # benchmarks/servers.py

ROOT = Path(__file__).resolve().parents[1]


class Api:
    def __init__(self, env: dict[str, str]):
        self.url = env["TIDEGATE_AIRFLOW_URL"]
        self.token = self.call("POST", "/auth/token", {"username": env["TIDEGATE_AIRFLOW_USER"],
                                                       "password": env["TIDEGATE_AIRFLOW_PASSWORD"]},
                               auth=False)["access_token"]

    def call(self, method: str, path: str, body: dict | None = None, *, auth: bool = True) -> dict:
        req = urllib.request.Request(self.url + path, method=method,
                                     headers={"Content-Type": "application/json"},
                                     data=None if body is None else json.dumps(body).encode())
        if auth:
            req.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"{}")


class Workload(threading.Thread):
    """Inserts rows at a steady rate; records when each row's COMMIT returned."""

    def __init__(self, conn_kwargs: dict, table: str, rate: int, rows_per_tx: int, seconds: float):
        super().__init__(daemon=True)
        self.kw, self.table, self.rate = conn_kwargs, table, rate
        self.per_tx, self.seconds = rows_per_tx, seconds
        self.committed: dict[int, float] = {}

    def run(self) -> None:
        import pymysql

        conn = pymysql.connect(**self.kw, autocommit=False)
        interval = self.per_tx / self.rate
        next_id, start = 1, time.monotonic()
        with conn.cursor() as c:
            while time.monotonic() - start < self.seconds:
                ids = list(range(next_id, next_id + self.per_tx))
                c.executemany(f"INSERT INTO {self.table} (id, v) VALUES (%s, %s)",
                              [(i, "x" * 40) for i in ids])
                conn.commit()
                t = time.time()
                for i in ids:
                    self.committed[i] = t
                next_id += self.per_tx
                # Steady rate: sleep until this transaction's slot is over.
                delay = start + (next_id - 1) / self.rate - time.monotonic()
                if delay > 0:
                    time.sleep(min(delay, interval))
        conn.close()


class Reader(threading.Thread):
    """read_committed consumer: when each row id became visible in Kafka."""

    def __init__(self, bootstrap: str, topic: str):
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.seen: dict[int, float] = {}
        self.duplicates = 0
        self.stop = threading.Event()

    def run(self) -> None:
        from confluent_kafka import Consumer

        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "bench-" + uuid.uuid4().hex,
                      "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                      "enable.auto.commit": False, "topic.metadata.refresh.interval.ms": 2000})
        c.subscribe([self.topic])
        try:
            while not self.stop.is_set():
                msg = c.poll(0.5)
                if msg is None or msg.error():
                    continue
                t = time.time()
                row = json.loads(msg.value())["after"]["id"]
                if row in self.seen:
                    self.duplicates += 1
                else:
                    self.seen[row] = t
        finally:
            c.close()


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=200, help="row changes per second")
    ap.add_argument("--rows-per-tx", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=180)
    ap.add_argument("--drain", type=float, default=180, help="max seconds to wait for the tail")
    ap.add_argument("--spark-conn", default="spark_connect",
                    help="the spec's spark.conn_id: spark_connect (a Connect client) or spark_default")
    ap.add_argument("--one-event-runs", type=int, default=3,
                    help="after the load: runs that deliver one event each (the deliver task's own time)")
    ap.add_argument("--idle-sleep", type=float, default=None,
                    help="the scheduler's scheduler_idle_sleep_time, seconds (Airflow's default: 1)")
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT / "include"))
    services("up", "mysql", "kafka", *(["spark_connect"] if args.spark_conn == "spark_connect" else []))
    senv = services_env()
    from tidegate.connections import get_connection

    admin = get_connection("cdc_mysql_admin", senv)
    bootstrap = get_connection("cdc_kafka", senv).extra["bootstrap.servers"]
    tag = uuid.uuid4().hex[:6]
    db, pipeline = f"bench_{tag}", f"bench_cont_{tag}"
    work = Path(tempfile.mkdtemp(prefix="tidegate-bench-continuous-"))
    (work / "pipelines").mkdir()
    (work / "pipelines" / f"{pipeline}.yaml").write_text(textwrap.dedent(f"""
        pipeline: {pipeline}
        schedule: "@continuous"
        source: {{kind: mysql, conn_id: cdc_mysql, tables: [{db}.events], server_id: 48501, start: head}}
        sinks:
          - {{id: events, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}",
              exactly_once: true}}
        spark: {{conn_id: {args.spark_conn}}}
    """))
    import pymysql

    kw = dict(host=admin.host, port=admin.port, user=admin.login, password=admin.password)
    with pymysql.connect(**kw, autocommit=True) as conn, conn.cursor() as c:
        c.execute(f"CREATE DATABASE {db}")
        c.execute(f"CREATE TABLE {db}.events (id INT PRIMARY KEY, v VARCHAR(64))")

    env = dict(os.environ, TIDEGATE_PIPELINES_DIR=str(work / "pipelines"),
               TIDEGATE_CHECKPOINT_STORE=f"sqlite:///{work / 'store.sqlite'}")
    env.pop("TIDEGATE_STATSD", None)
    if args.idle_sleep is not None:
        env["AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME"] = str(args.idle_sleep)
    # The deployment's tasks import the engine of this checkout (a worktree may share the venv).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "include"), env.get("PYTHONPATH")) if p)
    t0 = time.monotonic()
    services("up", "airflow", env=env)
    senv = services_env()
    api = Api(senv)
    dag = f"cdc_{pipeline}"
    while True:
        try:
            api.call("GET", f"/api/v2/dags/{dag}")
            break
        except OSError:
            if time.monotonic() - t0 > 180:
                raise SystemExit(f"{dag} did not appear") from None
            time.sleep(2)
    api.call("PATCH", f"/api/v2/dags/{dag}", {"is_paused": False})
    print(f"deployment up and {dag} unpaused in {time.monotonic() - t0:.0f}s; waiting for the first run "
          f"(places the sink at the head)", flush=True)
    while not any(r["state"] == "success"
                  for r in api.call("GET", f"/api/v2/dags/{dag}/dagRuns")["dag_runs"]):
        time.sleep(2)

    reader = Reader(bootstrap, f"{pipeline}.events")
    reader.start()
    load = Workload({**kw, "database": db}, f"{db}.events", args.rate, args.rows_per_tx, args.seconds)
    services_dir = senv.get("TIDEGATE_SERVICES_DIR")
    cpu_before = airflow_cpu(services_dir)
    t_load = time.monotonic()
    load.start()
    load.join()
    load_s = time.monotonic() - t_load
    cpu_used = {k: v - cpu_before.get(k, 0.0) for k, v in airflow_cpu(services_dir).items()}
    deadline = time.monotonic() + args.drain
    while len(reader.seen) < len(load.committed) and time.monotonic() < deadline:
        time.sleep(1)
    runs = [r for r in api.call("GET", f"/api/v2/dags/{dag}/dagRuns?limit=1000")["dag_runs"]
            if r.get("start_date") and r.get("end_date")]
    single = one_event_runs(api, dag, {**kw, "database": db}, f"{db}.events", reader,
                            first_id=len(load.committed) + 1, count=args.one_event_runs)
    reader.stop.set()
    reader.join()
    api.call("PATCH", f"/api/v2/dags/{dag}", {"is_paused": True})

    durations = [(_ts(r["end_date"]) - _ts(r["start_date"])) for r in runs]
    lat = [reader.seen[i] - t for i, t in load.committed.items() if i in reader.seen]
    seen = len(lat)  # the load's rows (the single rows written after it are counted apart)
    rate = len(load.committed) / load_s
    print(f"\nload: {len(load.committed)} rows in {load_s:.0f}s = {rate:.0f} changes/s "
          f"({args.rows_per_tx} rows per transaction)")
    print(f"kafka (read_committed): {seen} rows seen, {reader.duplicates} duplicates, "
          f"{len(load.committed) - seen} missing after {args.drain:.0f}s of drain")
    if lat:
        print(f"commit-to-Kafka latency: p50 {pct(lat, 50):.1f}s  p95 {pct(lat, 95):.1f}s  "
              f"p99 {pct(lat, 99):.1f}s  max {max(lat):.1f}s  mean {statistics.mean(lat):.1f}s")
    if durations:
        print(f"airflow runs: {len(durations)} finished, mean {statistics.mean(durations):.1f}s, "
              f"max {max(durations):.1f}s per run")
    if cpu_used:
        print("airflow processes' CPU during the load (share of one core): "
              + ", ".join(f"{k} {v / load_s:.0%}" for k, v in cpu_used.items()))
    task_breakdown(api, dag, [r for r in runs if r["state"] == "success"])
    if single:
        print(f"one event alone, {len(single)} times (after the load; each delivered by a run of its own):")
        for latency, deliver_s, run_s in single:
            print(f"   commit-to-Kafka {latency:.2f}s; the deliver task's own time {deliver_s:.2f}s"
                  + (f" (the run in it {run_s:.2f}s)" if run_s is not None else ""))
    with pymysql.connect(**kw, autocommit=True) as conn, conn.cursor() as c:
        c.execute(f"DROP DATABASE IF EXISTS {db}")
    services("down", "airflow")
    return 0 if seen == len(load.committed) and reader.duplicates == 0 else 1


TASKS = ("guard", "bounds", "deliver", "release", "report")
# Each task's upstream in the DAG (release and report both follow deliver); a task's wait is
# counted from the end of the nearest upstream task that ran (deliver is skipped in a run with
# nothing to do), or from the run's start for the first task.
UPSTREAM = {"guard": None, "bounds": "guard", "deliver": "bounds", "release": "deliver", "report": "deliver"}


def task_breakdown(api: Api, dag: str, runs: list[dict]) -> None:
    """Median seconds per task: the wait before it started and its own duration; runs that
    delivered (deliver not skipped) apart from the others; and what the deliver tasks' reports
    say of their Spark Connect session."""
    import urllib.parse

    waits: dict[str, list[float]] = {t: [] for t in TASKS}
    took: dict[str, list[float]] = {t: [] for t in TASKS}
    connect: list[dict] = []
    for r in runs[-40:]:  # the last runs: the steady state
        q = urllib.parse.quote(r["dag_run_id"], safe="")
        tis = {t["task_id"]: t for t in api.call("GET", f"/api/v2/dags/{dag}/dagRuns/{q}/taskInstances")
               ["task_instances"]}
        ends: dict[str | None, float] = {None: _ts(r["start_date"])}
        for task in TASKS:
            ti = tis.get(task)
            up = UPSTREAM[task]
            while up not in ends:
                up = UPSTREAM[up]
            if not ti or ti["state"] != "success" or not ti.get("start_date"):
                continue
            waits[task].append(_ts(ti["start_date"]) - ends[up])
            took[task].append(ti.get("duration") or 0.0)
            ends[task] = _ts(ti["end_date"])
        if tis.get("deliver", {}).get("state") == "success":
            try:
                report = api.call("GET", f"/api/v2/dags/{dag}/dagRuns/{q}/taskInstances/deliver/xcomEntries/"
                                         "return_value")["value"]
                report = json.loads(report) if isinstance(report, str) else report
                if isinstance(report, dict) and report.get("connect_timings"):
                    connect.append(report["connect_timings"] | {"opened": report.get("spark_session_opened")})
            except OSError:
                pass
    print("where a run's time goes (last runs, median seconds): wait before the task -> the task")
    for task in TASKS:
        if took[task]:
            wait, own = statistics.median(waits[task]), statistics.median(took[task])
            print(f"   {task:<8} wait {wait:5.2f}s  task {own:5.2f}s  ({len(took[task])} runs)")
    if connect:
        runs_s = [c["run_s"] for c in connect]
        opened = sum(1 for c in connect if c.get("opened"))
        print(f"   deliver's run in the task (read + deliver + commit): median "
              f"{statistics.median(runs_s):.2f}s; Spark Connect session opened in {opened} of "
              f"{len(connect)} delivering runs")


def one_event_runs(api: Api, dag: str, conn_kwargs: dict, table: str, reader: Reader, *, first_id: int,
                   count: int) -> list[tuple[float, float, float | None]]:
    """One row at a time, each once the last is visible: (commit-to-Kafka, the deliver task's
    own time, the run inside it from the task's report) of the run that delivered it."""
    import pymysql

    out: list[tuple[float, float, float | None]] = []
    counted: set[str] = set()  # runs already measured (each probe's run is a newer one)
    with pymysql.connect(**conn_kwargs, autocommit=True) as conn, conn.cursor() as c:
        for row in range(first_id, first_id + count):
            c.execute(f"INSERT INTO {table} (id, v) VALUES (%s, %s)", (row, "one"))
            committed, deadline = time.time(), time.monotonic() + 60
            while row not in reader.seen and time.monotonic() < deadline:
                time.sleep(0.02)
            if row not in reader.seen:
                break
            found = _one_event_deliver(api, dag, deadline, counted)
            if found is not None:
                out.append((reader.seen[row] - committed, *found))
    return out


def _one_event_deliver(api: Api, dag: str, deadline: float, counted: set[str]
                       ) -> tuple[float, float | None] | None:
    """The newest finished deliver task not ``counted`` yet that delivered exactly one event: (its
    own time, run_s); its run is added to ``counted``."""
    import urllib.parse

    while time.monotonic() < deadline:
        for r in api.call("GET", f"/api/v2/dags/{dag}/dagRuns?order_by=-run_after&limit=4")["dag_runs"]:
            if r["dag_run_id"] in counted:
                continue
            q = urllib.parse.quote(r["dag_run_id"], safe="")
            ti = api.call("GET", f"/api/v2/dags/{dag}/dagRuns/{q}/taskInstances/deliver")
            if ti.get("state") != "success" or ti.get("duration") is None:
                continue
            report = api.call("GET", f"/api/v2/dags/{dag}/dagRuns/{q}/taskInstances/deliver/xcomEntries/"
                                     "return_value")["value"]
            report = json.loads(report) if isinstance(report, str) else report
            if isinstance(report, dict) and report.get("events") == 1:
                counted.add(r["dag_run_id"])
                return ti["duration"], (report.get("connect_timings") or {}).get("run_s")
        time.sleep(0.2)
    return None


def airflow_cpu(services_dir: str | None) -> dict[str, float]:
    """CPU seconds so far of the deployment's long-lived processes (not of its task processes):
    what a shorter scheduler idle sleep costs shows in the scheduler's."""
    base = Path(services_dir or ROOT / ".services") / "airflow"
    out = {}
    for component in ("scheduler", "api-server", "dag-processor"):
        try:
            pid = int((base / f"{component}.pid").read_text().split()[0])
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except (OSError, ValueError, IndexError):
            continue
        out[component] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return out


def _ts(text: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


if __name__ == "__main__":
    sys.exit(main())
