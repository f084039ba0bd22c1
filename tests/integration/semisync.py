"""A MariaDB commit held by semi-synchronous replication with no replica: in the binlog, not yet
visible. The settings are global to the server, which the test workers share: one test turning
semi-sync off releases the commit another test holds ("visible already"). So a test holds the
server's semi-sync lock (a file lock named for the server's port) from turning it on until it
turns it off."""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Callable
from pathlib import Path

SETTINGS = ("rpl_semi_sync_master_wait_point = 'AFTER_SYNC'", "rpl_semi_sync_master_timeout = 600000",
            "rpl_semi_sync_master_wait_no_slave = ON")


class SemiSync:
    """``on()`` takes the lock and turns semi-sync on; ``off()`` turns it off and lets the lock go
    (idempotent: a test's release and its ``finally`` both call it)."""

    def __init__(self, port: int, sql: Callable[[str], object]):
        self.path = Path(tempfile.gettempdir()) / f"tidegate-semisync-{port}.lock"
        self.sql = sql
        self.held = None

    def on(self) -> None:
        if self.held is None:
            self.held = open(self.path, "w")  # noqa: SIM115 - held until off()
            fcntl.flock(self.held, fcntl.LOCK_EX)
        for setting in SETTINGS:
            self.sql(f"SET GLOBAL {setting}")
        self.sql("SET GLOBAL rpl_semi_sync_master_enabled = ON")

    def off(self) -> None:
        self.sql("SET GLOBAL rpl_semi_sync_master_enabled = OFF")
        if self.held is not None:
            fcntl.flock(self.held, fcntl.LOCK_UN)
            self.held.close()
            self.held = None
