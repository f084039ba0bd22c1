"""One table, one run: the source read, `tidegate run` to Kafka (at-least-once and exactly-once)
and the DAG path through `airflow dags test` (Spark local[2], Kafka exactly-once), for MariaDB
and PostgreSQL, at two backlog sizes.

    export TIDEGATE_..._PORT=...   # the servers' ports, as for the tests
    .venv/bin/python benchmarks/table.py [--sizes 200000,1000000] [--only mysql|postgres]

Workload (as benchmarks/source_read.py): row changes of an 11-column table in transactions of
10 rows (60 % inserts, 30 % updates, 10 % deletes). A MariaDB backlog spans one binlog file per
``--rows-per-file`` changes (50k by default: the per-file slices Spark decodes in parallel).
Every consumer of a backlog is its own pipeline placed at the binlog/slot head before the
workload, so they all read the same range:

- ``read``: the source's ``read`` in a fresh process (MariaDB: the fast decoder), each event
  built and serialized as a run does, nothing delivered;
- ``run ALO`` / ``run EOS``: ``tidegate run`` (guards, bounds, the run, release) to one Kafka
  sink, idempotent producer / ``exactly_once: true``, in a fresh process;
- ``DAG EOS``: ``airflow dags test`` of the pipeline's DAG (guard, bounds, deliver through
  spark-submit, release, report), Kafka exactly-once; the figures are the deliver task's.

Columns: events/s over the wall time (the deliver task's for the DAG path), CPU seconds of the
process and the children it waited for, peak RSS (``run``/``read``: the process; DAG path: the
Python driver and, apart, the driver's JVM, which in local mode also runs the executors). Then
the checks: the DAG path's deliver time against the `tidegate run` EOS time plus Spark's start
(a trivial spark-submit measured in this run), the most Spark tasks the event log shows running
at once, and the driver's peak RSS at the largest size against the smallest. Figures are noisy
on a shared 2-core machine: compare them as ratios within one run; the load average is printed
at the start and the end.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "include"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from dag_run import airflow_env, task_times  # noqa: E402
from source_read import COLUMNS_MYSQL, COLUMNS_PG, mysql_workload, postgres_workload, run_child  # noqa: E402
from tidegate.connections import get_connection  # noqa: E402

MB = 1024 * 1024


# --------------------------------------------------------------------------- measuring


def measured(cmd: list[str], env: dict[str, str], log: Path) -> dict:
    """Run ``cmd``; its wall time, the CPU seconds and peak RSS of it and the children it waited
    for (``wait4``), and its output (kept in ``log``)."""
    with open(log, "w+b") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} failed (exit {proc.returncode}); log in {log}")
    return {"wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "rss_mb": ru.ru_maxrss / 1024, "out": text}


def spark_start(env: dict[str, str], base: Path) -> float:
    """Seconds of a trivial spark-submit on local[2]: the JVM, the SparkContext, a Python worker
    and one tiny job; what every DAG path run pays before reading."""
    app = base / "spark_start.py"
    app.write_text("from pyspark.sql import SparkSession\n"
                   "s = SparkSession.builder.getOrCreate()\n"
                   "s.sparkContext.parallelize([1, 2], 2).count()\n"
                   "s.stop()\n")
    return measured([str(BIN / "spark-submit"), "--master", "local[2]", str(app)],
                    {**env, "PYSPARK_PYTHON": sys.executable}, base / "spark_start.log")["wall"]


def max_tasks_at_once(event_log: Path) -> int:
    edges = []
    for path in event_log.rglob("*"):
        if not path.is_file() or path.name.startswith((".", "appstatus")):
            continue
        for line in path.read_text(errors="replace").splitlines():
            if '"SparkListenerTaskEnd"' in line:
                info = json.loads(line)["Task Info"]
                edges += [(info["Launch Time"], 1), (info["Finish Time"], -1)]
    running = most = 0
    for _, step in sorted(edges):
        running += step
        most = max(most, running)
    return most


def run_report(log: str) -> dict:
    lines = [ln for ln in log.splitlines() if "TIDEGATE_RUN_REPORT " in ln]
    if not lines:
        raise SystemExit("the deliver task printed no run report")
    # The driver's line, as the task log shows it (Airflow may add fields after it).
    return json.JSONDecoder().raw_decode(lines[-1].split("TIDEGATE_RUN_REPORT ", 1)[1])[0]


# --------------------------------------------------------------------------- one backlog


class Backlog:
    """The pipelines that consume one backlog, placed at the head before it is written."""

    def __init__(self, base: Path, source: str, size: int, env: dict[str, str], driver_memory: str | None):
        self.base, self.source, self.size, self.env = base, source, size, env
        self.driver_memory = driver_memory
        self.tag = f"{source[:2]}{size // 1000}k_{uuid.uuid4().hex[:4]}"
        self.where = f"bench_{self.tag}"  # MariaDB database / Postgres schema
        self.pipelines = {k: f"b_{k}_{self.tag}" for k in ("alo", "eos", "dag")}
        self.events_log = base / f"events_{self.tag}"
        self.events_log.mkdir()

    def spec(self, key: str, server_id: int) -> str:
        name = self.pipelines[key]
        if self.source == "mysql":
            src = (f"{{kind: mysql, conn_id: cdc_mysql, tables: [{self.where}.bench], "
                   f"server_id: {server_id}, start: head}}")
        else:
            src = (f"{{kind: postgres, conn_id: cdc_postgres, tables: [{self.where}.bench], slot: {name}, "
                   f"start: head}}")
        spark = ""
        if key == "dag":
            memory = f", spark.driver.memory: {self.driver_memory}" if self.driver_memory else ""
            spark = textwrap.dedent(f"""\
                spark:
                  conf: {{spark.eventLog.enabled: "true", spark.eventLog.dir: "file://{self.events_log}",
                         spark.eventLog.compress: "false", spark.ui.enabled: "false"{memory}}}
                """)
        return textwrap.dedent(f"""\
            pipeline: {name}
            source: {src}
            sinks:
              - {{id: events, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}",
                  exactly_once: {'false' if key == 'alo' else 'true'}, partitions: 3}}
            """) + spark

    def place(self) -> None:
        for i, key in enumerate(("alo", "eos", "dag")):
            (self.base / "pipelines" / f"{self.pipelines[key]}.yaml").write_text(self.spec(key, 48600 + i))
        for key in ("alo", "eos"):
            measured([str(BIN / "tidegate"), "run", self.pipelines[key]], self.env,
                     self.base / f"place_{key}_{self.tag}.log")
        measured([str(BIN / "airflow"), "dags", "test", f"cdc_{self.pipelines['dag']}"], self.env,
                 self.base / f"place_dag_{self.tag}.log")

    def run(self, key: str) -> dict:
        res = measured([str(BIN / "tidegate"), "run", self.pipelines[key]], self.env,
                       self.base / f"run_{key}_{self.tag}.log")
        text = res["out"]  # log lines, then the report: a JSON object starting on a line "{"
        report = json.loads(text[text.rfind("\n{\n") + 1:])
        assert report["events"] == self.size, (key, report["events"], self.size)
        return {**res, "events": report["events"]}

    def dag(self) -> dict:
        res = measured([str(BIN / "airflow"), "dags", "test", f"cdc_{self.pipelines['dag']}"], self.env,
                       self.base / f"dag_{self.tag}.log")
        times = task_times(res["out"])
        report = run_report(res["out"])
        assert report["events"] == self.size, (report["events"], self.size)
        return {"wall": times["deliver"], "dag_wall": res["wall"], "cpu": res["cpu"],
                "rss_mb": (report.get("driver_peak_rss_bytes") or 0) / MB,
                "jvm_mb": (report.get("driver_jvm_peak_rss_bytes") or 0) / MB,
                "events": report["events"], "tasks_at_once": max_tasks_at_once(self.events_log)}


def drop_topics(b: Backlog) -> None:
    """The backlog's topics: a 1M-change backlog is about a gigabyte per pipeline in Kafka."""
    from confluent_kafka.admin import AdminClient

    kafka = get_connection("cdc_kafka")
    admin = AdminClient({"bootstrap.servers": kafka.extra["bootstrap.servers"]})
    topics = [f"{name}.bench" for name in b.pipelines.values()]
    for fut in admin.delete_topics(topics, operation_timeout=60).values():
        try:
            fut.result()
        except Exception:  # noqa: BLE001 - a topic that was never created
            pass


def mariadb(base: Path, size: int, rows_per_file: int, env: dict[str, str], rows: list,
            driver_memory: str | None) -> dict:
    import pymysql
    from tidegate.sources.mysql.source import MySqlSource
    from tidegate.spec import PipelineSpec, SourceSpec

    a = get_connection("cdc_mysql_admin")
    admin = pymysql.connect(host=a.host, port=a.port, user=a.login, password=a.password, database=a.schema,
                            autocommit=True, charset="utf8mb4")
    cur = admin.cursor()
    b = Backlog(base, "mysql", size, env, driver_memory)
    cur.execute(f"CREATE DATABASE {b.where}")
    try:
        cur.execute(f"CREATE TABLE {b.where}.bench ({COLUMNS_MYSQL})")
        b.place()
        spec = PipelineSpec(pipeline="bench", sinks=(), source=SourceSpec(
            kind="mysql", conn_id="cdc_mysql", tables=(f"{b.where}.bench",), server_id=48699))
        src = MySqlSource(spec, get_connection("cdc_mysql"))
        start = src.head()
        t0 = time.perf_counter()
        mysql_workload(cur, b.where, size, 10, max(1, size // rows_per_file),
                       lambda: cur.execute("FLUSH BINARY LOGS"))
        upto = src.head()
        files = len(src.slices(start, upto))
        src.close()
        print(f"mariadb {size}: wrote in {time.perf_counter() - t0:.0f}s, {files} binlog files", flush=True)
        return measure_all(b, rows, lambda: run_child(
            {"source": "mysql", "db": b.where, "decoder": "fast", "start": start.to_json(),
             "upto": upto.to_json()}, size), f"MariaDB {files} files")
    finally:
        cur.execute(f"DROP DATABASE IF EXISTS {b.where}")
        admin.close()
        drop_topics(b)


def postgres(base: Path, size: int, env: dict[str, str], rows: list, driver_memory: str | None) -> dict:
    import psycopg2
    from tidegate.sources.postgres.source import PostgresSource
    from tidegate.spec import PipelineSpec, SourceSpec

    a = get_connection("cdc_postgres_admin")
    admin = psycopg2.connect(host=a.host, port=a.port, dbname=a.schema, user=a.login, password=a.password)
    admin.autocommit = True
    cur = admin.cursor()
    b = Backlog(base, "postgres", size, env, driver_memory)
    slot = f"{b.where}_read"
    cur.execute(f"CREATE SCHEMA {b.where}")
    src = PostgresSource(PipelineSpec(pipeline="bench", sinks=(), source=SourceSpec(
        kind="postgres", conn_id="cdc_postgres", tables=(f"{b.where}.bench",), slot=slot)),
        get_connection("cdc_postgres"))
    try:
        cur.execute(f"CREATE TABLE {b.where}.bench ({COLUMNS_PG})")
        cur.execute(f"ALTER TABLE {b.where}.bench REPLICA IDENTITY FULL")
        b.place()
        src.replication_slot.ensure()
        start = src.head()
        t0 = time.perf_counter()
        postgres_workload(cur, b.where, size)
        upto = src.head()
        print(f"postgres {size}: wrote in {time.perf_counter() - t0:.0f}s", flush=True)
        return measure_all(b, rows, lambda: run_child(
            {"source": "postgres", "schema": b.where, "slot": slot, "decoder": "fast",
             "start": start.to_json(), "upto": upto.to_json()}, size), "PostgreSQL")
    finally:
        try:
            src.replication_slot.drop()
        finally:
            src.close()
            cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                        f"WHERE slot_name LIKE 'b\\_%\\_{b.tag}'")
            cur.execute(f"DROP SCHEMA IF EXISTS {b.where} CASCADE")
            admin.close()
            drop_topics(b)


def measure_all(b: Backlog, rows: list, read, label: str) -> dict:
    out = {"read": read()}
    out["read"]["events"] = b.size
    for key in ("alo", "eos"):
        out[key] = b.run(key)
    out["dag"] = b.dag()
    for key, name in (("read", "read"), ("alo", "run ALO"), ("eos", "run EOS"), ("dag", "DAG EOS")):
        rows.append((label, b.size, name, out[key]))
        r = out[key]
        print(f"  {name:<8} {b.size / r['wall']:>9,.0f} events/s  {r['wall']:6.1f}s", flush=True)
    return out


# --------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="200000,1000000")
    ap.add_argument("--rows-per-file", type=int, default=50_000)
    ap.add_argument("--only", choices=("mysql", "postgres"))
    ap.add_argument("--keep", action="store_true", help="keep the logs and the Airflow home")
    ap.add_argument("--driver-memory", help="spark.driver.memory of the DAG path (default: Spark's, 1g)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    base = Path(tempfile.mkdtemp(prefix="tidegate-table-"))
    (base / "pipelines").mkdir()
    env = airflow_env(base)
    env["AIRFLOW__LOGGING__LOGGING_LEVEL"] = "INFO"  # the task lines the DAG path is timed by
    subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True)
    load0 = os.getloadavg()
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{started}: load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, {os.cpu_count()} CPUs",
          flush=True)
    start_s = spark_start(env, base)
    print(f"Spark start (trivial spark-submit, local[2]): {start_s:.1f}s", flush=True)
    rows: list = []
    results: dict = {}
    try:
        for size in sizes:
            if args.only in (None, "mysql"):
                results[("mysql", size)] = mariadb(base, size, args.rows_per_file, env, rows,
                                                   args.driver_memory)
            if args.only in (None, "postgres"):
                results[("postgres", size)] = postgres(base, size, env, rows, args.driver_memory)
    finally:
        load1 = os.getloadavg()
        print_table(rows, start_s, results, sizes, started, load0, load1)
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
        else:
            print(f"logs in {base}")
    return 0


def print_table(rows: list, start_s: float, results: dict, sizes: list[int], started: str,
                load0: tuple, load1: tuple) -> None:
    print()
    print(f"{'source':<20} {'changes':>9} {'path':<8} {'events/s':>10} {'wall s':>8} {'CPU s':>8} "
          f"{'peak RSS MB':>12}  notes")
    for label, size, name, r in rows:
        notes = ""
        if name == "DAG EOS":
            notes = (f"RSS: Python driver; its JVM {r['jvm_mb']:.0f} MB; CPU: whole dags test "
                     f"({r['dag_wall']:.0f}s); {r['tasks_at_once']} Spark task(s) at once")
        print(f"{label:<20} {size:>9,} {name:<8} {size / r['wall']:>10,.0f} {r['wall']:>8.1f} "
              f"{r['cpu']:>8.1f} {r['rss_mb']:>12.0f}  {notes}")
    print(f"\nSpark start: {start_s:.1f}s. Load average at start {load0[0]:.2f} {load0[1]:.2f} "
          f"{load0[2]:.2f}, at end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} (2 CPUs); started {started}.")
    for source in ("mysql", "postgres"):
        have = [s for s in sizes if (source, s) in results]
        if not have:
            continue
        big, small = results[(source, have[-1])], results[(source, have[0])]
        d, e = big["dag"], big["eos"]
        print(f"{source} {have[-1]:,}: DAG deliver {d['wall']:.1f}s / (run EOS {e['wall']:.1f}s + Spark "
              f"start {start_s:.1f}s) = {d['wall'] / (e['wall'] + start_s):.2f}; {d['tasks_at_once']} Spark "
              f"task(s) at once; driver peak RSS {d['rss_mb']:.0f} MB (JVM {d['jvm_mb']:.0f} MB) vs "
              f"{small['dag']['rss_mb']:.0f} MB (JVM {small['dag']['jvm_mb']:.0f} MB) at {have[0]:,}: "
              f"{d['rss_mb'] / small['dag']['rss_mb']:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
