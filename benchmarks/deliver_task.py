"""Where a small run's deliver task spends its time: spark-submit against Spark Connect.

    export TIDEGATE_..._PORT=...   # the servers' ports, as for the tests
    .venv/bin/python benchmarks/deliver_task.py [--repeat 3]

One MariaDB table, one Kafka exactly-once sink; three pipelines on it, all placed at the head,
then the same changes for each: one event (one slice), and one event in each of two binlog
files (two slices, which Spark tasks decode). Prints:

1. ``airflow dags test``, per run: the deliver task's seconds ("[DAG TEST] starting" to "end
   task") with spark-submit (the default ``spark_default``, local[2]) and as a Spark Connect
   client of the ``spark_connect`` service, and the session's own timings from the task's
   report;
2. the connect-mode deliver task phase by phase, in one fresh process as a task process has
   it: importing Airflow's task SDK and the deliver operator, reading the run's record, opening
   the Connect session, shipping the package, registering the data source, reading the range
   (the slices as Spark tasks; reading streams into delivery, so it is what is left of the run
   once delivering and committing are taken out), delivering to the sink, committing the
   checkpoints.

The ``spark_connect`` service is started if it is not up (and left up). The machine is shared:
compare figures of one run, not across runs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "include"))
sys.path.insert(0, str(ROOT))

from benchmarks.dag_run import BIN, airflow_env, dags_test, services  # noqa: E402

TIMINGS = re.compile(r"Spark Connect session (\w+)[^;]*; timings (\{[^}]*\})")

PHASES = textwrap.dedent("""\
    import json, os, sys, time
    t_start = time.perf_counter()
    out = {}
    def phase(name, fn):
        t0 = time.perf_counter()
        value = fn()
        out[name] = out.get(name, 0.0) + time.perf_counter() - t0
        return value
    def timed(cls, method, name):
        # Wraps a method of the code under measurement (a benchmark, not a test): its seconds add up.
        original = getattr(cls, method)
        def wrapper(*a, **kw):
            return phase(name, lambda: original(*a, **kw))
        setattr(cls, method, wrapper)
    phase("import Airflow's task SDK", lambda: __import__("airflow.sdk.execution_time.task_runner"))
    phase("import the deliver operator", lambda: __import__("tidegate_airflow.operators.deliver"))
    from tidegate import coordinator
    from tidegate.parts import Parts
    from tidegate.bounds_step import from_record
    from tidegate.spark import chunks, job, session
    from tidegate.store import default_url, open_store
    from tidegate.runner import run_pipeline
    store = phase("open the store, read the run record", open_store)
    run = phase("open the store, read the run record", lambda: from_record(store, sys.argv[1], sys.argv[2]))
    lazy = session.LazySession(sys.argv[3], "tidegate-bench", {}, [sys.argv[4]])
    reader = job.SparkReader(lazy, run.parts.connection(run.spec.source.conn_id), default_url())
    from tidegate.spark import slices
    timed(slices, "register_task_source", "register the data source")
    timed(chunks, "register_task_source", "register the data source")
    timed(coordinator.Coordinator, "_deliver_all", "deliver (sinks)")
    timed(coordinator.Coordinator, "_commit", "commit (checkpoints)")
    t0 = time.perf_counter()
    report = run_pipeline(run.with_store(store), reader=reader)
    out["run_pipeline (all of it)"] = time.perf_counter() - t0
    # Reading streams into delivery (the range is read as it is delivered): what is left of the
    # run once the sinks' and the store's seconds are taken out is the read, the bounds checks,
    # opening the source and the sinks.
    out["read, open source and sinks (the rest)"] = out["run_pipeline (all of it)"] - sum(
        out.get(k, 0.0) for k in ("deliver (sinks)", "commit (checkpoints)", "register the data source"))
    lazy.stop()
    out.update({f"session: {k}": v for k, v in lazy.timings.items()})
    out["total in this process"] = time.perf_counter() - t_start
    out["events"] = report["events"]
    print(json.dumps(out))
    """)


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=2, help="runs per mode and shape")
    args = ap.parse_args()
    import pymysql
    from tidegate.connections import get_connection

    services("up", "mysql", "kafka", "spark_connect")
    senv = {}
    for line in services("env").splitlines():
        k, _, v = line.removeprefix("export ").partition("=")
        senv[k] = shlex.split(v)[0]
    os.environ.update(senv)
    base = Path(tempfile.mkdtemp(prefix="tidegate-bench-deliver-"))
    (base / "pipelines").mkdir()
    tag = uuid.uuid4().hex[:6]
    db = f"bench_{tag}"
    pipelines = {"submit": f"bench_sub_{tag}", "connect": f"bench_con_{tag}", "phases": f"bench_ph_{tag}"}
    for i, (mode, name) in enumerate(pipelines.items()):
        spark = "" if mode == "submit" else "spark: {conn_id: spark_connect}"
        (base / "pipelines" / f"{name}.yaml").write_text(textwrap.dedent(f"""
            pipeline: {name}
            source: {{kind: mysql, conn_id: cdc_mysql, tables: [{db}.t], server_id: {48600 + i}, start: head}}
            sinks:
              - {{id: events, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}",
                  exactly_once: true}}
        """) + spark + "\n")
    env = airflow_env(base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "include"), os.environ.get("PYTHONPATH")) if p)
    subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True)
    admin = get_connection("cdc_mysql_admin")
    conn = pymysql.connect(host=admin.host, port=admin.port, user=admin.login, password=admin.password,
                           autocommit=True)
    sc_url = senv["TIDEGATE_SPARK_CONNECT_URL"]
    sys.path.insert(0, str(ROOT / "plugins"))
    from tidegate.spark.package import package_zip

    zip_path = str(package_zip())
    print(f"load average {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs; machine shared with "
          f"other work")
    key = 0

    def change(slices: int) -> None:
        nonlocal key
        with conn.cursor() as c:
            for s in range(slices):
                if s:
                    c.execute("FLUSH BINARY LOGS")
                key += 1
                c.execute(f"INSERT INTO {db}.t VALUES (%s, 'x')", (key,))

    try:
        with conn.cursor() as c:
            c.execute(f"CREATE DATABASE {db}")
            c.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(40))")
        for name in pipelines.values():  # place the sinks at the head
            dags_test(env, f"cdc_{name}", base, f"{name}-first")
        print("1. airflow dags test: the deliver task's seconds")
        for slices in (1, 2):
            for attempt in range(args.repeat):
                change(slices)
                line = []
                for mode in ("submit", "connect"):
                    total, times, log = dags_test(env, f"cdc_{pipelines[mode]}", base, f"{mode}-{slices}")
                    found = TIMINGS.search(log)
                    extra = f" (session {found.group(1)}, {found.group(2)})" if found else ""
                    line.append(f"{mode} deliver {times.get('deliver', float('nan')):5.2f}s{extra}")
                print(f"   {slices} slice(s), run {attempt + 1}: " + "  |  ".join(line), flush=True)
        print("2. the connect-mode deliver task phase by phase (one fresh process)")
        from tidegate import catalog
        from tidegate.plan import RunPlan
        from tidegate.run import RunContext
        from tidegate.runner import prepare_bounds
        from tidegate.store import open_store

        os.environ.update({k: v for k, v in env.items() if k.startswith("TIDEGATE_")})
        # The first run catches the pipeline up with the changes of part 1 (not shown).
        for slices, attempt in [(0, -1)] + [(n, a) for n in (1, 2) for a in range(args.repeat)]:
            if slices:
                change(slices)
            run_id = f"bench-{slices}-{attempt}-{uuid.uuid4().hex[:6]}"
            with open_store() as store:
                spec = catalog.find(pipelines["phases"])
                prepare_bounds(RunContext(spec, RunPlan(), run_id, store=store))
            t0 = time.monotonic()
            cmd = [sys.executable, "-c", PHASES, pipelines["phases"], run_id, sc_url, zip_path]
            r = subprocess.run(cmd,
                               env={**env, "PYTHONPATH": f"{ROOT / 'plugins'}:{ROOT / 'include'}"},
                               capture_output=True, text=True)
            wall = time.monotonic() - t0
            if r.returncode != 0:
                raise SystemExit(f"phases failed:\n{r.stderr[-3000:]}")
            phases = json.loads(r.stdout.strip().splitlines()[-1])
            if not slices:
                continue
            print(f"   {slices} slice(s), run {attempt + 1} ({phases.pop('events')} events; process wall "
                  f"{wall:.2f}s):")
            for name, secs in phases.items():
                print(f"      {name:<40} {secs:6.3f}s")
    finally:
        with conn.cursor() as c:
            c.execute(f"DROP DATABASE IF EXISTS {db}")
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
