"""The MySQL/MariaDB binlog source against the real MariaDB of scripts/services.

Each test works in its own database, reads only from the head it took at its start, and uses
its own replication client id, so tests of other engineers can share the server.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid

import pymysql
import pytest
from tidegate.batching import cut_sub_batches
from tidegate.errors import PositionPurgedError, SourceSettingError
from tidegate.events import ChangeEvent, PositionMark, is_control
from tidegate.sources import make_source
from tidegate.sources.mysql.failover import GtidsNotOnServerError
from tidegate.sources.mysql.position import BinlogPosition, GtidSet
from tidegate.sources.mysql.preflight import check_settings, settings_problems
from tidegate.sources.mysql.source import MySqlSource
from tidegate.spec import PipelineSpec, SourceSpec

pytestmark = pytest.mark.integration


# --------------------------------------------------------------------------- helpers


def make_spec(tables=(), pipeline="src_test") -> PipelineSpec:
    return PipelineSpec(pipeline=pipeline, tenant="acme", sinks=(),
                        source=SourceSpec(kind="mysql", conn_id="cdc_mysql", tables=tuple(tables),
                                          server_id=random.randint(100_000, 2_000_000_000)))


@pytest.fixture()
def admin(mysql):
    conn = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    yield conn
    conn.close()


@pytest.fixture()
def db(admin):
    name = "srcm_" + uuid.uuid4().hex[:10]
    ex(admin, f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
    yield name
    ex(admin, f"DROP DATABASE IF EXISTS {name}")


def ex(conn, *sqls):
    with conn.cursor() as c:
        for sql in sqls:
            c.execute(sql)
        return c.fetchall()


def tx(conn, *sqls):
    ex(conn, "BEGIN", *sqls, "COMMIT")


def source(mysql, tables, cdc=True) -> MySqlSource:
    src = make_source(make_spec(tables), mysql.cdc if cdc else mysql.admin)
    assert isinstance(src, MySqlSource)
    return src


def rows(items):
    return [i for i in items if isinstance(i, ChangeEvent)]


def fingerprint(items):
    """Everything that must be identical between reads: the bytes of every row and control
    message, boundaries, end positions."""
    return [(e.value, e.tx_end, e.end_position.to_json() if e.end_position else None)
            for e in items if not isinstance(e, PositionMark)]


def purge_to(conn, file: str, timeout: float = 20.0) -> None:
    """PURGE BINARY LOGS TO file (MariaDB keeps a binlog until its checkpoint passed: retry)."""
    deadline = time.monotonic() + timeout
    while True:
        ex(conn, f"PURGE BINARY LOGS TO '{file}'")
        files = [r[0] for r in ex(conn, "SHOW BINARY LOGS")]
        if files[0] >= file:
            return
        assert time.monotonic() < deadline, f"binlogs before {file} not purged: {files}"
        ex(conn, "FLUSH ENGINE LOGS")
        time.sleep(0.2)


# --------------------------------------------------------------------------- types

TYPES_DDL = """CREATE TABLE {db}.types (
  id INT PRIMARY KEY,
  ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED,
  mi MEDIUMINT, miu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED,
  de DECIMAL(30,10), de0 DECIMAL(5,0), f FLOAT, dbl DOUBLE,
  ch CHAR(10), vc VARCHAR(500), tx TEXT, bl BLOB, bn BINARY(4), vb VARBINARY(16),
  d DATE, t TIME(6), tneg TIME(3), dt DATETIME(6), ts TIMESTAMP(3) NULL, y YEAR,
  e ENUM('small','large'), s SET('a','b','c'), s0 SET('a','b'), b1 BIT(1), b10 BIT(10), j JSON,
  n INT NULL
) CHARACTER SET utf8mb4"""

TYPES_ROW = """INSERT INTO {db}.types VALUES (
  1, -128, 255, -32768, 65535, -8388608, 16777215, -2147483648, 4294967295,
  -9223372036854775808, 18446744073709551615,
  '-12345678901234567890.0123456789', 99999, 3.14, 2.718281828459045,
  'ch', 'héllo wörld 😀🎉', 'tëxt ✓ 𝄞', x'00ff10', x'0102', x'deadbeef',
  '2024-02-29', '838:59:59.999999', '-01:02:03.250', '2024-01-02 03:04:05.123456',
  '2024-01-02 03:04:05.678', 2155, 'large', 'a,c', '', b'1', b'1010101010',
  '{{"k": [1, 2.5, "x"], "n": null}}', NULL)"""

TYPES_EXPECTED = {
    "id": 1, "ti": -128, "tiu": 255, "si": -32768, "siu": 65535, "mi": -8388608, "miu": 16777215,
    "i": -2147483648, "iu": 4294967295, "bi": -9223372036854775808, "biu": 18446744073709551615,
    "de": "-12345678901234567890.0123456789", "de0": "99999", "f": 3.14, "dbl": 2.718281828459045,
    "ch": "ch", "vc": "héllo wörld 😀🎉", "tx": "tëxt ✓ 𝄞", "bl": "AP8Q", "bn": "AQIAAA==",
    "vb": "3q2+7w==", "d": "2024-02-29", "t": "838:59:59.999999", "tneg": "-01:02:03.250000",
    "dt": "2024-01-02T03:04:05.123456", "ts": "2024-01-02T03:04:05.678000+00:00", "y": 2155,
    "e": "large", "s": ["a", "c"], "s0": [], "b1": "1", "b10": "1010101010",
    "j": '{"k": [1, 2.5, "x"], "n": null}', "n": None,
}


def test_every_listed_type_has_its_exact_json_value(mysql, admin, db):
    src = source(mysql, [f"{db}.types"])
    ex(admin, TYPES_DDL.format(db=db), "SET time_zone = '+00:00'")
    start = src.head()
    ex(admin, TYPES_ROW.format(db=db))
    ex(admin, f"INSERT INTO {db}.types (id) VALUES (2)")
    got = rows(src.read(start, src.head()))
    assert [e.op for e in got] == ["c", "c"]
    assert got[0].after == TYPES_EXPECTED
    assert got[0].key == {"id": 1}
    assert got[1].after == {k: (2 if k == "id" else None) for k in TYPES_EXPECTED}
    # the value sinks receive is valid JSON with the same values
    assert json.loads(got[0].value)["after"] == TYPES_EXPECTED
    src.close()


# --------------------------------------------------------------------------- workload


def workload_phase(admin, db: str, phase: int, big: int = 0) -> int:
    """Inserts, updates, deletes, a multi-table transaction and (optionally) one big
    transaction. Returns the number of row changes in the included tables."""
    base = phase * 1_000_000
    n = 0
    for k in range(20):  # single-row autocommit inserts
        ex(admin, f"INSERT INTO {db}.orders VALUES ({base + k}, 'new', {k}.50)")
        n += 1
    ex(admin, f"UPDATE {db}.orders SET status = 'paid' WHERE id BETWEEN {base} AND {base + 9}")
    n += 10
    ex(admin, f"DELETE FROM {db}.orders WHERE id BETWEEN {base + 15} AND {base + 19}")
    n += 5
    tx(admin, f"INSERT INTO {db}.orders VALUES ({base + 100}, 'multi', 1.00)",
       f"INSERT INTO {db}.items VALUES ({base + 100}, {base + 100}, 'sku-1'), "
       f"({base + 101}, {base + 100}, 'sku-2')",
       f"INSERT INTO {db}.ignored VALUES ({base + 100})",  # filtered table inside the tx
       f"UPDATE {db}.orders SET status = 'shipped' WHERE id = {base + 100}")
    n += 4
    ex(admin, f"INSERT INTO {db}.ignored VALUES ({base + 200})")  # tx with only filtered rows
    if big:
        tx(admin, f"INSERT INTO {db}.items SELECT {base} + 10000 + seq, seq, CONCAT('bulk-', seq) "
                  f"FROM seq_1_to_{big}")
        n += big
    return n


def create_workload_tables(admin, db):
    ex(admin, f"CREATE TABLE {db}.orders (id BIGINT PRIMARY KEY, status VARCHAR(20), total DECIMAL(10,2))",
       f"CREATE TABLE {db}.items (id BIGINT PRIMARY KEY, order_id BIGINT, sku VARCHAR(40))",
       f"CREATE TABLE {db}.ignored (id BIGINT PRIMARY KEY)")


def test_three_bounded_runs_equal_one_read_and_slices_equal_sequential(mysql, admin, db):
    create_workload_tables(admin, db)
    src = source(mysql, [f"{db}.orders", f"{db}.items"])
    h = [src.head()]
    expected = 0
    for phase in range(3):
        expected += workload_phase(admin, db, phase, big=50_000 if phase == 1 else 0)
        if phase == 1:
            ex(admin, f"ALTER TABLE {db}.orders ADD INDEX by_status (status)")  # a schema change
        ex(admin, "FLUSH BINARY LOGS")  # each phase ends in its own binlog file
        expected += workload_phase(admin, db, phase + 10)
        h.append(src.head())

    whole = list(src.read(h[0], h[3]))
    runs = [list(src.read(h[i], h[i + 1])) for i in range(3)]
    assert fingerprint(whole) == fingerprint(runs[0] + runs[1] + runs[2])
    events = rows(whole)
    assert len(events) == expected
    assert len({e.idempotency_key for e in events}) == expected  # nothing twice
    assert {e.table for e in events} == {"orders", "items"}
    # boundaries: every transaction's rows are contiguous, end with tx_end, end positions rise
    ends = [e.end_position for e in events if e.tx_end]
    assert ends == sorted(ends) and len(set(ends)) == len(ends)
    seen_tx, current = set(), None
    for e in events:
        if e.tx_id != current:
            assert e.tx_id not in seen_tx
            seen_tx.add(e.tx_id)
            current = e.tx_id
            assert e.total_order == 1
    big_tx = [e for e in events if e.event_id and e.table == "items" and e.after
              and str(e.after["sku"]).startswith("bulk-")]
    assert len(big_tx) == 50_000 and len({e.tx_id for e in big_tx}) == 1
    # a run ends at its bound: the last item of each run is at or before it
    for i, run in enumerate(runs):
        last = run[-1]
        pos = last.position if isinstance(last, PositionMark) else last.end_position
        assert pos <= h[i + 1]
    # end positions carry the executed GTID set at that point, and identity
    for e in ends[:3] + ends[-3:]:
        assert e.gtid_set == src.gtid_at(e.file, e.pos)
        assert e.server_id == src.identity()["server_id"]
    # tx ids are MariaDB GTIDs
    assert all(e.tx_id.count("-") == 2 for e in events)

    # per-file slices (read in parallel threads) concatenated equal the sequential read
    slices = src.slices(h[0], h[3])
    assert len(slices) >= 3
    assert slices[0][0] == h[0] and slices[-1][1] == h[3]
    results: dict[int, list] = {}

    def read_one(k, frm, to):
        s = source(mysql, [f"{db}.orders", f"{db}.items"])
        results[k] = list(s.read_slice(frm, to, index=k))
        s.close()

    threads = [threading.Thread(target=read_one, args=(k, a, b)) for k, (a, b) in enumerate(slices)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    concatenated = [x for k in range(len(slices)) for x in results[k]]
    assert fingerprint(concatenated) == fingerprint(whole)
    assert sum(is_control(i) for i in whole) == 1

    # a small slice size cuts the files further, at transaction boundaries inside them (the
    # 50k-row transaction stays whole); read one after the other, the slices give the same items
    fine_src = MySqlSource(make_spec([f"{db}.orders", f"{db}.items"]), mysql.cdc, slice_bytes=4096)
    fine = fine_src.slices(h[0], h[3])
    assert len(fine) > len(slices) + 3
    assert fine[0][0] == h[0] and fine[-1][1] == h[3]
    pairs = list(zip(fine, fine[1:], strict=False))
    assert all(a1 == b0 or (a1.file_seq < b0.file_seq and b0.pos == 4) for (_, a1), (b0, _) in pairs)
    cuts = [a1 for (_, a1), (b0, _) in pairs if a1 == b0]  # inside a file
    assert len(cuts) >= 3
    assert src.slices(h[0], h[3], max_bytes=4096) == fine  # a reader's limit cuts the same way
    fine_items = [x for k, (a, b) in enumerate(fine) for x in fine_src.read_slice(a, b, index=k)]
    assert fingerprint(fine_items) == fingerprint(whole)
    fine_src.close()

    # read in a child process (tidegate run), the items are the same, rebuilt from their bytes
    from tidegate.reader_process import read_in_child

    shipped = list(read_in_child(src, h[0], h[3]))
    assert fingerprint(shipped) == fingerprint(whole)
    assert [i.position for i in shipped if isinstance(i, PositionMark)] == \
        [i.position for i in whole if isinstance(i, PositionMark)]
    assert [(e.idempotency_key, e.op, e.db, e.table, e.tx_id, e.key_bytes) for e in rows(shipped)] == \
        [(e.idempotency_key, e.op, e.db, e.table, e.tx_id, e.key_bytes) for e in rows(whole)]
    assert [e.after for e in rows(shipped)[:50]] == [e.after for e in rows(whole)[:50]]  # parsed on use
    # a child started ahead (tidegate run starts it once its bounds are set) reads the same
    from tidegate.reader_process import ReaderProcess
    from tidegate.segments import Slice

    with ReaderProcess(min_bytes=0) as reader:
        reader.warm_up("mysql")
        warmed = list(reader.read_log(src, Slice(h[0], h[3])))
    assert [(e.idempotency_key, e.value) for e in rows(warmed)] == \
        [(e.idempotency_key, e.value) for e in rows(whole)]

    # the stream cuts into sub-batches without ever splitting a transaction
    batches = list(cut_sub_batches(iter(whole), max_events=10_000, max_bytes=1 << 30))
    assert sum(b.event_count for b in batches) == expected + 1  # the rows and the control message
    assert batches[-1].end_position == h[3]
    src.close()


def test_a_reader_process_that_is_not_read_to_the_end_is_stopped(mysql, admin, db):
    import multiprocessing

    from tidegate.reader_process import read_in_child

    create_workload_tables(admin, db)
    src = source(mysql, [f"{db}.orders"])
    h0 = src.head()
    for k in range(3000):
        ex(admin, f"INSERT INTO {db}.orders VALUES ({k}, 'x', 1)")
    before = set(multiprocessing.active_children())
    it = read_in_child(src, h0, src.head())
    assert [next(it).after["id"] for _ in range(5)] == [0, 1, 2, 3, 4]
    [reader] = set(multiprocessing.active_children()) - before
    it.close()  # the run stopped reading (a failed sink, a halt)
    assert not reader.is_alive() and reader.exitcode is not None
    src.close()


def test_a_reader_process_started_ahead_and_not_needed_is_stopped():
    """The child `tidegate run` starts ahead ends when the run closes the reader without having
    read in a child (a range too small for one is read in-process)."""
    import multiprocessing

    from tidegate.reader_process import ReaderProcess

    before = set(multiprocessing.active_children())
    with ReaderProcess() as reader:
        reader.warm_up("mysql")
        [child] = set(multiprocessing.active_children()) - before
        assert child.is_alive()
    assert not child.is_alive() and child.exitcode is not None


def test_writes_made_while_a_run_reads_are_in_the_next_run(mysql, admin, db):
    create_workload_tables(admin, db)
    src = source(mysql, [f"{db}.orders"])
    h0 = src.head()
    for k in range(50):
        ex(admin, f"INSERT INTO {db}.orders VALUES ({k}, 'before', 1)")
    h1 = src.head()
    it = src.read(h0, h1)
    first = [next(it)]
    ex(admin, f"INSERT INTO {db}.orders VALUES (1000, 'during', 1)")  # while the run reads
    run1 = first + list(it)
    assert [e.after["id"] for e in rows(run1)] == list(range(50))
    assert isinstance(run1[-1], ChangeEvent) and run1[-1].end_position <= h1
    h2 = src.head()
    run2 = list(src.read(h1, h2))
    assert [e.after["id"] for e in rows(run2)] == [1000]
    src.close()


def test_heads_taken_while_transactions_commit_carry_the_gtid_state_at_their_position(mysql, admin, db):
    """MariaDB: head() reads the GTID state around SHOW MASTER STATUS instead of scanning the
    binlog; under concurrent commits every head it gives is the state the scan gives there."""
    create_workload_tables(admin, db)
    src = source(mysql, [f"{db}.orders"])
    stop, writing = threading.Event(), threading.Event()
    writes = 0

    def write() -> None:
        nonlocal writes
        conn = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
        while not stop.is_set():
            ex(conn, f"INSERT INTO {db}.orders VALUES ({writes}, 'during', 1)")
            writes += 1
            writing.set()
        conn.close()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert writing.wait(30)
        # Take heads until they have moved at least 10 times under the writer (a loaded
        # machine gives fewer heads per 300 writes), bounded by time, not by a write count.
        heads: dict[int, object] = {}
        deadline = time.monotonic() + 60
        while (writes < 300 or len(heads) <= 10) and time.monotonic() < deadline:
            h = src.head()
            heads[h.pos] = h
    finally:
        stop.set()
        writer.join()
    heads = list(heads.values())
    assert len(heads) > 10  # the heads moved while taken
    for h in heads:
        assert h.gtid_set == src.server.gtid_at(h.file, h.pos), h
    src.close()


def test_ddl_in_range_rows_keep_their_own_columns_and_a_schema_change_message_sits_between(
        mysql, admin, db):
    ex(admin, f"CREATE TABLE {db}.t (id INT PRIMARY KEY, a VARCHAR(10))",
       f"CREATE TABLE {db}.other (id INT PRIMARY KEY)")
    src = source(mysql, [f"{db}.t"])
    h0 = src.head()
    ex(admin, f"INSERT INTO {db}.t VALUES (1, 'x')")
    ex(admin, f"ALTER TABLE {db}.t ADD COLUMN b INT DEFAULT 5")
    ex(admin, f"INSERT INTO {db}.t VALUES (2, 'y', 6)")
    ex(admin, f"ALTER TABLE `{db}`.`t` DROP COLUMN a")
    ex(admin, f"ALTER TABLE {db}.other ADD COLUMN z INT")  # not captured: no message
    ex(admin, f"UPDATE {db}.t SET b = 7 WHERE id = 1")
    items = [i for i in src.read(h0, src.head()) if not isinstance(i, PositionMark)]
    got = rows(items)
    assert [e.after for e in got] == [{"id": 1, "a": "x"}, {"id": 2, "a": "y", "b": 6},
                                      {"id": 1, "b": 7}]
    assert got[2].before == {"id": 1, "b": 5}
    assert [("ddl" if is_control(i) else i.op) for i in items] == ["c", "ddl", "c", "ddl", "u"]
    add, drop = (json.loads(i.value) for i in items if is_control(i))
    assert (add["type"], add["change"], add["db"], add["table"]) == ("schema_change", "alter", db, "t")
    assert add["ddl"] == f"ALTER TABLE {db}.t ADD COLUMN b INT DEFAULT 5"
    assert add["columns"] == [{"name": "id", "type": "int"}, {"name": "a", "type": "varchar"},
                              {"name": "b", "type": "int"}]
    assert drop["columns"] == [{"name": "id", "type": "int"}, {"name": "b", "type": "int"}]
    changes = src.schema_changes
    assert [c.query.split()[3:6] for c in changes] == [["ADD", "COLUMN", "b"], ["DROP", "COLUMN", "a"]]
    controls = [i for i in items if is_control(i)]
    # the message's id is the statement's place in the binlog, its end the statement's group end
    assert [c.event_id for c in controls] == [f"{c.position.file}:{c.position.pos}:{db}.t" for c in changes]
    assert [c.end_position for c in controls] == [c.end_position for c in changes]
    assert all(c.tx_end for c in controls) and add["ts_ms"] == changes[0].ts_ms
    assert got[0].end_position <= changes[0].position < changes[0].end_position <= got[1].end_position
    assert changes[1].end_position <= got[2].end_position
    # a range holding only a DDL has something to deliver
    assert src.has_changes(got[0].end_position, changes[0].end_position)
    src.close()


def test_table_filter_and_transactions_with_only_filtered_rows(mysql, admin, db):
    create_workload_tables(admin, db)
    src = source(mysql, [f"{db}.items"])
    h0 = src.head()
    ex(admin, f"INSERT INTO {db}.orders VALUES (1, 'x', 1)")
    h1 = src.head()
    got = list(src.read(h0, h1))
    assert got == [PositionMark(h1)]  # nothing to deliver, but the checkpoint may reach h1
    assert list(src.read(h1, h1)) == []
    src.close()


# --------------------------------------------------------------------------- continuity


def test_reading_a_purged_position_raises_with_requested_and_earliest(mysql, admin, db):
    ex(admin, f"CREATE TABLE {db}.t (id INT PRIMARY KEY)")
    src = source(mysql, [f"{db}.t"])
    ex(admin, "FLUSH BINARY LOGS")
    start = src.head()  # in a file this test created
    ex(admin, f"INSERT INTO {db}.t VALUES (1)")
    ex(admin, "FLUSH BINARY LOGS")
    mine = src.head().file
    purge_to(admin, mine)
    # read in a child process, the source's error comes back as itself, with its facts
    from tidegate.reader_process import read_in_child

    with pytest.raises(PositionPurgedError) as err:
        list(read_in_child(src, start, src.head()))
    assert (err.value.requested, err.value.earliest_available) == (start, src.earliest())
    with pytest.raises(PositionPurgedError) as err:
        list(src.read(start, src.head()))
    assert err.value.requested == start
    earliest = err.value.earliest_available
    assert isinstance(earliest, BinlogPosition) and earliest.pos == 4
    assert earliest.file_seq >= BinlogPosition(mine, 4).file_seq
    assert earliest == src.earliest()
    problems = src.check_server(checkpoint=start)
    assert any(p.code == "retention" and p.severity == "error" for p in problems)
    src.close()


def test_failover_resume_point_on_the_replica(mysql, mysql_replica, admin, db):
    ex(admin, f"CREATE TABLE {db}.t (id INT PRIMARY KEY)")
    primary = source(mysql, [f"{db}.t"])
    h0 = primary.head()
    ex(admin, f"INSERT INTO {db}.t VALUES (1)")
    ex(admin, f"INSERT INTO {db}.t VALUES (2)")
    ex(admin, f"INSERT INTO {db}.t VALUES (3)")
    first = rows(primary.read(h0, primary.head()))
    checkpoint = first[0].end_position  # delivered row 1 only
    replica = MySqlSource(make_spec([f"{db}.t"]), mysql_replica.cdc)
    deadline = time.monotonic() + 20
    while not (replica.head().gtid_set or GtidSet.parse("0-0-0")).contains(first[-1].end_position.gtid_set):
        assert time.monotonic() < deadline, "replica did not catch up"
        time.sleep(0.1)
    assert replica.identity()["server_id"] != primary.identity()["server_id"]
    resume = replica.resume_point_for_gtids(checkpoint.gtid_set)
    after = rows(replica.read(resume, replica.head()))
    assert [(e.tx_id, e.after) for e in after] == [(e.tx_id, e.after) for e in first[1:]]
    missing = GtidSet.parse(f"0-1-{checkpoint.gtid_set.mariadb[0][2] + 1_000_000}")
    with pytest.raises(GtidsNotOnServerError):
        replica.resume_point_for_gtids(missing)
    primary.close()
    replica.close()


# --------------------------------------------------------------------------- settings


def test_statement_logged_dml_names_binlog_format(mysql, admin, db):
    ex(admin, f"CREATE TABLE {db}.t (id INT PRIMARY KEY)")
    src = source(mysql, [f"{db}.t"])
    h0 = src.head()
    ex(admin, "SET SESSION binlog_format = 'STATEMENT'", f"INSERT INTO {db}.t VALUES (1)",
       "SET SESSION binlog_format = 'ROW'")
    with pytest.raises(SourceSettingError, match="binlog_format=ROW"):
        list(src.read(h0, src.head()))
    src.close()


def test_partial_row_image_names_binlog_row_image(mysql, admin, db):
    ex(admin, f"CREATE TABLE {db}.t (id INT PRIMARY KEY, a INT, b INT)",
       f"INSERT INTO {db}.t VALUES (1, 1, 1)")
    src = source(mysql, [f"{db}.t"])
    h0 = src.head()
    ex(admin, "SET SESSION binlog_row_image = 'MINIMAL'", f"UPDATE {db}.t SET a = 2 WHERE id = 1",
       "SET SESSION binlog_row_image = 'FULL'")
    with pytest.raises(SourceSettingError, match="binlog_row_image=FULL"):
        list(src.read(h0, src.head()))
    src.close()


def test_settings_problems_name_each_setting():
    probs = settings_problems({"log_bin": "ON", "binlog_format": "MIXED", "binlog_row_image": "MINIMAL",
                               "binlog_row_metadata": "MINIMAL"})
    assert [p.subject for p in probs] == ["binlog_format", "binlog_row_image", "binlog_row_metadata"]
    assert "binlog_row_metadata" in probs[2].message and "FULL" in probs[2].message
    assert settings_problems({"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL",
                              "binlog_row_metadata": "FULL"}) == []


def test_preflight_on_the_live_server_has_no_errors_and_reports_headroom(mysql, db):
    src = source(mysql, [f"{db}.t"])
    check_settings(src.server)
    problems = src.check_server(checkpoint=src.head(), checkpoint_age_s=10)
    assert [p for p in problems if p.severity == "error"] == []
    ident = src.identity()
    assert ident["flavor"] == "mariadb" and ident["gtid_domain_id"] == 0
    assert ident["binlog_basename"] == src.head().basename
    src.close()
