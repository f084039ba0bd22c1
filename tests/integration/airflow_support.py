"""Running pipelines through `airflow dags test` in tests: a private AIRFLOW_HOME per module,
the project's dags/ and plugins/, the shared Spark Connect server, and readers of what a run
logged."""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import SERVICES, services_env

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def make_airflow_env(base: Path, service_env: dict[str, str]) -> dict[str, str]:
    """Environment of an Airflow with a migrated metadata DB, a pipelines folder of the test's
    own (``base/pipelines``) and a fresh checkpoint store (``base/store.sqlite``)."""
    env = dict(os.environ, **service_env)
    env.update({
        "AIRFLOW_HOME": str(base / "home"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # The assertions read `dags test`'s per-task INFO lines; other tests lower the level.
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "TIDEGATE_PIPELINES_DIR": str(base / "pipelines"),
        "TIDEGATE_CHECKPOINT_STORE": f"sqlite:///{base / 'store.sqlite'}",
        "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
        "SPARK_LOCAL_IP": "127.0.0.1",
        # The engine of this checkout, also when the virtualenv's editable install points at
        # another one (a git worktree sharing the main checkout's .venv).
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "include"), os.environ.get("PYTHONPATH"))
                                      if p),
    })
    (base / "pipelines").mkdir(exist_ok=True)
    subprocess.run([str(VENV_BIN / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True)
    return env


@pytest.fixture(scope="session", name="spark_connect")
def spark_connect_server(service_env) -> Path:
    """The `spark_connect` service (a Spark Connect server on local[2]), started once for the
    session and left running like the other shared servers: a deliver task of a pipeline whose
    ``spark.conn_id`` is ``spark_connect`` is its client. Returns the server's folder (its log,
    and the session files it keeps, the shipped package among them)."""
    r = subprocess.run([sys.executable, str(SERVICES), "up", "spark_connect"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"service 'spark_connect' is not available:\n{r.stderr[-2000:]}", pytrace=False)
    return Path(services_env()["TIDEGATE_SERVICES_DIR"]) / "spark_connect"


def executor_notes(log: str, pipeline: str) -> list[str]:
    """The notes the pipeline's Spark tasks sent back with their rows, as the driver logged them
    (the deliver task's log; an executor's own stderr may lose its last lines when the
    application ends)."""
    note = rf"tidegate: pipeline {pipeline} slice \S+: .*? in the environment: [^\[\n]*?"
    return re.findall(rf"({note})\s*(?:\[|$)", log, re.M)  # the logger's suffix ([name] loc=...) aside


def dags_test_cmd(dag_id: str, conf: dict | None = None) -> list[str]:
    cmd = [str(VENV_BIN / "airflow"), "dags", "test", dag_id]
    return cmd + (["-c", json.dumps(conf)] if conf else [])


def dags_test(env: dict[str, str], dag_id: str, conf: dict | None = None) -> tuple[int, str]:
    r = subprocess.run(dags_test_cmd(dag_id, conf), env=env, capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout + r.stderr


def dags_test_killed_when(env: dict[str, str], dag_id: str, ready: Callable[[], bool],
                          timeout: float = 300) -> str:
    """Run `airflow dags test` in a process group of its own and SIGKILL the whole group (the
    task, spark-submit, the Spark JVM and its Python workers) as soon as ``ready()`` holds.
    Returns what it printed; fails when the run ended before the kill point."""
    # Output goes to a file: a pipe nobody reads would stall the run before the kill point.
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(dags_test_cmd(dag_id), env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline = time.monotonic() + timeout
        try:
            while not ready():
                if proc.poll() is not None:
                    out.seek(0)
                    raise AssertionError(f"the run ended (rc={proc.returncode}) before the kill point:\n"
                                         + out.read().decode(errors="replace")[-3000:])
                assert time.monotonic() < deadline, "kill point not reached in time"
                time.sleep(0.02)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        out.seek(0)
        text = out.read().decode(errors="replace")
    assert proc.returncode == -signal.SIGKILL
    return text


def task_ended(log: str, task_id: str) -> bool:
    return f"end task task_id={task_id} " in log


def per_key(changes: list[dict], field: str = "status") -> dict[int, list[tuple]]:
    """Each key's (op, after[field]) in the order the consumer saw them."""
    out: dict[int, list[tuple]] = collections.defaultdict(list)
    for ch in changes:
        out[ch["key"]["id"]].append((ch["op"], (ch["after"] or {}).get(field)))
    return dict(out)


# --------------------------------------------------------------------------- assets and lineage


class LineageReceiver:
    """A real OpenLineage HTTP endpoint (a stdlib server on a thread): keeps every event POSTed
    to it, in arrival order. ``transport`` is the provider's ``[openlineage] transport`` for it."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        events = self.events = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    import gzip

                    body = gzip.decompress(body)
                events.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:  # quiet: pytest shows stderr
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.transport = json.dumps({"type": "http", "url": f"http://127.0.0.1:{self.server.server_port}",
                                     "endpoint": "api/v1/lineage"})

    def of_run(self, dag_id: str, run_id: str) -> list[dict]:
        """The events of one DAG run (its own and its tasks'), in arrival order."""
        return [e for e in list(self.events) if _airflow_run_of(e) == (dag_id, run_id)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _airflow_run_of(event: dict) -> tuple[str | None, str | None]:
    """(dag_id, run_id) an OpenLineage event of Airflow's belongs to: a task's events carry the
    ``airflow`` run facet, a DAG run's the ``airflowDagRun`` one."""
    facets = event.get("run", {}).get("facets", {})
    for key in ("airflow", "airflowDagRun"):
        dag_run = facets.get(key, {}).get("dagRun") or {}
        if dag_run:
            return dag_run.get("dag_id"), dag_run.get("run_id")
    return None, None


def write_asset_consumer(folder: Path, dag_id: str, uri: str) -> Path:
    """A DAG scheduled on the asset ``uri`` (one EmptyOperator: the scheduler marks it done
    without a worker), as a file of the extra DAG bundle."""
    path = folder / f"{dag_id}.py"
    path.write_text(
        "from datetime import datetime, timezone\n"
        "from airflow.providers.standard.operators.empty import EmptyOperator\n"
        "from airflow.sdk import DAG, Asset\n\n"
        f"with DAG({dag_id!r}, schedule=[Asset({uri!r})], catchup=False,\n"
        "         start_date=datetime(2024, 1, 1, tzinfo=timezone.utc)):\n"
        "    EmptyOperator(task_id='noted')\n")
    return path
