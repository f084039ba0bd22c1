"""A stalled reader's binlog dump and the reader that takes over, on the real MariaDB.

A run stopped while its binlog dump streams (its socket buffers full) leaves the server's dump
thread blocked writing to it. The server starts another dump of the same replication client id
(the pipeline's ``server_id``) only once that thread is gone, which its ``net_write_timeout``
decides. The reader that takes over waits for its first packet that long (plus a margin), not
just the read timeout (campaign HANGS=past_timeouts, seed 6173: every takeover of a zombie
run failed after the 3 s read timeout, while the stopped run's dump still held the id).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pymysql
import pytest
from tidegate.sources.mysql.binlog_client import BinlogStream

from tests.stopped import stopped

pytestmark = pytest.mark.integration

NET_WRITE_TIMEOUT_S = 6  # the stalled dump's session value: its server gives up on it after this
READ_TIMEOUT_S = 2.0  # the takeover's read timeout: shorter than that wait


def settings(conn) -> dict:
    return {"host": conn.host, "port": conn.port, "user": conn.login, "password": conn.password}


@pytest.fixture()
def backlog(mysql):
    """A binlog file of 40 rows of 2 MB (more than the socket buffers of a stopped reader
    hold); yields (file, position) of its start."""
    db = f"takeover_{uuid.uuid4().hex[:8]}"
    conn = pymysql.connect(**settings(mysql.admin), autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {db}")
            cur.execute(f"CREATE TABLE {db}.t (id INT AUTO_INCREMENT PRIMARY KEY, b MEDIUMTEXT)")
            cur.execute("FLUSH BINARY LOGS")
            cur.execute("SHOW MASTER STATUS")
            file, pos = cur.fetchone()[:2]
            for _ in range(40):
                cur.execute(f"INSERT INTO {db}.t (b) VALUES (%s)", (os.urandom(1_000_000).hex(),))
        yield file, pos
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {db}")
        conn.close()


# A reader that reads five events, then stops itself (SIGSTOP) with its dump streaming.
STALLED_READER = textwrap.dedent("""
    import os, signal, sys
    from tidegate.sources.mysql.binlog_client import BinlogStream
    settings = dict(host=sys.argv[1], port=int(sys.argv[2]), user=sys.argv[3], password=os.environ["PW"])
    for n, _ in enumerate(BinlogStream(settings, int(sys.argv[4]), sys.argv[5], int(sys.argv[6]),
                                       read_timeout=60), 1):
        if n == 5:
            print("stalled", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
""")


@pytest.fixture()
def short_net_write_timeout(mysql):
    """The server's net_write_timeout, NET_WRITE_TIMEOUT_S for the sessions opened meanwhile (a
    session takes the global value when it connects): the stalled dump's is short, the test too."""
    conn = pymysql.connect(**settings(mysql.admin), autocommit=True)
    with conn.cursor() as cur:
        cur.execute("SELECT @@global.net_write_timeout")
        (before,) = cur.fetchone()

    def restore() -> None:
        with conn.cursor() as cur:
            cur.execute(f"SET GLOBAL net_write_timeout = {int(before)}")

    with conn.cursor() as cur:
        cur.execute(f"SET GLOBAL net_write_timeout = {NET_WRITE_TIMEOUT_S}")
    try:
        yield restore
    finally:
        restore()
        conn.close()


def events(conn, server_id: int, file: str, pos: int) -> tuple[int, float]:
    """(events read, seconds until the first) by a reader with the takeover's read timeout."""
    stream = BinlogStream(settings(conn), server_id, file, pos, read_timeout=READ_TIMEOUT_S)
    began, first, n = time.monotonic(), None, 0
    try:
        for _ in stream:
            first = first or time.monotonic() - began
            n += 1
    finally:
        stream.close()
    return n, first or 0.0


def test_takeover_waits_for_the_stalled_dump_of_its_server_id(mysql, backlog, short_net_write_timeout,
                                                               caplog):
    file, pos = backlog
    server_id = 880_000 + os.getpid() % 10_000
    alone, _ = events(mysql.cdc, server_id + 1, file, pos)  # the range as a reader of another id reads it
    env = {**os.environ, "PW": mysql.cdc.password}
    reader = subprocess.Popen([sys.executable, "-c", STALLED_READER, mysql.cdc.host, str(mysql.cdc.port),
                               mysql.cdc.login, str(server_id), file, str(pos)],
                              env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "stalled"
        short_net_write_timeout()  # the server's default again: the takeover waits its own figure
        time.sleep(0.5)  # the stopped reader's socket buffers fill; the dump thread blocks writing
        with stopped([reader.pid]), caplog.at_level(logging.INFO):
            n, first = events(mysql.cdc, server_id, file, pos)
        # every event of the range, once the server dropped the stalled dump: not before its
        # net_write_timeout, and past the read timeout, which no longer fails the takeover
        assert n == alone > 80
        assert NET_WRITE_TIMEOUT_S - 1 < first < NET_WRITE_TIMEOUT_S + 15
        assert any(f"replication client id {server_id} after" in r.getMessage() for r in caplog.records)
    finally:
        reader.send_signal(signal.SIGCONT)
        reader.kill()
        reader.wait()
