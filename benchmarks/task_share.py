"""What orchestrating costs: the Airflow task processes' CPU against everything else a run makes
work, through the real scheduler, each run delivered through the Spark Connect server.

    PATH="$PWD/.venv/bin:$PATH" .venv/bin/python benchmarks/task_share.py \\
        [--changes 200000] [--runs 2] [--sources mysql,postgres] [--against-run]

Per source one pipeline (a table (id, v, s VARCHAR(40)), one Kafka exactly-once sink,
``spark: {conn_id: spark_connect}``, no schedule), placed at the head by a first run. Then, per
run: ``--changes`` inserts in transactions of 1,000, a DAG run triggered through the REST API and
waited for. CPU seconds (user + system, with ended children) during the run, per group:

* the deliver task's process: what it measured of itself (``task_process_cpu_s`` in its report);
* every Airflow task process of the run (guard, bounds, deliver, release, report, and their
  supervisors): the scheduler's process tree (its LocalExecutor workers, which fork the task
  processes and wait for them) less the scheduler itself;
* orchestration: the scheduler's own loop, the dag-processor, the api-server, the triggerer;
* Spark: the Connect server's process tree (the JVM, the Python daemon and its workers);
* the servers: the source (MariaDB or PostgreSQL) and the Kafka broker.

The deliver task's share is its CPU over all of these. From Spark's event log (the server is
restarted with ``TIDEGATE_SPARK_EVENT_LOG``): the jobs submitted during each run, their tasks, and
who delivered (the report's ``delivered_by``: ``executor``, one Spark task).

``--against-run``: after each DAG run, ``tidegate run`` of a twin pipeline over the same table
(its own server id or slot, no ``spark`` block, in a folder Airflow does not read) delivers the
same changes; the DAG run's wall time (the API's start to end) beside it.

The servers: ``scripts/services up mysql postgres kafka``; the Airflow deployment and the
``spark_connect`` server are (re)started by this script with its own pipelines folder, and the
deployment is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.parse
import uuid
from pathlib import Path

from continuous import Api  # benchmarks/continuous.py
from servers import admin_connection, bench_table, services, services_env  # benchmarks/servers.py

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "include"))
TICK = os.sysconf("SC_CLK_TCK")


def proc_table() -> tuple[dict[int, list[int]], dict[int, tuple[float, float]]]:
    """Children per pid, and per pid (own CPU s, own + waited-for children's CPU s)."""
    kids: dict[int, list[int]] = {}
    cpu: dict[int, tuple[float, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            f = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        kids.setdefault(int(f[1]), []).append(int(entry.name))
        own = (int(f[11]) + int(f[12])) / TICK
        cpu[int(entry.name)] = (own, own + (int(f[13]) + int(f[14])) / TICK)
    return kids, cpu


def tree_cpu(pid: int, table: tuple) -> float:
    kids, cpu = table
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += cpu.get(p, (0.0, 0.0))[1]
        todo += kids.get(p, [])
    return total


def pid_of(services_dir: Path, name: str) -> int | None:
    for f in (services_dir / f"{name}.pid", services_dir / name / "pid"):
        try:
            return int(f.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return None


def cpu_groups(services_dir: Path, source: str) -> dict[str, float]:
    """CPU seconds so far per group (see the module docstring)."""
    table = proc_table()
    air = services_dir / "airflow"
    scheduler = pid_of(air, "scheduler")
    assert scheduler is not None, "the Airflow scheduler is not up"
    own = table[1].get(scheduler, (0.0, 0.0))[0]
    orchestration = own + sum(tree_cpu(p, table) for name in ("dag-processor", "api-server", "triggerer")
                              if (p := pid_of(air, name)) is not None)
    servers = sum(tree_cpu(p, table) for name in (source, "kafka") if (p := pid_of(services_dir, name)))
    spark = pid_of(services_dir, "spark_connect")
    return {"tasks": tree_cpu(scheduler, table) - own, "orchestration": orchestration,
            "spark": tree_cpu(spark, table) if spark else 0.0, "servers": servers}


def write_rows(source: str, env: dict, table: str, first: int, n: int) -> None:
    conn = admin_connection(source, env)
    with conn.cursor() as c:
        for i in range(first, first + n, 1000):
            rows = ", ".join(f"({j}, {j % 97}, 'status-{j % 13}-padding-padding')"
                             for j in range(i, min(first + n, i + 1000)))
            c.execute(f"INSERT INTO {table} VALUES {rows}")  # autocommit: a transaction each
    conn.close()


def trigger_and_wait(api: Api, dag: str, timeout: float = 900) -> dict:
    run = api.call("POST", f"/api/v2/dags/{dag}/dagRuns", {"logical_date": None})
    q = urllib.parse.quote(run["dag_run_id"], safe="")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = api.call("GET", f"/api/v2/dags/{dag}/dagRuns/{q}")
        if r["state"] in ("success", "failed"):
            if r["state"] != "success":
                raise SystemExit(f"{dag} run {run['dag_run_id']} failed")
            return r
        time.sleep(0.5)
    raise SystemExit(f"{dag} run {run['dag_run_id']} not done in {timeout:.0f}s")


def deliver_report(api: Api, dag: str, run_id: str) -> dict:
    q = urllib.parse.quote(run_id, safe="")
    path = f"/api/v2/dags/{dag}/dagRuns/{q}/taskInstances/deliver/xcomEntries/return_value"
    v = api.call("GET", path)["value"]
    return json.loads(v) if isinstance(v, str) else v


def jobs_between(event_dir: Path, start_ms: int, end_ms: int) -> list[tuple[int, int]]:
    """(job id, its tasks) of every Spark job submitted between the two times, from the event log."""
    out = []
    for f in event_dir.rglob("events_*"):  # Spark 4 writes a rolling log: a folder of files
        for line in f.read_text(errors="replace").splitlines():
            if '"SparkListenerJobStart"' not in line:
                continue
            e = json.loads(line)
            if start_ms <= e["Submission Time"] <= end_ms:
                out.append((e["Job ID"], sum(s["Number of Tasks"] for s in e["Stage Infos"])))
    return out


def ms(text: str) -> int:
    import datetime as dt

    return int(dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def twin_pipelines(work: Path, names: dict[str, str], env: dict) -> dict:
    """Per source, a twin of the pipeline (another server id or slot) over the same table with no
    ``spark`` block, in a folder Airflow does not read, as a function that runs `tidegate run` of
    it: (wall s, events). ``env``: the servers' connections and the benchmark's store."""
    folder = work / "twins"
    folder.mkdir()
    out = {}
    for source, name in names.items():
        twin = f"{name}_run"
        line = (f"{{kind: mysql, conn_id: cdc_mysql, tables: [{name}.t], server_id: 47901, start: head}}"
                if source == "mysql" else
                f"{{kind: postgres, conn_id: cdc_postgres, tables: [{name}.t], slot: {twin}, start: head}}")
        (folder / f"{twin}.yaml").write_text(textwrap.dedent(f"""\
            pipeline: {twin}
            source: {line}
            sinks:
              - {{id: k, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}",
                  exactly_once: true}}
            """))

        def run(twin: str = twin) -> tuple[float, int]:
            t0 = time.monotonic()
            r = subprocess.run([str(ROOT / ".venv" / "bin" / "tidegate"), "run", twin], capture_output=True,
                               text=True, env=dict(env, TIDEGATE_PIPELINES_DIR=str(folder)), check=True)
            report = json.loads(r.stdout[r.stdout.rfind("\n{\n") + 1:])
            return time.monotonic() - t0, report.get("events", 0)

        out[source] = run
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--changes", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--sources", default="mysql,postgres")
    ap.add_argument("--against-run", action="store_true",
                    help="after each DAG run, `tidegate run` of a twin pipeline (no Spark) over the same "
                         "changes, and the two wall times")
    a = ap.parse_args()
    sources = a.sources.split(",")
    work = Path(tempfile.mkdtemp(prefix="tidegate-task-share-"))
    (work / "pipelines").mkdir()
    events = work / "spark-events"
    services("up", *sources, "kafka")
    services("down", "spark_connect")
    services("up", "spark_connect", env=dict(os.environ, TIDEGATE_SPARK_EVENT_LOG=str(events)))
    senv = services_env()
    tag = uuid.uuid4().hex[:6]
    names = {s: f"ts_{s[:2]}_{tag}" for s in sources}
    for source, name in names.items():
        (work / "pipelines" / f"{name}.yaml").write_text(textwrap.dedent(f"""\
            pipeline: {name}
            source: {bench_table(source, senv, name, 47900)}
            sinks:
              - {{id: k, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}",
                  exactly_once: true}}
            spark: {{conn_id: spark_connect}}
            """))
    env = dict(os.environ, TIDEGATE_PIPELINES_DIR=str(work / "pipelines"),
               TIDEGATE_CHECKPOINT_STORE=f"sqlite:///{work / 'store.sqlite'}")
    twins = twin_pipelines(work, names, {**env, **senv}) if a.against_run else {}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "include"), env.get("PYTHONPATH")) if p)
    services("up", "airflow", env=env)
    senv = services_env()
    api = Api(senv)
    services_dir = Path(senv["TIDEGATE_SERVICES_DIR"])
    print(f"{a.changes} changes per run, Kafka exactly-once, through the scheduler and Spark Connect; "
          f"load average {os.getloadavg()[0]:.1f}; work folder {work}")
    print("| source | run | events | delivered by | Spark jobs (tasks) | deliver task CPU s | all task "
          "processes CPU s | orchestration CPU s | Spark CPU s | servers CPU s | deliver task share "
          "| all task processes' share |")
    print("|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    try:
        for source, name in names.items():
            dag = f"cdc_{name}"
            for _ in range(120):
                try:
                    api.call("PATCH", f"/api/v2/dags/{dag}", {"is_paused": False})
                    break
                except OSError:
                    time.sleep(2)
            trigger_and_wait(api, dag)  # places the pipeline at the head
            if source in twins:
                twins[source]()  # placed at the head too
            for i in range(a.runs):
                write_rows(source, senv, f"{name}.t", 1 + i * a.changes, a.changes)
                time.sleep(2)  # the scheduler and the servers settle
                before = cpu_groups(services_dir, source)
                r = trigger_and_wait(api, dag)
                time.sleep(1)  # the task processes are reaped
                used = {k: v - before[k] for k, v in cpu_groups(services_dir, source).items()}
                rep = deliver_report(api, dag, r["dag_run_id"])
                jobs = jobs_between(events, ms(r["start_date"]), ms(r["end_date"]))
                total = sum(used.values())
                mine = rep.get("task_process_cpu_s") or 0.0
                print(f"| {source} | {i + 1} | {rep.get('events')} | {rep.get('delivered_by') or 'client'} "
                      f"| {len(jobs)} ({', '.join(str(n) for _, n in jobs)}) | {mine:.2f} "
                      f"| {used['tasks']:.2f} "
                      f"| {used['orchestration']:.2f} | {used['spark']:.2f} | {used['servers']:.2f} "
                      f"| {mine / total:.1%} | {used['tasks'] / total:.1%} |", flush=True)
                if source in twins:
                    dag_s = (ms(r["end_date"]) - ms(r["start_date"])) / 1000
                    run_s, got = twins[source]()
                    assert got == rep.get("events"), (got, rep.get("events"))
                    print(f"|   | the DAG run {dag_s:.1f} s, `tidegate run` of the same {got} changes "
                          f"{run_s:.1f} s: the DAG at {run_s / dag_s:.2f}x its events/s |", flush=True)
    finally:
        services("down", "airflow")
    return 0


if __name__ == "__main__":
    sys.exit(main())
