"""The faults, real ones: signals to the `tidegate run` process group (SIGKILL, SIGSTOP then
SIGCONT, a zombie woken after takeover runs), to the servers (kill -9 and restart, SIGSTOP then
SIGCONT) and, for a run delivered by a Spark task, to the task's Python worker and its
executor's JVM. The servers' processes are found and restarted through `scripts/services`, as in
tests/integration/test_fault_matrix.py, whose helpers these reuse."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import redis

from tests.conftest import services_cmd
from tests.integration.sink_readers import redis_client
from tests.integration.test_fault_matrix import (  # noqa: F401 - backup_redis, restore_redis: faults too
    backup_redis,
    gone,
    restarted,
    restore_redis,
    server_pid,
    stop_server,
    store_writable,
)
from tests.stopped import stopped


def server_name(role: str, source: str) -> str:
    """The `scripts/services` name of a server role: the store's PostgreSQL is the test
    PostgreSQL (a database of its own on it)."""
    if role == "source":
        return source
    return "postgres" if role == "store" else role


def kill_server(name: str, hold: float) -> None:
    """kill -9 (PostgreSQL: SIGQUIT, its immediate shutdown: every backend killed at once and WAL
    recovery on the next start, as after a crash; a SIGKILLed postmaster would leave its backends
    running), ``hold`` seconds down, then started again and waited for until healthy."""
    sig = signal.SIGQUIT if name == "postgres" else signal.SIGKILL
    with restarted(name):
        stop_server(name, sig)
        time.sleep(hold)


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (a PostgreSQL postmaster's backends: stopping the postmaster
    alone would leave every open connection served)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(") ", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def hang_server(name: str, hold: float) -> None:
    """SIGSTOP the server (and its children) for ``hold`` seconds, then SIGCONT. A child that ends
    between the listing and its signal (a PostgreSQL backend whose client left: seed 5793, with a
    resnapshot's chunk readers coming and going) is passed over; whatever was stopped is woken."""
    with stopped(process_tree(server_pid(name))):
        time.sleep(hold)


def stop_clean(run, writes: Callable[[], int], store_free: Callable[[], bool]) -> bool:
    """SIGSTOP the run right after it committed another sub-batch, holding no store lock (a writer
    stopped inside a store transaction would block every other one: not the fault under test).
    False when the run ended first."""
    for _ in range(20):
        seen = writes()
        while writes() == seen:
            if run.proc.poll() is not None:
                return False
        run.signal(signal.SIGSTOP)
        if store_free():
            return True
        run.signal(signal.SIGCONT)
    return False


def sqlite_free(path: Path) -> Callable[[], bool]:
    return lambda: store_writable(path)


def postgres_store_free(admin_connect: Callable[[], object], dbname: str) -> Callable[[], bool]:
    """No session of the store's database inside a transaction."""
    def free() -> bool:
        conn = admin_connect()
        try:
            with conn.cursor() as c:
                c.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND state LIKE "
                          "'idle in transaction%%' OR (datname = %s AND state = 'active' AND "
                          "pid <> pg_backend_pid())", (dbname, dbname))
                return c.fetchone()[0] == 0
        finally:
            conn.close()
    return free


__all__ = ["gone", "hang_server", "kill_server", "postgres_store_free", "process_tree", "server_name",
           "sqlite_free", "stop_clean"]


# --------------------------------------------------------------------------- a run on an executor


def executors() -> list[psutil.Process]:
    """The executor JVMs of the `spark` service's standalone cluster (its worker's children): in
    the campaign, those of the `spark_connect_cluster` server, the one application there."""
    out = services_cmd("status", check=False).stdout
    found = re.search(r"^spark\s.*\bworker (\d+)\)", out, re.M)
    assert found, f"the spark service's worker is not up:\n{out}"
    return [p for p in psutil.Process(int(found.group(1))).children()
            if "CoarseGrainedExecutorBackend" in command_line(p)]


def command_line(proc: psutil.Process) -> str:
    """``proc``'s command line; empty for one that ended or is a zombie not yet reaped (the
    worker JVM has such children)."""
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def delivering_workers(ports: set[int]) -> list[psutil.Process]:
    """The executors' Python processes connected to one of ``ports`` (the source's, the sinks'),
    outermost first: the delivery task's worker (and the reader process it started)."""
    found = []
    for executor in executors():
        for proc in executor.children(recursive=True):
            try:
                if any(c.raddr and c.raddr.port in ports for c in proc.net_connections("tcp")):
                    found.append(proc)
            except psutil.Error:  # ended meanwhile
                continue
    pids = {p.pid for p in found}
    return sorted(found, key=lambda p: p.ppid() in pids)


def kill_delivery_worker(ports: set[int]) -> int:
    """SIGKILL the delivery task's Python worker (Spark retries the task); returns how many
    processes were found delivering (0: the task had ended)."""
    workers = delivering_workers(ports)
    if workers:
        workers[0].kill()
    return len(workers)


def kill_executors() -> int:
    """SIGKILL the executor JVMs (only them: their Python workers learn it as they can); the
    cluster's worker starts another for the application. Returns how many were killed."""
    found = executors()
    for jvm in found:
        jvm.kill()
    return len(found)


def stall_delivery(ports: set[int], hold: float) -> int:
    """SIGSTOP the delivery task's worker and its reader for ``hold`` seconds, then SIGCONT."""
    workers = delivering_workers(ports)
    for p in workers:
        p.suspend()
    try:
        time.sleep(hold)
    finally:
        for p in reversed(workers):
            try:
                p.resume()
            except psutil.Error:
                pass
    return len(workers)


def retype_stream(conn, key: str) -> None:
    """Another client's mistake: the stream ``key`` renamed aside and a string set in its place,
    in one MULTI/EXEC under WATCH (no XADD of the run lands between them to make a new stream)."""
    with redis_client(conn) as r, r.pipeline(transaction=True) as tx:
        while True:
            try:
                tx.watch(key)
                there = tx.exists(key)
                tx.multi()
                if there:
                    tx.rename(key, key + ":aside")
                tx.set(key, "not a stream")
                tx.execute()
                return
            except redis.WatchError:  # the run wrote the stream meanwhile: again
                continue


def restore_stream(conn, key: str) -> None:
    """The operator's repair of :func:`retype_stream` once the run has ended: the string
    removed, the stream put back."""
    with redis_client(conn) as r, r.pipeline(transaction=True) as tx:
        tx.delete(key)
        if r.exists(key + ":aside"):
            tx.rename(key + ":aside", key)
        tx.execute()



def delta_version(table: Path) -> int | None:
    """The newest version of the Delta table at ``table`` (None: no table yet), from its log."""
    versions = [int(f.stem) for f in (table / "_delta_log").glob("*.json")]
    return max(versions, default=None)


# A client of the campaign's Spark Connect server, in a process of its own (a Connect session
# marks the process that opens one, which later local sessions of a pytest worker cannot have).
_RESTORE = """
import json, os, sys
from pyspark.sql import SparkSession
conn = json.loads(os.environ["AIRFLOW_CONN_SPARK_CONNECT"])
spark = SparkSession.builder.remote(f"{conn['host']}:{conn['port']}").create()
spark.sql(sys.argv[1])
spark.stop()
"""


def restore_delta(table: Path, version: int, env: dict[str, str]) -> None:
    """The Delta table at ``table`` taken back to ``version`` by `RESTORE TABLE` (Delta's undo), as
    an operator runs it, on the campaign's Spark Connect server: what the sinks committed to it
    after that version is gone, their checkpoint tables untouched."""
    stmt = f"RESTORE TABLE delta.`{table}` TO VERSION AS OF {version}"
    for _ in range(5):  # a commit of the run in between: the operator runs it again
        done = subprocess.run([sys.executable, "-c", _RESTORE, stmt], env=env, capture_output=True,
                              text=True, timeout=300)
        if done.returncode == 0:
            return
        said = "\n".join(ln for ln in done.stderr.splitlines() if not ln.lstrip().startswith("at "))
        if "CONCURRENT" not in said.upper():
            break
    raise RuntimeError(f"{stmt} failed: {said[-2000:]}")
