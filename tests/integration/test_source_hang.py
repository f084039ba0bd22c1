"""A source server that hangs rather than dies, while `tidegate run` reads it: every process of
the server SIGSTOPped mid-read for longer than the reader's timeout (TIDEGATE_SOURCE_READ_TIMEOUT_S),
then SIGCONTed. A stopped server's kernel still accepts and acknowledges, so no connection ever
breaks: only a timeout of the reader's own ends the wait. The run must end on its own while the
server is still stopped, naming the setting; the runs after it deliver every change exactly once
to Kafka (exactly-once), NATS and Redis, in commit order per key.

The pipelines, workload and readers are the fault matrix's (test_fault_matrix.py): 6 KB rows, and
a wave of 3,000 rows (about 4,600 changes, over 40 MB of log), so a run's range is more than the
sockets' buffers hold (Linux grows a loopback receive buffer up to net.ipv4.tcp_rmem's maximum,
32 MiB here, beside a 4 MiB send buffer) and the hang meets the read mid-range. With 600 rows
(about 6 MB) a fast run read its whole range from the buffers before the hang (a fresh-clone run:
"92 sub-batches committed of ~92").
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.integration.test_fault_matrix import (  # noqa: F401 - cdc, *_pipeline: fixtures
    SUB_BATCH,
    Pipeline,
    assert_exactly_once,
    cdc,
    explained_failure,
    mysql_pipeline,
    postgres_pipeline,
    server_pid,
    wait_for,
)
from tests.stopped import stopped

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

READ_TIMEOUT_S = 5  # the runs' TIDEGATE_SOURCE_READ_TIMEOUT_S; the hang lasts far longer
WAVE_ROWS = 3000  # rows of the wave the hung run reads (see the module docstring)


def server_processes(name: str) -> list[int]:
    """The server's process and its children (PostgreSQL: backends and WAL senders)."""
    pid = server_pid(name)
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid, *map(int, children)]


def hang_mid_read(p: Pipeline, server: str) -> str:
    """Hang ``server`` mid-read; the hung run's last words (the caller checks what they name)."""
    p.cdc.env["TIDEGATE_SOURCE_READ_TIMEOUT_S"] = str(READ_TIMEOUT_S)
    p.run_ok("place")
    p.work.wave(WAVE_ROWS)
    wave = p.work.changes
    run = p.start(f"hang_{server}")
    try:
        wait_for(lambda: p.writes(run.run_id) >= 2, "2 sub-batches committed", run=run)
        with stopped(server_processes(server)):
            since = time.monotonic()
            hang_s = 3 * READ_TIMEOUT_S + 30
            while run.proc.poll() is None and time.monotonic() - since < hang_s:
                time.sleep(0.2)
            assert run.proc.poll() is not None, (
                f"the run still waits on {server}, stopped {hang_s}s ago:\n" + run.output()[-3000:])
            took = time.monotonic() - since
    finally:
        run.signal(signal.SIGKILL)
    ended = "ok" if run.proc.returncode == 0 else explained_failure(run.output())
    committed = p.writes(run.run_id)
    print(f"{server} hung: the run ended {took:.1f}s after the stop, {committed} sub-batches committed "
          f"of ~{wave // SUB_BATCH}: {ended}")
    assert committed * SUB_BATCH < wave, "the hang met the read after the whole range was read"
    assert "TIDEGATE_SOURCE_READ_TIMEOUT_S" in ended, ended
    # The runs after it read with the default timeout: a bound that takes a while to flush
    # (PostgreSQL: up to the next standby snapshot, ~15 s) is no hang.
    del p.cdc.env["TIDEGATE_SOURCE_READ_TIMEOUT_S"]
    p.db.reconnect()
    p.work.wave(60)
    later = p.catch_up(f"after_hang_{server}")
    print(f"the runs after it: {later or 'ok'}")
    assert_exactly_once(p, f"{server} SIGSTOP mid-read")
    return ended


def test_mariadb_hangs_mid_read(mysql_pipeline):  # noqa: F811 - the imported fixture
    ended = hang_mid_read(mysql_pipeline, "mysql")
    assert "TIDEGATE_SOURCE_READ_TIMEOUT_S" in ended, ended


def test_postgres_hangs_mid_read(postgres_pipeline):  # noqa: F811 - the imported fixture
    ended = hang_mid_read(postgres_pipeline, "postgres")
    assert "TIDEGATE_SOURCE_READ_TIMEOUT_S" in ended, ended
