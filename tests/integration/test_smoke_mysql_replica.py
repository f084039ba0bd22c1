"""The GTID replica applies the primary's writes under the same GTIDs (failover tests need it)."""

from __future__ import annotations

import time
import uuid

import pymysql
import pytest

pytestmark = pytest.mark.integration


def test_write_on_primary_appears_on_replica_with_same_gtid(mysql, mysql_replica):
    name = "smoke_" + uuid.uuid4().hex[:8]
    primary = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    replica = pymysql.connect(**mysql_replica.mysql_kwargs(autocommit=True))
    try:
        with primary.cursor() as c:
            c.execute(f"CREATE DATABASE {name}")
            c.execute(f"CREATE TABLE {name}.t (id INT PRIMARY KEY, v VARCHAR(10))")
            c.execute(f"INSERT INTO {name}.t VALUES (1, 'replicated')")
            c.execute("SELECT @@last_gtid")
            gtid = c.fetchone()[0]
        domain, server_id, seq = gtid.split("-")
        assert server_id == "1"
        deadline = time.monotonic() + 20
        while True:
            with replica.cursor() as c:
                c.execute("SELECT @@gtid_slave_pos, @@gtid_binlog_pos, @@server_id")
                slave_pos, binlog_pos, replica_server_id = c.fetchone()
            if gtid in slave_pos.split(","):
                break
            assert time.monotonic() < deadline, f"replica did not apply {gtid}: at {slave_pos}"
            time.sleep(0.1)
        assert replica_server_id == 2
        # log_slave_updates: the replica's own binlog carries the primary's GTID unchanged,
        # which is what lets a checkpoint's GTID set resume on it after a failover.
        assert gtid in binlog_pos.split(",")
        with replica.cursor() as c:
            c.execute(f"SELECT id, v FROM {name}.t")
            assert c.fetchall() == ((1, "replicated"),)
    finally:
        with primary.cursor() as c:
            c.execute(f"DROP DATABASE IF EXISTS {name}")
        primary.close()
        replica.close()
