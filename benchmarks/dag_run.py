"""Wall time per task of one DAG run through `airflow dags test`: a no-op run (nothing new, so
no Spark) and a run delivering N row changes (default 100k) from MariaDB to Kafka
(exactly-once) and Redis.

    eval "$(scripts/services env)"; .venv/bin/python benchmarks/dag_run.py [--events 100000]

Prints one line per task and run. The first task of each run also carries the in-process
execution API start-up (Airflow builds it on the first task of a `dags test`).
"""

from __future__ import annotations

import argparse
import datetime as dt
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
sys.path.insert(0, str(ROOT / "include"))

LINE = re.compile(r"^(\S+Z) .*\[DAG TEST\] (starting task_id|end task task_id)=(\w+)")


def task_times(log: str) -> dict[str, float]:
    """Seconds from '[DAG TEST] starting task_id=X' to 'end task task_id=X'."""
    start: dict[str, dt.datetime] = {}
    out: dict[str, float] = {}
    for line in log.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        when = dt.datetime.fromisoformat(m.group(1).replace("Z", "+00:00"))
        if m.group(2).startswith("starting"):
            start[m.group(3)] = when
        elif m.group(3) in start:
            out[m.group(3)] = (when - start[m.group(3)]).total_seconds()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=100_000)
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
    env = dict(os.environ, AIRFLOW_HOME=str(base / "home"), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__LOGGING__LOGGING_LEVEL="INFO",
               AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),
               AIRFLOW__CORE__PLUGINS_FOLDER=str(ROOT / "plugins"),
               TIDEGATE_PIPELINES_DIR=str(base / "pipelines"),
               TIDEGATE_CHECKPOINT_STORE=f"sqlite:///{base / 'store.sqlite'}",
               PATH=f"{BIN}:{os.environ['PATH']}", SPARK_LOCAL_IP="127.0.0.1")
    subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True)
    admin = get_connection("cdc_mysql_admin")
    conn = pymysql.connect(host=admin.host, port=admin.port, user=admin.login, password=admin.password,
                           autocommit=True)

    def run(label: str) -> None:
        t0 = time.monotonic()
        r = subprocess.run([str(BIN / "airflow"), "dags", "test", f"cdc_{pipeline}"], env=env,
                           capture_output=True, text=True)
        total = time.monotonic() - t0
        if r.returncode != 0:
            (base / f"{label}.log").write_text(r.stdout + r.stderr)
            raise SystemExit(f"{label}: the run failed; log in {base / (label + '.log')}")
        times = task_times(r.stdout + r.stderr)
        per_task = "  ".join(f"{t}={s:.1f}s" for t, s in times.items())
        print(f"{label:<22} total {total:6.1f}s  {per_task}  (deliver skipped: {'deliver' not in times})")

    try:
        with conn.cursor() as c:
            c.execute(f"CREATE DATABASE {db}")
            c.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(40), n BIGINT)")
        run("first (positions)")
        run("no-op")
        with conn.cursor() as c:
            for chunk in range(0, args.events, 1000):
                c.execute("BEGIN")
                rows = [(i, f"value-{i}", i * 7) for i in range(chunk, min(chunk + 1000, args.events))]
                c.executemany(f"INSERT INTO {db}.t VALUES (%s, %s, %s)", rows)
                c.execute("COMMIT")
        run(f"{args.events} events")
    finally:
        with conn.cursor() as c:
            c.execute(f"DROP DATABASE IF EXISTS {db}")
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
