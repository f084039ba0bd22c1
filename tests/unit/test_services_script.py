"""scripts/services refuses to start a server on a port something else holds, or on a data
folder a server of its own already runs on.

A test run leaves its servers up (the next run reuses them), so a second checkout running on
the same lane meets the first one's servers on its ports. Starting would fail to bind, or a
health check might take the other checkout's server (other credentials) for its own. A start
cut short leaves a server without its pid file: a second one on the same data corrupts it."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_up_names_the_held_port_instead_of_starting(tmp_path):
    with socket.socket() as held:  # a listener that is not this folder's Redis
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        env = {**os.environ, "TIDEGATE_SERVICES_DIR": str(tmp_path / "services"), "TIDEGATE_LANE": "0",
               "TIDEGATE_REDIS_PORT": str(busy)}
        r = subprocess.run([sys.executable, str(ROOT / "scripts" / "services"), "up", "redis"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert r.returncode != 0, r.stderr
    assert f"redis: port {busy} on 127.0.0.1 is held by a process that is not this folder's redis" in r.stderr
    assert "TIDEGATE_LANE=N" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "services" / "redis" / "pid").exists()  # nothing was started


def test_up_names_a_server_already_running_on_its_data_without_a_pid_file(tmp_path):
    """As after a `services up` killed mid-start: the server it launched runs on, with no pid
    file. A second Kafka on the same folder tore its metadata log (CorruptRecordException)."""
    env = {**os.environ, "TIDEGATE_SERVICES_DIR": str(tmp_path / "services"), "TIDEGATE_LANE": "0"}
    script = [sys.executable, str(ROOT / "scripts" / "services")]
    where = subprocess.run([*script, "env"], env=env, capture_output=True, text=True, check=True).stdout
    base = next(shlex.split(line.partition("=")[2])[0] for line in where.splitlines()
                if line.startswith("export TIDEGATE_SERVICES_DIR="))
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)",
                               f"{base}/redis/redis.conf"])
    try:
        r = subprocess.run([*script, "up", "redis"], env=env, capture_output=True, text=True, timeout=120)
    finally:
        orphan.kill()
        orphan.wait()
    assert r.returncode != 0, r.stderr
    assert f"redis: process {orphan.pid} already runs on {base}/redis without its pid file" in r.stderr
    assert f"kill {orphan.pid}" in r.stderr and "Traceback" not in r.stderr
    assert not (Path(base) / "redis" / "pid").exists()  # nothing was started
