"""MariaDB does what the binlog source relies on: row metadata, GTIDs, XIDs, resume, purge."""

from __future__ import annotations

import time
import uuid

import pymysql
import pytest
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import MariadbGtidEvent, XidEvent
from pymysqlreplication.row_event import WriteRowsEvent

pytestmark = pytest.mark.integration


@pytest.fixture()
def db(mysql):
    name = "smoke_" + uuid.uuid4().hex[:8]
    conn = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    with conn.cursor() as c:
        c.execute(f"CREATE DATABASE {name}")
        c.execute(f"CREATE TABLE {name}.orders (id INT PRIMARY KEY, status VARCHAR(20))")
        c.execute(f"CREATE TABLE {name}.items (id INT PRIMARY KEY, order_id INT, sku VARCHAR(20))")
    yield conn, name
    with conn.cursor() as c:
        c.execute(f"DROP DATABASE {name}")
    conn.close()


def head(conn) -> tuple[str, int]:
    with conn.cursor() as c:
        c.execute("SHOW MASTER STATUS")
        file, pos = c.fetchone()[:2]
    return file, int(pos)


def read(mysql, schema: str, file: str, pos: int) -> list:
    """Events of `schema` from (file, pos) to the current end of the binlog."""
    c = mysql.cdc
    stream = BinLogStreamReader(
        connection_settings=dict(host=c.host, port=c.port, user=c.login, passwd=c.password),
        server_id=48000 + uuid.uuid4().int % 1000, blocking=False, resume_stream=True,
        log_file=file, log_pos=pos, only_events=[MariadbGtidEvent, WriteRowsEvent, XidEvent],
    )
    out = []
    try:
        for ev in stream:
            if isinstance(ev, WriteRowsEvent):
                if ev.schema == schema:
                    out.extend(("row", ev.table, r["values"]) for r in ev.rows)
            elif isinstance(ev, MariadbGtidEvent):
                out.append(("gtid", ev.gtid))
            else:
                out.append(("xid", ev.xid))
    finally:
        stream.close()
    return out


def purge_to(conn, file: str, timeout: float = 20.0) -> None:
    """PURGE BINARY LOGS TO file. MariaDB keeps a binlog until its binlog checkpoint has passed
    (InnoDB has flushed the commits it holds) and while a replica still reads it, so retry."""
    deadline = time.monotonic() + timeout
    with conn.cursor() as c:
        while True:
            c.execute(f"PURGE BINARY LOGS TO '{file}'")
            c.execute("SHOW BINARY LOGS")
            files = [r[0] for r in c.fetchall()]
            if files[0] == file:
                return
            assert time.monotonic() < deadline, f"binlogs before {file} not purged: {files}"
            c.execute("FLUSH ENGINE LOGS")
            time.sleep(0.2)


def test_multi_table_transaction_with_column_names_gtid_and_xid(mysql, db):
    conn, name = db
    file, pos = head(conn)
    with conn.cursor() as c:
        c.execute("BEGIN")
        c.execute(f"INSERT INTO {name}.orders VALUES (1, 'new'), (2, 'paid')")
        c.execute(f"INSERT INTO {name}.items VALUES (10, 1, 'sku-a')")
        c.execute("COMMIT")
        c.execute("SELECT @@last_gtid")
        gtid = c.fetchone()[0]
    events = read(mysql, name, file, pos)
    assert events[0] == ("gtid", gtid)
    assert events[1:4] == [
        ("row", "orders", {"id": 1, "status": "new"}),
        ("row", "orders", {"id": 2, "status": "paid"}),
        ("row", "items", {"id": 10, "order_id": 1, "sku": "sku-a"}),
    ]
    assert events[4][0] == "xid" and isinstance(events[4][1], int) and events[4][1] > 0
    assert len(events) == 5


def test_resume_from_saved_position_returns_exactly_the_later_events(mysql, db):
    conn, name = db
    file, pos = head(conn)
    with conn.cursor() as c:
        c.execute(f"INSERT INTO {name}.orders VALUES (1, 'first')")
        saved = head(conn)
        c.execute(f"INSERT INTO {name}.orders VALUES (2, 'second')")
        c.execute(f"INSERT INTO {name}.orders VALUES (3, 'third')")
    rows = [e[2] for e in read(mysql, name, *saved) if e[0] == "row"]
    assert rows == [{"id": 2, "status": "second"}, {"id": 3, "status": "third"}]
    everything = [e[2]["id"] for e in read(mysql, name, file, pos) if e[0] == "row"]
    assert everything == [1, 2, 3]


def test_reading_a_purged_binlog_file_raises_1236(mysql, db):
    conn, name = db
    old_file, _ = head(conn)
    with conn.cursor() as c:
        c.execute(f"INSERT INTO {name}.orders VALUES (1, 'before purge')")
        c.execute("FLUSH BINARY LOGS")
        new_file, _ = head(conn)
    purge_to(conn, new_file)
    with pytest.raises(pymysql.err.OperationalError) as err:
        read(mysql, name, old_file, 4)
    assert err.value.args[0] == 1236
    assert "Could not find first log file name" in err.value.args[1]
