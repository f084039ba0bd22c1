"""scripts/services refuses to start a server on a port something else holds.

A test run leaves its servers up (the next run reuses them), so a second checkout running on
the same lane meets the first one's servers on its ports. Starting would fail to bind, or a
health check might take the other checkout's server (other credentials) for its own."""

from __future__ import annotations

import os
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
