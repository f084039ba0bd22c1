"""Where a Spark Connect run's CPU goes: the deliver task's process against the server's
processes, for a run delivered by the deliver task (``spark.tidegate.delivery: client``, the
shape before) and by one Spark task (``executor``, the default for a plan of one log slice).

    PATH="$PWD/.venv/bin:$PATH" .venv/bin/python benchmarks/delivery_split.py \\
        [--events 200000] [--source mysql|postgres] [--repeats 1] [--modes client,executor] \\
        [--python-daemons pyspark.daemon,tidegate.spark.daemon]

``--python-daemons``: the ``spark_connect`` server is restarted with each Python daemon module in
turn (``spark.python.daemon.module``; PySpark's own, or tidegate's, which imports the engine
before it forks a worker), and each run's row says which, with the delivery task's own seconds
and whether its worker had the engine imported when the task began. Every run is a new pipeline,
so a new session and a new daemon: its task runs in the daemon's first worker.

One table (id, v, s VARCHAR(40)), ``--events`` inserts in transactions of 1,000 rows, one Kafka
exactly-once sink. For each mode, a pipeline of its own is placed at the head, the rows are
written, and the run is delivered by a fresh child process (what the Airflow deliver task does:
``spark.connect.deliver_remote`` with the run's record; the Airflow task SDK's own import, the
same in both modes, is not in it). Measured per run:

* the child's CPU seconds (user + system, with its own children: the reader process when the
  child reads);
* the server's CPU seconds: for a run delivered by a Spark task, the JVM's own (from /proc,
  before and after) plus what the task measured of itself and its reader process where it ran;
  otherwise the server's whole process tree (the JVM and the Python workers that read the parts);
* the child's share of the two, and the wall time.

The servers: ``scripts/services up mysql postgres kafka spark_connect`` (the ``spark_connect``
server on ``local[2]``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

from servers import admin_connection, services, services_env  # benchmarks/servers.py

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "include"))

CHILD = """
import json, os, resource, sys, time
from tidegate.bounds_step import from_record
from tidegate.spark.connect import connect_url, deliver_remote
from tidegate.spark.package import package_zip
from tidegate.connections import get_connection
from tidegate.store import open_store
pipeline, run_id = sys.argv[1], sys.argv[2]
t0 = time.monotonic()
with open_store() as store:
    run = from_record(store, pipeline, run_id).with_store(None)
report = deliver_remote(connect_url(get_connection("spark_connect")), run, py_files=[str(package_zip())])
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
task = report.get("delivery_task") or {}
print(json.dumps({"events": report.get("events"), "delivered_by": report.get("delivered_by") or "client",
                  "parts_gathered": report.get("parts_gathered", 0),
                  "wall": time.monotonic() - t0, "task_cpu": task.get("cpu_seconds"), "task": task,
                  "cpu": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime}))
"""


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its descendants (user + system, with each live process's
    ended and reaped children: a delivery task's reader process after it ended)."""
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry.name)] = fields
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        if p in stats:
            total += sum(int(v) for v in stats[p][11:15])
        todo += children.get(p, [])
    return total / os.sysconf("SC_CLK_TCK")


def own_cpu(pid: int) -> float:
    """CPU seconds of the process ``pid`` itself (user + system; the server's JVM)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_pid(env: dict) -> int:
    pid_file = Path(env["TIDEGATE_SERVICES_DIR"]) / "spark_connect" / "pid"
    if not pid_file.exists():
        raise SystemExit("the spark_connect service is not up: scripts/services up spark_connect")
    return int(pid_file.read_text().split()[0])


def write_rows(source: str, env: dict, schema: str, events: int) -> None:
    conn = admin_connection(source, env)
    with conn.cursor() as c:
        for i in range(0, events, 1000):
            rows = ", ".join(f"({j}, {j % 97}, 'status-{j % 13}-padding-padding')"
                             for j in range(i, min(events, i + 1000)))
            c.execute(f"INSERT INTO {schema}.t VALUES {rows}")
    conn.close()


def setup(source: str, env: dict, name: str) -> str:
    """A schema and table of its own; returns the spec's source line."""
    from tidegate.connections import get_connection

    conn = admin_connection(source, env)
    with conn.cursor() as c:
        if source == "mysql":
            c.execute(f"CREATE DATABASE {name}")
            c.execute(f"CREATE TABLE {name}.t (id INT PRIMARY KEY, v INT, s VARCHAR(40))")
        else:
            cdc = get_connection("cdc_postgres", env)
            c.execute(f"CREATE SCHEMA {name}")
            c.execute(f"CREATE TABLE {name}.t (id INT PRIMARY KEY, v INT, s VARCHAR(40))")
            c.execute(f"GRANT USAGE ON SCHEMA {name} TO {cdc.login}")
            c.execute(f"GRANT SELECT ON {name}.t TO {cdc.login}")
            # the slot, as a first run's guard creates it
            c.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (name,))
    conn.close()
    if source == "mysql":
        return f"{{kind: mysql, conn_id: cdc_mysql, tables: [{name}.t], server_id: 47700, start: head}}"
    return f"{{kind: postgres, conn_id: cdc_postgres, tables: [{name}.t], slot: {name}, start: head}}"


def one_run(mode: str, source: str, events: int, env: dict, base: Path, server: int) -> dict:
    from tidegate import bounds_step
    from tidegate.run import RunContext
    from tidegate.spec import load_spec
    from tidegate.store import open_store

    name = f"split_{mode}_{uuid.uuid4().hex[:6]}"
    spec_path = base / f"{name}.yaml"
    spec_path.write_text(textwrap.dedent(f"""\
        pipeline: {name}
        source: {setup(source, env, name)}
        batch: {{max_events: 20000}}
        spark: {{conn_id: spark_connect, conf: {{spark.tidegate.delivery: {mode}}}}}
        sinks:
          - {{id: k, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}", exactly_once: true}}
        """))
    spec = load_spec(str(spec_path))
    with open_store() as store:
        bounds_step.prepare_bounds(RunContext(spec, run_id="place", store=store))
        write_rows(source, env, name, events)
        bounds_step.prepare_bounds(RunContext(spec, run_id="r1", store=store))
    before, jvm_before = tree_cpu(server), own_cpu(server)
    out = subprocess.run([sys.executable, "-c", CHILD, name, "r1"], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if got["task_cpu"] is not None and not got["parts_gathered"]:  # the task measured itself
        got["server_cpu"] = own_cpu(server) - jvm_before + got["task_cpu"]
    else:  # Spark tasks read parts: the server's process tree (its Python workers come and go)
        got["server_cpu"] = tree_cpu(server) - before
    got["share"] = got["cpu"] / (got["cpu"] + got["server_cpu"])
    got["mode"] = mode
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--source", choices=("mysql", "postgres"), default="mysql")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--modes", default="client,executor", help="spark.tidegate.delivery values, in turn")
    ap.add_argument("--python-daemons", default="", help="restart the server with each daemon module")
    a = ap.parse_args()
    env = dict(os.environ, **services_env())
    base = Path(f"/tmp/tidegate-split-{uuid.uuid4().hex[:6]}")
    base.mkdir()
    env["TIDEGATE_CHECKPOINT_STORE"] = f"sqlite:///{base / 'store.sqlite'}"
    os.environ.update(env)
    server = server_pid(env)
    print(f"{a.events} changes, {a.source} -> Kafka exactly-once, Spark Connect server pid "
          f"{server}; load average {os.getloadavg()[0]:.1f}")
    print("| Python daemon | delivered by | events | wall s | deliver task CPU s | server CPU s "
          "| deliver task share | Spark task s | its worker warm |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for daemon in a.python_daemons.split(",") if a.python_daemons else [None]:
        if daemon:  # the server again, with this daemon module
            services("down", "spark_connect")
            services("up", "spark_connect", env=dict(os.environ, TIDEGATE_SPARK_PYTHON_DAEMON=daemon))
            server = server_pid(env)
        for _ in range(a.repeats):
            for mode in a.modes.split(","):
                print_row(daemon, one_run(mode, a.source, a.events, env, base, server))
                time.sleep(1)


def print_row(daemon: str | None, r: dict) -> None:
    task = r.get("task") or {}
    shape = r["delivered_by"] + (f", {r['parts_gathered']} parts gathered" if r.get("parts_gathered") else "")
    print(f"| {daemon or 'as the server has it'} | {r['mode']}: {shape} | {r['events']} | {r['wall']:.1f} "
          f"| {r['cpu']:.2f} | {r['server_cpu']:.2f} | {100 * r['share']:.1f} % "
          f"| {task.get('seconds', '-')} | {task.get('worker_warm', '-')} |", flush=True)


if __name__ == "__main__":
    main()
