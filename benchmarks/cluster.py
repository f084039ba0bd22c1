"""The Spark path on a standalone cluster of two workers (one core each) against one in-process
reader: a 1M-change MariaDB backlog and a 1M-row snapshot, delivered to Kafka exactly-once.

    eval "$(scripts/services env)"
    PATH="$PWD/.venv/bin:$PATH" SPARK_LOCAL_IP=127.0.0.1 flock /tmp/tidegate-bench.lock \\
        .venv/bin/python benchmarks/cluster.py [--changes 1000000] [--rows 1000000] [--only log|snapshot]

The cluster is an instance of the `spark` service of its own (scripts/services with
TIDEGATE_SPARK_WORKERS=2, TIDEGATE_SPARK_PORT=``--port``, its folder ``cluster_bench/`` under
the services folder), started here and stopped at the end (``--keep-cluster`` leaves it up);
the shared `spark` service is left alone. Each application's event log goes to
``cluster_bench/spark/events/``.

Workload, in a database of its own (dropped at the end, with the Kafka topics): ``--rows`` rows
of an 11-column table for the snapshot (filled by the server, before anything is placed), and
``--changes`` row changes of a table of the same columns in transactions of 10 rows (60 %
inserts, 30 % updates, 10 % deletes; benchmarks/source_read.py's workload) over ``--files``
binlog files. Four pipelines, each with one Kafka sink (``exactly_once: true``, 3 partitions):
the log pipelines are placed at the head before the changes, the snapshot pipelines
(``start: snapshot``) take their snapshot on their first run.

Two paths read the same backlog (every count checked against the run report):

- ``in-process``: ``tidegate run`` (guards, bounds, the run with one reader process, release);
- ``spark``: the steps of the DAG without Airflow: guards + bounds in a fresh process,
  ``spark-submit spark_jobs/deliver.py`` on the cluster in client mode (the tidegate zip in
  ``--py-files``, as the deliver operator submits it), the release in a fresh process;
- ``connect``: the same steps with the deliver step a Spark Connect client, as the deliver
  operator runs it (``deliver_remote`` in a fresh process), against the `spark_connect`
  service (``local[2]``; not this cluster): the run's job of one delivery task and a task per
  part.

Printed per path: wall seconds (whole path; for Spark also the spark-submit alone), events/s,
CPU seconds of the processes waited for (for Spark: the driver's side only; executors run under
the workers). Then, from the Spark event log: the executors, how many tasks each ran, the task
cost (duration, run time, scheduler delay, deserialization, result fetch: mean and median), and
how the application's span divides into start-up, tasks running, and the driver alone.
The machine has two cores, shared with the database, Kafka and other work: compare figures
within one run. The log phase (workload and both runs) and the snapshot phase each hold the
integration tests' lock (/tmp/tidegate-it.lock): some tests purge the shared MariaDB's binlogs,
which would take the backlog or a snapshot's handoff away mid-run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fcntl
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SERVICES = ROOT / "scripts" / "services"
sys.path.insert(0, str(ROOT / "include"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from snapshot import COLUMNS_MYSQL, FILL_MYSQL  # noqa: E402
from source_read import mysql_workload  # noqa: E402
from spark_eventlog import read_app, summary  # noqa: E402
from table import measured, run_report  # noqa: E402

PATHS = ("in-process", "spark", "connect", "connect-gathered")
# The deliver task of a Spark Connect pipeline, as a process of its own: what the operator calls.
CONNECT_CHILD = """
import json, sys
from tidegate.connections import get_connection
from tidegate.bounds_step import from_record
from tidegate.spark.connect import connect_url, deliver_remote
from tidegate.store import open_store
pipeline, run_id, package = sys.argv[1:4]
with open_store() as store:
    run = from_record(store, pipeline, run_id).with_store(None)
report = deliver_remote(connect_url(get_connection("spark_connect")), run, py_files=[package])
print("TIDEGATE_RUN_REPORT " + json.dumps(report, default=str))
"""
IT_LOCK = "/tmp/tidegate-it.lock"


# --------------------------------------------------------------------------- the cluster


class Cluster:
    """A two-worker instance of the `spark` service, in a folder of its own."""

    def __init__(self, port: int):
        self.port = port
        self.dir = Path(os.environ["TIDEGATE_SERVICES_DIR"]) / "cluster_bench"
        self.env = {**os.environ, "TIDEGATE_SERVICES_DIR": str(self.dir), "TIDEGATE_SPARK_PORT": str(port),
                    "TIDEGATE_SPARK_WORKERS": "2"}
        self.events = self.dir / "spark" / "events"
        lane = int(os.environ.get("TIDEGATE_LANE") or 0)  # scripts/services moves every port of a lane
        self.master = f"spark://127.0.0.1:{port + 200 * lane}"

    def up(self) -> float:
        t0 = time.perf_counter()
        self._services("up", "spark")
        self.events.mkdir(parents=True, exist_ok=True)
        return time.perf_counter() - t0

    def down(self) -> None:
        self._services("down", "spark")

    def _services(self, *args: str) -> None:
        r = subprocess.run([sys.executable, str(SERVICES), *args], env=self.env, capture_output=True,
                           text=True)
        if r.returncode != 0:
            raise SystemExit(f"scripts/services {' '.join(args)} (cluster_bench) failed:\n{r.stderr[-2000:]}")


def package_zip(folder: Path) -> Path:
    """The tidegate zip the deliver operator ships (tidegate.spark.package)."""
    from tidegate.spark.package import package_zip as build

    return build(folder)


# --------------------------------------------------------------------------- pipelines


def spec_text(name: str, table: str, server_id: int, snapshot: bool, delivery: str | None = None) -> str:
    """``delivery``: the Connect path's ``spark.tidegate.delivery`` (None: no Connect server; a
    spec that names one is delivered through it by `tidegate run` too)."""
    start = "snapshot" if snapshot else "head"
    conf = f"conf: {{spark.tidegate.delivery: {delivery}}}"
    spark = f"spark: {{conn_id: spark_connect, {conf}}}" if delivery else ""
    return textwrap.dedent(f"""\
        pipeline: {name}
        {spark}
        source: {{kind: mysql, conn_id: cdc_mysql, tables: [{table}], server_id: {server_id}, start: {start}}}
        snapshot: {{chunk_rows: 50000, parallelism: 2}}
        sinks:
          - {{id: events, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}",
              exactly_once: true, partitions: 3}}
        """)


class Bench:
    """The benchmark's pipelines (a folder and a checkpoint store of their own) and their runs."""

    def __init__(self, base: Path, cluster: Cluster, db: str):
        self.base, self.cluster, self.db = base, cluster, db
        self.zip = package_zip(base)
        self.env = {**os.environ, "TIDEGATE_PIPELINES_DIR": str(base / "pipelines"),
                    "TIDEGATE_CHECKPOINT_STORE": f"sqlite:///{base / 'store.sqlite'}",
                    "PYTHONPATH": str(ROOT / "include"), "PYSPARK_DRIVER_PYTHON": sys.executable,
                    "SPARK_LOCAL_IP": "127.0.0.1"}
        self.names: list[str] = []

    def pipeline(self, kind: str, path: str, table: str, server_id: int) -> str:
        name = f"cl_{kind}_{path.replace('in-process', 'run').replace('-', '_')}_{self.db[-6:]}"
        (self.base / "pipelines" / f"{name}.yaml").write_text(
            spec_text(name, f"{self.db}.{table}", server_id, kind == "snap",
                      "gathered" if path.endswith("-gathered") else "auto" if path == "connect" else None))
        self.names.append(name)
        return name

    def run(self, path: str, name: str, expected: int | None, snapshot: bool = False) -> dict:
        """One run of ``name`` on ``path``; ``expected``: the events (log) or rows (snapshot) it
        must deliver (a snapshot's run also delivers its control messages to the sink)."""
        r = {"in-process": self.in_process, "spark": self.spark, "connect": self.connect,
             "connect-gathered": self.connect}[path](name)
        got = r["rows"] if snapshot else r["events"]
        if expected is not None:
            assert got == expected, (name, path, got, expected)
        return r

    def in_process(self, name: str) -> dict:
        res = measured([str(BIN / "tidegate"), "run", name], self.env, self.base / f"{name}.log")
        text = res["out"]  # log lines, then the report: a JSON object starting on a line "{"
        report = json.loads(text[text.rfind("\n{\n") + 1:])
        return {"wall": res["wall"], "cpu": res["cpu"], "events": report.get("events", 0),
                "rows": snapshot_rows(text)}

    def spark(self, name: str) -> dict:
        run_id = "bench__" + dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%f")
        t0 = time.perf_counter()
        bounds = self.step("bounds", name, run_id)
        if bounds["nothing_to_do"]:
            return {"wall": time.perf_counter() - t0, "events": 0, "rows": 0}
        before = set(self.cluster.events.iterdir())
        report_file = self.base / f"{name}-{run_id}.json"
        # What the deliver operator adds from a spec's spark.conf, and the event log.
        conf = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": f"file://{self.cluster.events}",
                "spark.eventLog.compress": "false", "spark.ui.enabled": "false",
                "spark.pyspark.python": sys.executable}
        cmd = [str(BIN / "spark-submit"), "--master", self.cluster.master, "--py-files", str(self.zip),
               *(a for k, v in conf.items() for a in ("--conf", f"{k}={v}")),
               str(ROOT / "spark_jobs" / "deliver.py"), "--pipeline", name, "--run-id", run_id,
               "--report-file", str(report_file)]
        submit = measured(cmd, self.env, self.base / f"{name}-submit.log")
        report = run_report(submit["out"])
        self.step("release", name, run_id)
        wall = time.perf_counter() - t0
        logs = [p for p in set(self.cluster.events.iterdir()) - before if not p.name.endswith(".inprogress")]
        assert len(logs) == 1, logs
        driver = {k: v for k, v in report.items() if k.startswith("driver_")}
        return {"wall": wall, "submit_wall": submit["wall"], "cpu": submit["cpu"],
                "events": report.get("events", 0), "rows": snapshot_rows(submit["out"]),
                "plan": bounds["plan"], "driver": driver, "notes": task_notes(submit["out"]),
                "eventlog": summary(read_app(logs[0])), "eventlog_file": str(logs[0])}

    def connect(self, name: str) -> dict:
        """The DAG's steps with a Spark Connect deliver task: bounds, the run's job submitted to
        the `spark_connect` service (the lane's server, not this cluster), release."""
        run_id = "bench__" + dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%f")
        t0 = time.perf_counter()
        bounds = self.step("bounds", name, run_id)
        if bounds["nothing_to_do"]:
            return {"wall": time.perf_counter() - t0, "events": 0, "rows": 0}
        child = measured([sys.executable, "-c", CONNECT_CHILD, name, run_id, str(self.zip)], self.env,
                         self.base / f"{name}-connect.log")
        report = run_report(child["out"])
        self.step("release", name, run_id)
        return {"wall": time.perf_counter() - t0, "submit_wall": child["wall"], "cpu": child["cpu"],
                "events": report.get("events", 0), "rows": snapshot_rows(child["out"]),
                "plan": bounds["plan"], "parts_gathered": report.get("parts_gathered"),
                "task": report.get("delivery_task")}

    def step(self, what: str, name: str, run_id: str) -> dict:
        r = subprocess.run([sys.executable, __file__, "--step", what, name, run_id], env=self.env,
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"{what} of {name} failed:\n{r.stderr[-3000:]}")
        return json.loads(r.stdout.strip().splitlines()[-1])


NOTE = re.compile(r"tidegate: pipeline \S+ slice \S+: (\d+) events in ([\d.]+)s")


def task_notes(log: str) -> list[tuple[int, float]]:
    """(events, seconds) of each log slice a Spark task read, from the notes the driver logs."""
    return [(int(n), float(t)) for n, t in NOTE.findall(log)]


def snapshot_rows(log: str) -> int:
    """The rows a run's snapshots delivered, as its log says ("snapshot ... completed (N rows)")."""
    return sum(int(n) for n in re.findall(r"snapshot \S+ completed \((\d+) rows\)", log))


def step(what: str, pipeline: str, run_id: str) -> dict:
    """Runs in a fresh process: the guards and bounds of a run (as the DAG's first two tasks), or
    its release."""
    from tidegate import bounds_step, catalog, guards, runner
    from tidegate.bounds_step import from_record
    from tidegate.plan import RunPlan
    from tidegate.run import RunContext
    from tidegate.store import open_store

    with open_store() as store:
        if what == "release":
            runner.release(from_record(store, pipeline, run_id))
            return {}
        spec = catalog.find(pipeline)
        plan = RunPlan.from_values({"mode": "incremental"}, sink_ids=[s.id for s in spec.sinks], who="bench")
        run = RunContext(spec, plan, run_id, store=store)
        guards.run_guards(run)
        run = bounds_step.prepare_bounds(run)
        kinds = [type(s).__name__ for s in (run.record.segments or ())] if run.record else []
        return {"nothing_to_do": run.bounds.nothing_to_do(plan.sinks),
                "plan": {k: kinds.count(k) for k in sorted(set(kinds))}}


# --------------------------------------------------------------------------- the workload


def admin_cursor():
    import pymysql
    from tidegate.connections import get_connection

    a = get_connection("cdc_mysql_admin")
    conn = pymysql.connect(host=a.host, port=a.port, user=a.login, password=a.password, database=a.schema,
                           autocommit=True, charset="utf8mb4")
    return conn, conn.cursor()


def fill_snapshot_table(cur, db: str, rows: int) -> None:
    cur.execute(f"CREATE TABLE {db}.snap ({COLUMNS_MYSQL})")
    step_rows = 250_000
    for lo in range(1, rows + 1, step_rows):
        cur.execute(FILL_MYSQL.format(t=f"{db}.snap", db=db, lo=lo, hi=min(rows, lo + step_rows - 1)))


def drop_topics(names: list[str], tables: tuple[str, ...]) -> None:
    from confluent_kafka.admin import AdminClient
    from tidegate.connections import get_connection

    admin = AdminClient({"bootstrap.servers": get_connection("cdc_kafka").extra["bootstrap.servers"]})
    topics = [f"{n}.{t}" for n in names for t in tables]
    for fut in admin.delete_topics(topics, operation_timeout=60).values():
        try:
            fut.result()
        except Exception:  # noqa: BLE001 - a topic never created
            pass


# --------------------------------------------------------------------------- printing


def print_result(label: str, size: int, path: str, r: dict) -> None:
    extra = ""
    if path == "spark":
        extra = f"  (spark-submit {r['submit_wall']:.1f}s; plan {r['plan']})"
    elif path.startswith("connect") and "plan" in r:
        extra = (f"  (deliver task {r['submit_wall']:.1f}s; plan {r['plan']}, {r['parts_gathered']} parts "
                 f"gathered; delivery task {(r['task'] or {}).get('seconds')}s)")
    print(f"  {label:<9} {path:<11} {r['events']:>9,} events {r['wall']:>7.1f}s "
          f"{size / r['wall']:>9,.0f} ev/s  CPU {r.get('cpu', 0):>6.1f}s{extra}", flush=True)


def print_eventlog(label: str, s: dict) -> None:
    print(f"\n{label}: Spark event log of {s['app']} ({s['jobs']} jobs, {s['tasks']} tasks, "
          f"span {s['span_s']:.1f}s)")
    for eid, info in s["executors"].items():
        ran = s["per_executor"].get(eid, {"tasks": 0, "busy_s": 0.0})
        print(f"  executor {eid} on {info['host']} ({info['cores']} core): {ran['tasks']} tasks, "
              f"{ran['busy_s']:.1f}s busy")
    if not s["tasks"]:
        return
    for key, what in (("task_duration_s", "task duration"), ("task_run_s", "  of which run"),
                      ("deserialize_s", "  deserialization"), ("scheduler_delay_s", "  scheduler delay"),
                      ("getting_result_s", "  result fetch")):
        print(f"  {what:<20} mean {s[key]['mean']:7.3f}s  median {s[key]['median']:7.3f}s")
    print(f"  task result mean {s['result_mb_mean']:.1f} MB")
    span = s["span_s"]
    print(f"  span {span:.1f}s = start-up to first task {s['first_task_after_s']:.1f}s "
          f"({s['first_task_after_s'] / span:.0%}) + some task running {s['tasks_running_s']:.1f}s "
          f"({s['tasks_running_s'] / span:.0%}) + driver alone {s['driver_only_s']:.1f}s "
          f"({s['driver_only_s'] / span:.0%}; of it after the last task {s['after_last_task_s']:.1f}s)")


def print_model(label: str, size: int, r: dict) -> None:
    """What N executors with cores of their own would give, from this run's measured costs: each
    executor decodes at the rate its tasks did here (their wall time, overheads included, on
    cores shared with the driver: an upper bound on the cost), the driver delivers at most one
    event per its measured CPU per event (Python driver and JVM each on a core), and every run
    pays the start-up to its first task."""
    s, d = r["eventlog"], r["driver"]
    if not s["tasks"] or d.get("driver_cpu_seconds") is None:
        return
    tasks = s["tasks"]
    per_task = size / tasks  # events (or rows) a task carries, on average
    task_s = s["task_duration_s"]["mean"]
    overhead = s["deserialize_s"]["mean"] + s["scheduler_delay_s"]["mean"] + s["getting_result_s"]["mean"]
    executor_rate = per_task / task_s
    driver_cpu = max(d["driver_cpu_seconds"], d.get("driver_jvm_cpu_seconds") or 0)
    driver_rate = size / driver_cpu
    start = s["first_task_after_s"]
    print(f"\n{label}: model from this run: {tasks} tasks of {per_task:,.0f} on average, {task_s:.2f}s each "
          f"({overhead:.2f}s of it Spark's per-task cost: {overhead / task_s:.0%}) -> {executor_rate:,.0f}/s "
          f"per executor; driver CPU {d['driver_cpu_seconds']:.1f}s (Python) + "
          f"{d.get('driver_jvm_cpu_seconds') or 0:.1f}s (JVM) = {1e6 * driver_cpu / size:.0f} us per event "
          f"on its busier process -> at most {driver_rate:,.0f}/s; start-up to the first task {start:.1f}s")
    for n in (1, 2, 4, 8, 16):
        rate = min(n * executor_rate, driver_rate)
        bound = "driver" if n * executor_rate >= driver_rate else "executors"
        print(f"  {n:>2} executors: {rate:>9,.0f}/s ({bound}-bound), {size:,} in {start + size / rate:6.1f}s")


@contextlib.contextmanager
def servers_held(what: str, hold: bool = True):
    """The integration tests' lock, held while a phase needs the shared MariaDB's binlog to stay:
    some tests purge binary logs (under this lock), which would take a backlog or a snapshot's
    handoff away mid-run. ``hold`` False: not taken (a purge then fails the run, loudly)."""
    if not hold:
        yield
        return
    t0 = time.perf_counter()
    with open(IT_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        print(f"{what}: {IT_LOCK} taken after {time.perf_counter() - t0:.0f}s", flush=True)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--changes", type=int, default=1_000_000)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the snapshot table")
    ap.add_argument("--files", type=int, default=4, help="binlog files the changes span")
    ap.add_argument("--only", choices=("log", "snapshot"))
    ap.add_argument("--paths", default=",".join(PATHS), help=f"of {', '.join(PATHS)} (in-process first)")
    ap.add_argument("--warm", action="store_true",
                    help="deliver 10 changes on each path before the backlog (a pipeline's kept session)")
    ap.add_argument("--port", type=int, default=7177, help="the cluster's master port")
    ap.add_argument("--keep-cluster", action="store_true")
    ap.add_argument("--no-lock", action="store_true",
                    help=f"do not wait for {IT_LOCK} (when the tests' queue is long; a purge fails the run)")
    ap.add_argument("--step", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.step:
        print(json.dumps(step(*args.step)))
        return 0

    subprocess.run([sys.executable, str(SERVICES), "up", "mysql", "kafka"], check=True, capture_output=True)
    cluster = Cluster(args.port)
    load0 = os.getloadavg()
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{started}: load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, {os.cpu_count()} CPUs "
          f"(shared with the servers and other work)", flush=True)
    print(f"cluster {cluster.master}: two workers of one core each, up in {cluster.up():.1f}s", flush=True)
    base = Path(tempfile.mkdtemp(prefix="tidegate-cluster-"))
    (base / "pipelines").mkdir()
    db = "bench_cl_" + uuid.uuid4().hex[:6]
    conn, cur = admin_cursor()
    cur.execute(f"CREATE DATABASE {db}")
    bench = Bench(base, cluster, db)
    results: dict = {}
    try:
        cur.execute(f"CREATE TABLE {db}.bench ({COLUMNS_MYSQL})")
        if args.only in (None, "snapshot"):
            t0 = time.perf_counter()
            fill_snapshot_table(cur, db, args.rows)
            print(f"snapshot table: {args.rows:,} rows in {time.perf_counter() - t0:.0f}s", flush=True)
        if args.only in (None, "log"):
            log_phase(bench, cur, db, args, results)
        if args.only in (None, "snapshot"):
            with servers_held("snapshot", not args.no_lock):
                for i, path in enumerate(args.paths.split(",")):
                    name = bench.pipeline("snap", path, "snap", 48710 + i)
                    results[("snapshot", path)] = r = bench.run(path, name, args.rows, snapshot=True)
                    print_result("snapshot", args.rows, path, r)
    finally:
        cur.execute(f"DROP DATABASE IF EXISTS {db}")
        conn.close()
        drop_topics(bench.names, ("bench", "snap", "__control"))
        if not args.keep_cluster:
            cluster.down()
    print_summary(args, results, load0)
    print(f"logs in {base}")
    return 0


def log_phase(bench: Bench, cur, db: str, args: argparse.Namespace, results: dict) -> None:
    log_pipes = {p: bench.pipeline("log", p, "bench", 48700 + i) for i, p in enumerate(args.paths.split(","))}
    with servers_held("log", not args.no_lock):
        for path, name in log_pipes.items():  # placed at the head: nothing to read yet
            bench.run(path, name, 0)
        if args.warm:  # a run of a few changes first: the Connect session and its worker up
            warm = [(-i,) for i in range(1, 11)]
            cur.executemany(f"INSERT INTO {db}.bench (id, customer) VALUES (%s, 1)", warm)
            for path, name in log_pipes.items():
                bench.run(path, name, 10)
        t0 = time.perf_counter()
        mysql_workload(cur, db, args.changes, 10, args.files, lambda: cur.execute("FLUSH BINARY LOGS"))
        print(f"log: {args.changes:,} row changes written in {time.perf_counter() - t0:.0f}s", flush=True)
        for path, name in log_pipes.items():
            results[("log", path)] = r = bench.run(path, name, args.changes)
            print_result("log", args.changes, path, r)


def print_summary(args: argparse.Namespace, results: dict, load0: tuple) -> None:
    load1 = os.getloadavg()
    print("\nsummary (one run, same backlog; the machine's 2 cores are shared):")
    for (kind, path), r in results.items():
        size = args.changes if kind == "log" else args.rows
        print_result(kind, size, path, r)
    for kind in ("log", "snapshot"):
        for path in PATHS[1:]:
            if (kind, path) in results:
                a, b = results[(kind, "in-process")], results[(kind, path)]
                print(f"  {kind}: {path} / in-process wall = {b['wall'] / a['wall']:.2f}, events/s "
                      f"{a['wall'] / b['wall']:.2f}x (deliver step alone {b['submit_wall'] / a['wall']:.2f})")
    for kind in ("log", "snapshot"):
        if (kind, "spark") in results:
            r = results[(kind, "spark")]
            print_eventlog(kind, r["eventlog"])
            d = r["driver"]
            print(f"  driver: run {d.get('driver_run_seconds')}s, CPU {d.get('driver_cpu_seconds')}s "
                  f"(Python) + {d.get('driver_jvm_cpu_seconds')}s (JVM)")
            if r["notes"]:
                events, seconds = sum(n for n, _ in r["notes"]), sum(t for _, t in r["notes"])
                print(f"  slices: {len(r['notes'])}, {events / len(r['notes']):,.0f} events each on average, "
                      f"{1e6 * seconds / events:.0f} us per event in the task's own reading")
            print_model(kind, args.changes if kind == "log" else args.rows, r)
    print(f"\nload average at start {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, "
          f"at end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
