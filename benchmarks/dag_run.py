"""Where a DAG run's time goes: a no-op run (nothing new, so no Spark) and a run delivering N row
changes (default 100k) from MariaDB to Kafka (exactly-once) and Redis.

    export TIDEGATE_..._PORT=...   # the servers' ports, as for the tests
    .venv/bin/python benchmarks/dag_run.py [--events 100000] [--deployment] [--noop-runs 5]

Prints three sections:

1. ``airflow dags test``, one line per run: each task's seconds ("[DAG TEST] starting" to "end
   task"). The first task of a ``dags test`` also carries Airflow building its in-process
   execution API (a ``dags test`` cost only: a deployment's tasks talk to the api-server); it
   is shown apart, as ``exec-API``, and left out of that task's figure.
2. A no-op guard + bounds in one fresh process, phase by phase: importing Airflow's task SDK
   (every task process has it), parsing the DAG file as a task does (only the DAG it runs),
   importing the engine, each guard check with its server round trips, and the bounds.
3. With ``--deployment``: the real Airflow (the ``airflow`` service: api-server, scheduler,
   LocalExecutor), ``--noop-runs`` triggered no-op runs, each task's duration as Airflow records
   it (median, max). The deployment is started with this benchmark's pipelines folder and
   checkpoint store, and stopped at the end.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

from servers import services  # benchmarks/servers.py

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "include"))

LINE = re.compile(r"^(\S+Z) .*\[DAG TEST\] (starting task_id|end task task_id)=(\w+)")
STARTED = re.compile(r"^(\S+Z) .*Task started")
TASKS = ("guard", "bounds", "deliver", "release", "report")


def _when(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def task_times(log: str) -> dict[str, float]:
    """Seconds from '[DAG TEST] starting task_id=X' to 'end task task_id=X'; the in-process
    execution API's start-up (from the first task's start to its first 'Task started') is
    reported as ``exec-API`` and taken out of that task."""
    start: dict[str, dt.datetime] = {}
    out: dict[str, float] = {}
    first: tuple[str, dt.datetime] | None = None
    api = None
    for line in log.splitlines():
        m = LINE.match(line)
        if m:
            when = _when(m.group(1))
            if m.group(2).startswith("starting"):
                start[m.group(3)] = when
                first = first or (m.group(3), when)
            elif m.group(3) in start:
                out[m.group(3)] = (when - start[m.group(3)]).total_seconds()
            continue
        s = STARTED.match(line)
        if s and first is not None and api is None:
            api = (_when(s.group(1)) - first[1]).total_seconds()
    if api is not None and first is not None and first[0] in out:
        out[first[0]] -= api
        out = {"exec-API": api, **out}
    return out


def airflow_env(base: Path) -> dict[str, str]:
    return dict(os.environ, AIRFLOW_HOME=str(base / "home"), AIRFLOW__CORE__LOAD_EXAMPLES="False",
                AIRFLOW__LOGGING__LOGGING_LEVEL="INFO",
                AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),
                AIRFLOW__CORE__PLUGINS_FOLDER=str(ROOT / "plugins"),
                TIDEGATE_PIPELINES_DIR=str(base / "pipelines"),
                TIDEGATE_CHECKPOINT_STORE=f"sqlite:///{base / 'store.sqlite'}",
                PATH=f"{BIN}:{os.environ['PATH']}", SPARK_LOCAL_IP="127.0.0.1")


def dags_test(env: dict[str, str], dag_id: str, base: Path, label: str
              ) -> tuple[float, dict[str, float], str]:
    t0 = time.monotonic()
    r = subprocess.run([str(BIN / "airflow"), "dags", "test", dag_id], env=env, capture_output=True,
                       text=True)
    total = time.monotonic() - t0
    log = r.stdout + r.stderr
    if r.returncode != 0:
        (base / f"{label}.log").write_text(log)
        raise SystemExit(f"{label}: the run failed; log in {base / (label + '.log')}")
    return total, task_times(log), log


# --------------------------------------------------------------------------- phases of a no-op


PHASES = textwrap.dedent("""\
    import json, os, sys, time
    out = {}
    def phase(name, fn):
        t0 = time.perf_counter()
        value = fn()
        out[name] = time.perf_counter() - t0
        return value
    phase("import Airflow's task SDK", lambda: __import__("airflow.sdk.execution_time.task_runner"))
    os.environ["_AIRFLOW_PARSING_CONTEXT_DAG_ID"] = "cdc_" + sys.argv[1]
    import runpy
    phase("parse the DAG file (one DAG)", lambda: runpy.run_path(sys.argv[2]))
    def imports():
        import tidegate.guards, tidegate.runner, tidegate.sources.mysql  # noqa: F401
    phase("import the engine", imports)
    from tidegate import bounds_step, catalog, guards, runner
    from tidegate.run import RunContext
    from tidegate.store import open_store
    spec = phase("read the spec", lambda: catalog.find(sys.argv[1]))
    store = phase("open the checkpoint store", open_store)
    run = RunContext(spec, run_id="b", store=store)
    phase("guard: halted (store)", lambda: guards.check_halted(run))
    phase("guard: failover (source identity)", lambda: guards.guard_failover(run))
    phase("guard: retention (binlog list)", lambda: guards.guard_retention(run))
    phase("guard: preflight (settings)", lambda: guards.preflight(run))
    run = phase("bounds (head, checkpoints, range)", lambda: bounds_step.prepare_bounds(run))
    out["nothing to do"] = run.bounds.nothing_to_do()
    print(json.dumps(out))
    """)


def noop_phases(env: dict[str, str], pipeline: str) -> dict[str, float]:
    r = subprocess.run([sys.executable, "-c", PHASES, pipeline, str(ROOT / "dags" / "tidegate_dags.py")],
                       env={**env, "PYTHONPATH": f"{ROOT / 'plugins'}:{ROOT / 'include'}"},
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"no-op phases failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- the deployment


class Api:
    """Airflow's REST API with a bearer token."""

    def __init__(self) -> None:
        env = {}
        for line in services("env").splitlines():
            key, _, value = line.removeprefix("export ").partition("=")
            env[key] = shlex.split(value)[0]
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

    def run_once(self, dag_id: str, timeout: float = 300) -> tuple[float, dict[str, tuple[str, float]]]:
        t0 = time.monotonic()
        run = self.call("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None})["dag_run_id"]
        q = urllib.parse.quote(run, safe="")
        while time.monotonic() - t0 < timeout:
            state = self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{q}")["state"]
            if state in ("success", "failed"):
                break
            time.sleep(0.5)
        wall = time.monotonic() - t0
        tis = self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{q}/taskInstances")["task_instances"]
        if state != "success":
            raise SystemExit(f"{dag_id} {run}: {state}: {[(t['task_id'], t['state']) for t in tis]}")
        return wall, {t["task_id"]: (t["state"], t.get("duration") or 0.0) for t in tis}


def deployment_noop(base: Path, dag_id: str, runs: int) -> None:
    env = dict(os.environ, TIDEGATE_PIPELINES_DIR=str(base / "pipelines"),
               TIDEGATE_CHECKPOINT_STORE=f"sqlite:///{base / 'deployment.sqlite'}")
    services("up", "airflow", env=env)
    try:
        api = Api()
        deadline = time.monotonic() + 120
        while True:
            try:
                api.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(2)
        api.run_once(dag_id)  # places the sinks at the head
        walls, durations = [], {t: [] for t in TASKS}
        for _ in range(runs):
            wall, tis = api.run_once(dag_id)
            walls.append(wall)
            for t, (state, secs) in tis.items():
                if state == "success":
                    durations[t].append(secs)
        print(f"\n3. the airflow service (LocalExecutor), {runs} no-op runs: task durations as Airflow "
              f"records them, median (max)")
        for t, secs in durations.items():
            if secs:
                print(f"   {t:<8} {statistics.median(secs):5.2f}s ({max(secs):.2f}s)")
        gb = [g + b for g, b in zip(durations["guard"], durations["bounds"], strict=True)]
        print(f"   guard + bounds: median {statistics.median(gb):.2f}s, max {max(gb):.2f}s; "
              f"trigger to run success: median {statistics.median(walls):.1f}s")
    finally:
        services("down", "airflow")


# --------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--deployment", action="store_true",
                    help="also measure no-op runs in the airflow service")
    ap.add_argument("--noop-runs", type=int, default=5)
    args = ap.parse_args()

    import pymysql
    from tidegate.connections import get_connection

    base = Path(tempfile.mkdtemp(prefix="tidegate-bench-"))
    tag = uuid.uuid4().hex[:6]
    pipeline, db = f"bench_{tag}", f"bench_{tag}"
    (base / "pipelines").mkdir()
    (base / "pipelines" / f"{pipeline}.yaml").write_text(textwrap.dedent(f"""
        pipeline: {pipeline}
        source: {{kind: mysql, conn_id: cdc_mysql, tables: [{db}.t], server_id: 48400, start: head}}
        batch: {{max_events: 20000}}
        sinks:
          - {{id: events, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}",
              exactly_once: true, partitions: 3}}
          - {{id: cache, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:{{table}}", required: false}}
    """))
    env = airflow_env(base)
    subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True)
    admin = get_connection("cdc_mysql_admin")
    conn = pymysql.connect(host=admin.host, port=admin.port, user=admin.login, password=admin.password,
                           autocommit=True)
    print(f"load average {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs")

    def run(label: str) -> dict[str, float]:
        total, times, _ = dags_test(env, f"cdc_{pipeline}", base, label)
        per_task = "  ".join(f"{t}={s:.1f}s" for t, s in times.items())
        print(f"   {label:<20} total {total:6.1f}s  {per_task}  (deliver skipped: {'deliver' not in times})")
        return times

    try:
        with conn.cursor() as c:
            c.execute(f"CREATE DATABASE {db}")
            c.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(40), n BIGINT)")
        print("1. airflow dags test (exec-API: Airflow building its in-process execution API, "
              "dags test only)")
        run("first (positions)")
        noop = run("no-op")
        print(f"   no-op guard + bounds: {noop['guard'] + noop['bounds']:.2f}s of task time "
              f"(+ {noop.get('exec-API', 0):.1f}s exec-API)")
        phases = noop_phases(env, pipeline)
        print("2. a no-op guard + bounds in one fresh process, phase by phase")
        for name, secs in phases.items():
            if name != "nothing to do":
                print(f"   {name:<40} {secs:6.3f}s")
        assert phases["nothing to do"], "the no-op run found something to do"
        if args.deployment:
            deployment_noop(base, f"cdc_{pipeline}", args.noop_runs)
        if args.events:
            with conn.cursor() as c:
                for chunk in range(0, args.events, 1000):
                    c.execute("BEGIN")
                    rows = [(i, f"value-{i}", i * 7) for i in range(chunk, min(chunk + 1000, args.events))]
                    c.executemany(f"INSERT INTO {db}.t VALUES (%s, %s, %s)", rows)
                    c.execute("COMMIT")
            print("1b. airflow dags test with a backlog")
            run(f"{args.events} events")
    finally:
        with conn.cursor() as c:
            c.execute(f"DROP DATABASE IF EXISTS {db}")
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
