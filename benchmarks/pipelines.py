"""What the number of pipelines costs: N specs in the pipelines folder (default 10, 100, 500).

    .venv/bin/python benchmarks/pipelines.py [--sizes 10,100,500] [--events 5] [--repeat 1] [--keep]

For each N the script writes N valid specs into a fresh pipelines folder (MariaDB and
PostgreSQL sources, Kafka / NATS / Redis sinks, shaped like ``include/pipelines/``; every
MariaDB spec has its own ``server_id``, every PostgreSQL spec its own slot) and measures, each
in a fresh process:

* the dag-processor's parse of each DAG file, as its parsing process does it
  (``airflow.dag_processing.processor``): the ``BundleDagBag`` of the file, then the
  serialization of its DAGs; wall and CPU seconds, CPU per pipeline. ``tidegate_spec_errors.py``
  is a second file of the folder, parsed in its own process (its CPU seconds);
* the peak RSS of the process that parses ``tidegate_dags.py``, and how much of it the parse
  added (its RSS before: Airflow imported);
* a task's parse, CPU milliseconds (the parsing context names one DAG, as in each of the five
  task processes of a run; the DAG file's imports included);
* one pipeline's run, ``tidegate run <pipeline>`` (guards, bounds, reading, delivery to Kafka
  exactly-once and Redis, release) of ``--events`` new MariaDB rows: wall and CPU seconds of the
  command (its reader process included); whatever a run reads or checks of the other specs
  shows here;
* ``tidegate status <pipeline> --json``, wall and CPU seconds: the state of one pipeline, read as
  a failed or retried task's callback reads it to emit its metrics.

The servers are this checkout's (``scripts/services up mysql kafka redis``, started if down).
The machine is shared: CPU seconds move less with the load than wall seconds; compare sizes
within one invocation; ``--repeat`` measures every size again and prints the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

from servers import services, services_env  # benchmarks/servers.py

ROOT = Path(__file__).resolve().parent.parent
DAGS = ROOT / "dags"
sys.path.insert(0, str(ROOT / "include"))

# One source shape per kind and three sink mixes, cycled over the specs.
SINK_MIXES = (
    [{"id": "events", "kind": "kafka", "conn_id": "cdc_kafka", "topic": "{pipeline}.{schema}.{table}",
      "exactly_once": True, "partitions": 3},
     {"id": "cache", "kind": "redis", "conn_id": "cdc_redis", "stream": "{pipeline}:{schema}.{table}",
      "required": False}],
    [{"id": "bus", "kind": "nats", "conn_id": "cdc_nats", "stream": "{stream}",
      "subject": "{pipeline}.{schema}.{table}", "duplicate_window": 120}],
    [{"id": "events", "kind": "kafka", "conn_id": "cdc_kafka", "topic": "{pipeline}.{schema}.{table}"},
     {"id": "cache", "kind": "redis", "conn_id": "cdc_redis", "stream": "{pipeline}:{schema}.{table}",
      "maxlen": 1000000}],
)


def spec_of(i: int, tag: str) -> dict:
    """The i-th generated spec: even i MariaDB, odd i PostgreSQL; sinks cycle over SINK_MIXES."""
    name = f"many_{tag}_{i:04d}"
    if i % 2 == 0:
        source = {"kind": "mysql", "conn_id": "cdc_mysql", "server_id": 50000 + i, "start": "head",
                  "tables": [f"db_{i:04d}.orders", f"db_{i:04d}.order_items"]}
    else:
        source = {"kind": "postgres", "conn_id": "cdc_postgres", "start": "earliest",
                  "tables": ["public.orders", "public.order_items"]}
    sinks = json.loads(json.dumps(SINK_MIXES[i % len(SINK_MIXES)]).replace("{stream}", name.upper()))
    policy = {"commit_policy": "quorum", "quorum": 1} if len(sinks) > 1 and i % 4 == 3 else {}
    return {"pipeline": name, "tenant": f"team_{i % 7}", "schedule": "*/1 * * * *", "source": source,
            "batch": {"max_events": 20000, **policy}, "sinks": sinks}


def run_spec(name: str, db: str) -> dict:
    """The pipeline that runs: MariaDB to Kafka (exactly-once) and Redis, on a real table."""
    return {"pipeline": name, "tenant": "bench", "schedule": "*/1 * * * *",
            "source": {"kind": "mysql", "conn_id": "cdc_mysql", "server_id": 49990, "start": "head",
                       "tables": [f"{db}.t"]},
            "batch": {"max_events": 20000}, "sinks": SINK_MIXES[0]}


def write_folder(folder: Path, n: int, tag: str, runner: str, db: str) -> None:
    """N specs: N-1 generated ones and the one that runs (its file sorts in the middle)."""
    import yaml

    folder.mkdir(parents=True)
    for i in range(n - 1):
        raw = spec_of(i, tag)
        (folder / f"{raw['pipeline']}.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    (folder / f"{runner}.yaml").write_text(yaml.safe_dump(run_spec(runner, db), sort_keys=False))


# --------------------------------------------------------------------------- the parses

# What the dag-processor's parsing process does with one file (processor._parse_file: the
# BundleDagBag, then each DAG serialized), timed, with the process's memory.
PARSE_PROBE = textwrap.dedent("""\
    import json, resource, sys, time
    import psutil
    import structlog
    from airflow.dag_processing import processor
    from airflow.dag_processing.dagbag import BundleDagBag
    dag_file, bundle = sys.argv[1], sys.argv[2]
    log = structlog.get_logger()
    processor._pre_import_airflow_modules(dag_file, log)
    rss_before = psutil.Process().memory_info().rss
    t0, c0 = time.perf_counter(), time.process_time()
    bag = BundleDagBag(dag_folder=dag_file, bundle_path=bundle, bundle_name="dags-folder",
                       load_op_links=False)
    t1, c1 = time.perf_counter(), time.process_time()
    serialized, errors = processor._serialize_dags(bag, log)
    t2, c2 = time.perf_counter(), time.process_time()
    [stat] = bag.dagbag_stats
    print(json.dumps({"dags": len(bag.dags), "import_errors": len(bag.import_errors) + len(errors),
                      "bag_s": t1 - t0, "stat_s": stat.duration.total_seconds(), "serialize_s": t2 - t1,
                      "bag_cpu": c1 - c0, "serialize_cpu": c2 - c1,
                      "rss_before": rss_before,
                      "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
    """)


def parse(env: dict[str, str], dag_file: Path, dag_id: str | None = None) -> dict:
    """One parse of ``dag_file`` in a fresh process; with ``dag_id``, as a task of that DAG does."""
    env = dict(env)
    if dag_id:
        env["_AIRFLOW_PARSING_CONTEXT_DAG_ID"] = dag_id
        env["_AIRFLOW_PARSING_CONTEXT_TASK_ID"] = "bounds"
    r = subprocess.run([sys.executable, "-c", PARSE_PROBE, str(dag_file), str(DAGS)], env=env,
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"parsing {dag_file.name} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- one run


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (the command and the processes it waited for) and stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[2:])} failed:\n{r.stderr[-3000:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, r.stdout


def tidegate_run(env: dict[str, str], pipeline: str) -> tuple[float, float, int]:
    """Wall and CPU seconds of ``tidegate run <pipeline>``, and the events it delivered."""
    wall, cpu, out = timed([sys.executable, "-m", "tidegate.cli", "run", pipeline], env)
    report = json.loads(out[out.index("{"):])
    return wall, cpu, int(report.get("events") or 0)


def tidegate_status(env: dict[str, str], pipeline: str) -> tuple[float, float]:
    """Wall and CPU seconds of ``tidegate status <pipeline> --json`` (its source head included)."""
    wall, cpu, out = timed([sys.executable, "-m", "tidegate.cli", "status", pipeline, "--json"], env)
    [entry] = json.loads(out)["pipelines"]
    assert entry["has_spec"] and entry["pipeline"] == pipeline, entry
    return wall, cpu


def insert(conn, db: str, first: int, count: int) -> None:
    with conn.cursor() as c:
        c.executemany(f"INSERT INTO {db}.t VALUES (%s, %s)",
                      [(i, f"v{i}") for i in range(first, first + count)])


# --------------------------------------------------------------------------- main


def measure(base: Path, n: int, args: argparse.Namespace, senv: dict[str, str], conn, db: str,
            next_id: list[int]) -> dict:
    tag = uuid.uuid4().hex[:4]
    runner = f"many_{tag}_run"
    folder = base / f"n{n}-{tag}" / "pipelines"
    write_folder(folder, n, tag, runner, db)
    env = {**os.environ, **senv, "AIRFLOW_HOME": str(base / "home"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS), "TIDEGATE_PIPELINES_DIR": str(folder),
           "TIDEGATE_CHECKPOINT_STORE": f"sqlite:///{folder.parent / 'store.sqlite'}",
           "PYTHONPATH": f"{ROOT / 'plugins'}:{ROOT / 'include'}"}
    dags = parse(env, DAGS / "tidegate_dags.py")
    errors = parse(env, DAGS / "tidegate_spec_errors.py")
    if dags["dags"] != n or dags["import_errors"] or errors["import_errors"]:
        raise SystemExit(f"N={n}: {dags['dags']} DAGs, import errors {dags['import_errors']} + "
                         f"{errors['import_errors']} (generated specs must all be valid)")
    task = parse(env, DAGS / "tidegate_dags.py", dag_id=f"cdc_{runner}")
    assert task["dags"] == 1, task
    tidegate_run(env, runner)  # places the sinks at the head
    insert(conn, db, next_id[0], args.events)
    next_id[0] += args.events
    run_s, run_cpu, events = tidegate_run(env, runner)
    assert events == args.events, f"N={n}: the run delivered {events} events, not {args.events}"
    status_s, status_cpu = tidegate_status(env, runner)
    parse_cpu = dags["bag_cpu"] + dags["serialize_cpu"]
    return {"n": n, "parse_s": dags["bag_s"] + dags["serialize_s"], "parse_cpu": parse_cpu,
            "bag_cpu": dags["bag_cpu"], "serialize_cpu": dags["serialize_cpu"],
            "per_ms": 1000 * parse_cpu / n, "errors_cpu": errors["bag_cpu"],
            "rss_mib": dags["peak_rss"] / 2**20,
            "rss_growth_mib": (dags["peak_rss"] - dags["rss_before"]) / 2**20,
            "task_ms": 1000 * task["bag_cpu"], "run_s": run_s, "run_cpu": run_cpu,
            "status_s": status_s, "status_cpu": status_cpu}


COLUMNS = (  # (title, format of the row's values)
    ("N", "{n:>5}"),
    ("parse wall (s)", "{parse_s:>14.2f}"),
    ("parse CPU (s)", "{parse_cpu:>13.2f}"),
    ("(DagBag + serialize)", "{split:>20}"),
    ("CPU per pipeline (ms)", "{per_ms:>21.1f}"),
    ("errors file CPU (s)", "{errors_cpu:>19.2f}"),
    ("parse peak RSS (MiB)", "{rss_mib:>20.0f}"),
    ("(the parse's)", "{rss_growth_mib:>13.0f}"),
    ("task parse CPU (ms)", "{task_ms:>19.0f}"),
    ("one run wall/CPU (s)", "{run:>20}"),
    ("status of one wall/CPU (s)", "{status:>26}"),
)
HEADER = " ".join(f"{title:>5}" if title == "N" else title for title, _ in COLUMNS)


def row(r: dict) -> str:
    values = {**r, "split": f"{r['bag_cpu']:.2f} + {r['serialize_cpu']:.2f}",
              "run": f"{r['run_s']:.2f} / {r['run_cpu']:.2f}",
              "status": f"{r['status_s']:.2f} / {r['status_cpu']:.2f}"}
    return " ".join(fmt.format(**values) for _, fmt in COLUMNS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10,100,500", help="comma-separated numbers of specs")
    ap.add_argument("--events", type=int, default=5, help="new MariaDB rows the measured run delivers")
    ap.add_argument("--repeat", type=int, default=1, help="measure every size this many times")
    ap.add_argument("--keep", action="store_true", help="keep the generated folders and stores")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    import pymysql

    services("up", "mysql", "kafka", "redis")
    senv = services_env()
    from tidegate.connections import get_connection

    admin = get_connection("cdc_mysql_admin", senv)
    conn = pymysql.connect(host=admin.host, port=admin.port, user=admin.login, password=admin.password,
                           autocommit=True)
    db = f"many_{uuid.uuid4().hex[:6]}"
    base = Path(tempfile.mkdtemp(prefix="tidegate-pipelines-"))
    print(f"load average {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs; folders in {base}"
          + ("" if args.keep else " (removed at the end; --keep keeps them)"))
    results: dict[int, list[dict]] = {n: [] for n in sizes}
    next_id = [0]
    try:
        with conn.cursor() as c:
            c.execute(f"CREATE DATABASE {db}")
            c.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(40))")
        print(HEADER)
        for _ in range(args.repeat):
            for n in sizes:
                r = measure(base, n, args, senv, conn, db, next_id)
                results[n].append(r)
                print(row(r), flush=True)
    finally:
        with conn.cursor() as c:
            c.execute(f"DROP DATABASE IF EXISTS {db}")
        conn.close()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    if args.repeat > 1:
        print("median of the repeats")
        for n in sizes:
            med = {k: statistics.median(r[k] for r in results[n]) for k in results[n][0]}
            print(row({**med, "n": n}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
