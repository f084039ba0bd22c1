"""Running pipelines through `airflow dags test` in tests: a private AIRFLOW_HOME per module,
the project's dags/ and plugins/, the shared Spark Connect server, and readers of what a run
logged."""

from __future__ import annotations

import atexit
import collections
import json
import os
import re
import shutil
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


def start_tidegate_run(base: Path, pipeline: str, env: dict[str, str], run_id: str) -> subprocess.Popen:
    """``tidegate run`` of ``pipeline`` in a session of its own (so a test can signal its
    process group), its output in ``base/{run_id}.out`` and ``.err``."""
    out, err = (open(base / f"{run_id}.{k}", "wb") for k in ("out", "err"))  # noqa: SIM115
    with out, err:
        return subprocess.Popen([str(VENV_BIN / "tidegate"), "run", pipeline, "--run-id", run_id],
                                env=env, stdout=out, stderr=err, start_new_session=True)


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
    home = base / "home"
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(migrated_metadata_db(env), home / "airflow.db")
    return env


_MIGRATED: list[Path] = []  # the session's migrated metadata DB, once made
_MIGRATE_LOCK = threading.Lock()  # (test_tls_sources makes two Airflow homes at once)


def migrated_metadata_db(env: dict[str, str]) -> Path:
    """A metadata DB (SQLite) that `airflow db migrate` made once for the test session, in an
    Airflow home of its own; each module's Airflow home gets a copy of it: the same schema and
    rows a migration of its own would make, without paying one (about 7 s each, several times
    that on a loaded machine). The copy is the home's ``airflow.db``, where Airflow looks for it;
    the home's airflow.cfg is written by the first command that runs there, as before."""
    with _MIGRATE_LOCK:
        if not _MIGRATED:
            home = Path(tempfile.mkdtemp(prefix="tidegate-airflow-migrated-"))
            atexit.register(shutil.rmtree, home, True)  # gone with the test session
            subprocess.run([str(VENV_BIN / "airflow"), "db", "migrate"],
                           env={**env, "AIRFLOW_HOME": str(home)}, check=True, capture_output=True)
            _MIGRATED.append(home / "airflow.db")
        return _MIGRATED[0]


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
    task, spark-submit, the Spark JVM and its Python workers) as soon as ``ready()`` holds, and
    with it the Python workers of the `spark_connect` server that run tasks (a run delivered by
    a Spark task there goes on without its client: the run is killed where it delivers).
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
            kill_connect_task_workers()
            proc.wait(60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        out.seek(0)
        text = out.read().decode(errors="replace")
    assert proc.returncode == -signal.SIGKILL
    return text


# The Python daemons a Connect server forks its workers from: PySpark's, and tidegate's, which
# the project's servers run (spark.python.daemon.module; tidegate/spark/daemon.py).
PYTHON_DAEMONS = ("pyspark.daemon", "tidegate.spark.daemon")


def connect_task_workers() -> list:
    """The `spark_connect` server's Python workers that a daemon forked for tasks (not the
    daemons), as psutil processes."""
    import psutil

    pid_file = Path(services_env()["TIDEGATE_SERVICES_DIR"]) / "spark_connect" / "pid"
    if not pid_file.exists():
        return []

    def forked_by_a_daemon(proc: psutil.Process) -> bool:
        try:
            parent = " ".join(proc.parent().cmdline())
        except (psutil.Error, AttributeError):  # ended, a zombie, or no parent any more
            return False
        return any(f"-m {module} " in parent for module in PYTHON_DAEMONS)

    try:
        server = psutil.Process(int(pid_file.read_text().split()[0]))
        return [p for p in server.children(recursive=True) if forked_by_a_daemon(p)]
    except psutil.Error:
        return []


def kill_connect_task_workers() -> int:
    """SIGKILL the `spark_connect` server's task workers (and what they started): a task running
    there fails (``local[2]`` does not retry it). Returns how many were killed."""
    import psutil

    workers = connect_task_workers()
    for w in workers:
        try:
            family = [*w.children(recursive=True), w]
        except psutil.Error:
            continue
        for p in family:
            try:
                p.kill()
            except psutil.Error:
                pass
    return len(workers)


def task_ended(log: str, task_id: str) -> bool:
    return f"end task task_id={task_id} " in log


def per_key(changes: list[dict], field: str = "status") -> dict[int, list[tuple]]:
    """Each key's (op, after[field]) in the order the consumer saw them."""
    out: dict[int, list[tuple]] = collections.defaultdict(list)
    for ch in changes:
        out[ch["key"]["id"]].append((ch["op"], (ch["after"] or {}).get(field)))
    return dict(out)


# --------------------------------------------------------------------------- the tidegate page

PAGE_AUTH_MANAGER = "tests.integration.dag_allowlist_auth.DagAllowListAuthManager"


def page_users(base: Path, access: dict[str, list[str]]) -> tuple[dict[str, str], dict[str, str]]:
    """Users besides admin for a deployment started by scripts/services, each with the role
    ``user`` and rights on the DAGs ``access`` lists for it only (the test auth manager of
    tests/integration/dag_allowlist_auth.py). Returns the environment for `services up airflow`
    and each user's password. The files are mode 600 under ``base``."""
    import secrets

    passwords = {user: secrets.token_urlsafe(12) for user in access}
    for name, content in (("page_passwords.json", passwords), ("page_dag_access.json", access)):
        fd = os.open(base / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(content, f)
    env = {"TIDEGATE_AIRFLOW_AUTH_MANAGER": PAGE_AUTH_MANAGER,
           "TIDEGATE_AIRFLOW_USERS": ",".join(f"{user}:user" for user in access),
           "TIDEGATE_AIRFLOW_PASSWORDS_FILE": str(base / "page_passwords.json"),
           "TIDEGATE_TEST_DAG_ACCESS": str(base / "page_dag_access.json"),
           # The api-server imports the auth manager from this checkout's tests package.
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    return env, passwords


def page_call(url: str, path: str, *, token: str | None = None, cookie: str | None = None,
              form: dict | None = None, headers: dict | None = None) -> tuple[int, dict]:
    """GET (or, with ``form``, POST) a path of the tidegate page as an API client; returns the
    HTTP status and the JSON body."""
    import urllib.error
    import urllib.parse
    import urllib.request

    data = None if form is None else urllib.parse.urlencode(form).encode()
    req = urllib.request.Request(url.rstrip("/") + "/tidegate" + path, data=data,
                                 method="GET" if form is None else "POST",
                                 headers={"Accept": "application/json", **(headers or {})})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if cookie:
        req.add_header("Cookie", f"_token={cookie}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, _json_or_text(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, _json_or_text(exc.read())


def _json_or_text(body: bytes) -> dict:
    try:
        return json.loads(body or b"{}")
    except ValueError:
        return {"text": body.decode(errors="replace")[:2000]}


def browser_login(browser, url: str, user: str, password: str) -> None:
    """Open ``url`` (a page behind Airflow's login), log in through Airflow's login form and
    come back to ``url``."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    browser.get(url)
    wait_for(lambda: "/auth/login" in browser.current_url, 30, "redirect to the login page")
    name = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "input:not([type=password])"), 30,
                 "the login form")[0]
    name.send_keys(user)
    browser.find_element(By.CSS_SELECTOR, "input[type=password]").send_keys(password, Keys.ENTER)
    wait_for(lambda: "/auth/login" not in browser.current_url, 30, "login")
    if browser.current_url.rstrip("/") != url.rstrip("/"):
        browser.get(url)


def wait_for(pred, timeout: float, what: str, every: float = 0.5):
    """``pred()``'s first true value within ``timeout`` seconds; fails naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise AssertionError(f"not within {timeout:.0f}s: {what}")


def chart_bars(svg_element) -> list[tuple[str, str]]:
    """(run id, value) of every bar of a page chart (an SVG WebElement), left to right."""
    from selenium.webdriver.common.by import By

    return [(b.get_attribute("data-run"), b.get_attribute("data-value"))
            for b in svg_element.find_elements(By.CSS_SELECTOR, "rect.bar")]


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
