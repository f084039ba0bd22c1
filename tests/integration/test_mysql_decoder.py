"""The fast binlog decoder against the library decoder (python-mysql-replication), on one
real MariaDB binlog: every item, byte for byte.

The binlog holds every supported column type (with NULLs, extremes, every fractional-second
precision, several character sets), multi-row events, updates with before/after images,
deletes, a DDL between rows, transactions over several tables, a table filter, and the
errors both decoders must raise the same way. Where the fast decoder deliberately differs
(values the library gets wrong, see sources/mysql_rows.py), the last test pins its values.
"""

from __future__ import annotations

import base64
import json
import random
import uuid

import pymysql
import pytest
from tidegate.errors import SourceSettingError
from tidegate.events import ChangeEvent, is_control
from tidegate.sources.mysql.source import MySqlSource, fast_decoder
from tidegate.spec import PipelineSpec, SourceSpec

from tests.integration.source_items import assert_same
from tests.reference_decoders.mysql_library import library_reader

pytestmark = pytest.mark.integration


def spec(tables=()) -> PipelineSpec:
    return PipelineSpec(pipeline="dec_test", tenant="acme", sinks=(),
                        source=SourceSpec(kind="mysql", conn_id="cdc_mysql", tables=tuple(tables),
                                          server_id=random.randint(100_000, 2_000_000_000)))


def ex(conn, *sqls):
    with conn.cursor() as c:
        for sql in sqls:
            c.execute(sql)


@pytest.fixture()
def admin(mysql):
    conn = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    yield conn
    conn.close()


@pytest.fixture()
def db(admin):
    name = "dec_" + uuid.uuid4().hex[:10]
    ex(admin, f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
    yield name
    ex(admin, f"DROP DATABASE IF EXISTS {name}")


def read_both(mysql, tables, start, upto):
    """(library items, fast items, library schema changes, fast schema changes)."""
    out = []
    for reader in (library_reader, fast_decoder):
        src = MySqlSource(spec(tables), mysql.cdc, decoder=reader)
        items = list(src.read(start, upto))
        out.append((items, [c.to_json() for c in src.schema_changes]))
        src.close()
    (lib, lib_ddl), (fast, fast_ddl) = out
    return lib, fast, lib_ddl, fast_ddl


# --------------------------------------------------------------------------- the binlog

TYPES = """CREATE TABLE {db}.types (
  id INT PRIMARY KEY,
  ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED,
  mi MEDIUMINT, miu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED,
  de DECIMAL(30,10), de0 DECIMAL(5,0), de2 DECIMAL(12,2), de7 DECIMAL(20,10), de65 DECIMAL(65,30),
  dfrac DECIMAL(9,9), de8 DECIMAL(15,8), f FLOAT, dbl DOUBLE,
  ch CHAR(10), vc VARCHAR(500), vs VARCHAR(20), tx TEXT, mt MEDIUMTEXT, bl BLOB, bn BINARY(4),
  vb VARBINARY(16), l1 VARCHAR(20) CHARACTER SET latin1, asc1 CHAR(5) CHARACTER SET ascii,
  g GEOMETRY, after_geo VARCHAR(10) COLLATE utf8mb4_bin,
  d DATE, t0 TIME, t1 TIME(1), t2 TIME(2), t3 TIME(3), t4 TIME(4), t5 TIME(5), t6 TIME(6),
  dt0 DATETIME, dt1 DATETIME(1), dt3 DATETIME(3), dt6 DATETIME(6),
  ts0 TIMESTAMP NULL, ts2 TIMESTAMP(2) NULL, ts6 TIMESTAMP(6) NULL, y YEAR,
  e ENUM('small','large','ümlaut'), s SET('a','b','c','d'), s0 SET('x','y'),
  b1 BIT(1), b10 BIT(10), b64 BIT(64), j JSON, n INT NULL
) CHARACTER SET utf8mb4"""

ROW_A = """(1, -128, 255, -32768, 65535, -8388608, 16777215, -2147483648, 4294967295,
  -9223372036854775808, 18446744073709551615,
  '-12345678901234567890.0123456789', 99999, -0.5, 0.0000001,
  '-12345678901234567890123456789012345.123456789012345678901234567890',
  0.000000001, '-1234567.12345678', 3.14, 2.718281828459045,
  'ch', REPEAT('héllo wörld 😀🎉 ', 20), '', 'tëxt ✓ 𝄞', REPEAT('m', 70000), x'00ff10', x'0102', x'deadbeef',
  'café €', 'ABC', ST_GeomFromText('POINT(1 2)'), 'after',
  '2024-02-29', '838:59:59', '-00:00:01.5', '-12:34:56.78', '-01:02:03.250', '00:00:00.0001',
  '-00:00:00.00001', '-838:59:59.000000',
  '2024-01-02 03:04:05', '1000-01-01 00:00:00.9', '9999-12-31 23:59:59.999', '2024-01-02 03:04:05.000001',
  '1970-01-01 00:00:01', '2038-01-19 03:14:07.99', '2024-06-30 12:00:00.123456', 2155,
  'ümlaut', 'a,c,d', '', b'1', b'1010101010', 18446744073709551614,
  '{{"k": [1, 2.5, "x"], "n": null, "u": "ü"}}', NULL)"""

ROW_B = """(2, 127, 0, 32767, 0, 8388607, 0, 2147483647, 0, 9223372036854775807, 0,
  0, -99999, 0, 0, 0, -0.999999999, 0.00000001, -1.5e-7, 1e300,
  NULL, 'x', NULL, NULL, NULL, x'', x'0001', x'', NULL, NULL, NULL, NULL,
  '0001-01-01', '-838:59:59', '00:00:00.1', '23:59:59.99', '00:00:00.001', '-00:00:00.0001',
  '00:00:00.00001', '00:00:00.000001',
  NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1901,
  'small', '', 'x,y', b'0', b'0', b'0', '[]', 7)"""


def write_binlog(admin, db) -> None:
    ex(admin, "SET time_zone = '+00:00'", "SET sql_mode = ''")
    ex(admin, f"INSERT INTO {db}.types VALUES {ROW_A.format(db=db)}, {ROW_B}")  # one multi-row event
    ex(admin, f"INSERT INTO {db}.types (id) VALUES (3)")  # all NULL but the key
    ex(admin, f"UPDATE {db}.types SET ti = ti - 1, vs = 'upd', dbl = 1e-5, f = 1e20, j = '{{}}', "
              f"s = 'b' WHERE id IN (2, 3)")  # before/after images, floats orjson formats differently
    ex(admin, "BEGIN",
       f"INSERT INTO {db}.orders VALUES (1, 'new', 10.50), (2, 'new', 3.25)",
       f"INSERT INTO {db}.items VALUES (1, 1, 'sku-1'), (2, 1, 'sku-2'), (3, 2, 'sku-3')",
       f"UPDATE {db}.orders SET status = 'paid' WHERE id = 1",
       "COMMIT")
    ex(admin, f"INSERT INTO {db}.items VALUES (4, 2, 'only-items')")  # a tx with only filtered rows
    ex(admin, f"UPDATE {db}.items SET id = 40 WHERE id = 4")  # the key changes: a delete, then a create
    ex(admin, f"INSERT INTO {db}_other.t VALUES (1, 'another database')", "FLUSH BINARY LOGS")
    ex(admin, f"ALTER TABLE {db}.orders ADD COLUMN note VARCHAR(20) DEFAULT 'n/a'")  # DDL between rows
    ex(admin, f"INSERT INTO {db}.orders VALUES (3, 'new', 1.00, 'with note')")
    ex(admin, f"UPDATE {db}.orders SET total = total * 2")  # one update event, 3 rows
    ex(admin, f"DELETE FROM {db}.items WHERE id < 3")
    ex(admin, f"DELETE FROM {db}.types WHERE id = 1")
    ex(admin, "BEGIN", f"INSERT INTO {db}.orders VALUES (9, 'rolled back', 0, 'x')", "ROLLBACK")
    ex(admin, f"CREATE TABLE {db}.ckey (a INT, b VARCHAR(10), c INT, PRIMARY KEY (b, a))",
       f"INSERT INTO {db}.ckey VALUES (1, 'x', 2), (2, 'y', 3)",
       f"UPDATE {db}.ckey SET a = 5, c = 4 WHERE b = 'x'")  # a composite key changes


def test_fast_and_library_decoders_give_identical_items(mysql, admin, db):
    ex(admin, f"CREATE DATABASE {db}_other", f"CREATE TABLE {db}_other.t (id INT PRIMARY KEY, v TEXT)")
    try:
        compared = _compare_everything(mysql, admin, db)
    finally:
        ex(admin, f"DROP DATABASE {db}_other")
    # every read above compared item by item; these are the tables the widest one held
    assert {e.table for e in compared} == {"types", "orders", "items", "ckey"}


def _compare_everything(mysql, admin, db):
    ex(admin, TYPES.format(db=db),
       f"CREATE TABLE {db}.orders (id BIGINT PRIMARY KEY, status VARCHAR(20), total DECIMAL(10,2))",
       f"CREATE TABLE {db}.items (id BIGINT PRIMARY KEY, order_id BIGINT, sku VARCHAR(40))")
    src = MySqlSource(spec(), mysql.cdc)
    h0 = src.head()
    write_binlog(admin, db)
    h1 = src.head()
    src.close()

    # no filter at all (the other database too, a binlog rotation in the middle)
    lib, fast, lib_ddl, fast_ddl = read_both(mysql, [], h0, h1)
    assert_same(lib, fast)
    assert fast_ddl == lib_ddl
    assert [e.after for e in fast if isinstance(e, ChangeEvent) and e.db == f"{db}_other"] == \
        [{"id": 1, "v": "another database"}]
    # every table of the database, and a filter that leaves one table out
    all_events = None
    for tables in ([f"{db}.types", f"{db}.orders", f"{db}.items", f"{db}.ckey"],
                   [f"{db}.types", f"{db}.orders", f"{db}.ckey"]):
        lib, fast, lib_ddl, fast_ddl = read_both(mysql, tables, h0, h1)
        assert_same(lib, fast)
        assert fast_ddl == lib_ddl and len(fast_ddl) == 2  # ALTER and CREATE TABLE ckey
        # each is a schema_change message where the statement sits, in its own transaction
        controls = [json.loads(i.value) for i in fast if is_control(i)]
        assert [(c["change"], c["table"]) for c in controls] == [("alter", "orders"), ("create", "ckey")]
        assert [c["name"] for c in controls[0]["columns"]] == ["id", "status", "total", "note"]
        assert controls[1]["columns"] == [{"name": "a", "type": "int"}, {"name": "b", "type": "varchar"},
                                          {"name": "c", "type": "int"}]
        assert all(i.tx_end for i in fast if is_control(i))
        events = [e for e in fast if isinstance(e, ChangeEvent)]
        by_table = {}
        for e in events:
            by_table.setdefault(e.table, []).append(e.op)
        assert by_table["types"] == ["c", "c", "c", "u", "u", "d"]
        assert by_table["orders"] == ["c", "c", "u", "c", "u", "u", "u"]
        assert by_table.get("items", []) == (["c", "c", "c", "c", "d", "c", "d", "d"] if len(tables) == 4
                                             else [])
        assert by_table["ckey"] == ["c", "c", "d", "c"]
        all_events = all_events or events
    events = all_events
    # the content is what the columns hold (spot checks; the rest is equal to the library)
    row_a = events[0].after
    assert row_a["biu"] == 18446744073709551615 and row_a["de7"] == "0.0000001000"
    assert row_a["l1"] == "café €" and row_a["mt"] == "m" * 70000 and row_a["asc1"] == "ABC"
    assert base64.b64decode(row_a["g"])[4:] == bytes.fromhex("0101000000000000000000f03f0000000000000040")
    assert row_a["t1"] == "-00:00:01.500000" and row_a["t5"] == "-00:00:00.000010"
    assert row_a["e"] == "ümlaut" and row_a["s"] == ["a", "c", "d"] and row_a["s0"] == []
    assert events[2].after == {k: (3 if k == "id" else None) for k in row_a}
    ckey = [e for e in events if e.table == "ckey"]
    assert [e.key for e in ckey] == [{"a": 1, "b": "x"}, {"a": 2, "b": "y"},
                                     {"a": 1, "b": "x"}, {"a": 5, "b": "x"}]
    # the key change: the old row deleted under its key, the new one created under its own, in
    # one transaction, each naming the other key
    gone, made = ckey[2:]
    assert (gone.before, gone.after, made.before, made.after) == (
        {"a": 1, "b": "x", "c": 2}, None, None, {"a": 5, "b": "x", "c": 4})
    assert gone.headers == {"__debezium.newkey": b'{"a":5,"b":"x"}'}
    assert made.headers == {"__debezium.oldkey": b'{"a":1,"b":"x"}'}
    assert gone.tx_id == made.tx_id and made.tx_end and not gone.tx_end
    assert (gone.total_order, made.total_order) == (1, 2)
    assert gone.event_id.endswith(":d") and made.event_id == gone.event_id[:-1] + "c"
    # a run cut at a transaction boundary in the middle gives the same items on both paths
    items_tx = next(e.tx_id for e in events if e.table == "items")
    mid = next(e.end_position for e in events if e.tx_id == items_tx and e.tx_end)
    assert_same(*read_both(mysql, [f"{db}.orders", f"{db}.items"], h0, mid)[:2])
    assert_same(*read_both(mysql, [f"{db}.orders", f"{db}.items"], mid, h1)[:2])
    return events


def test_both_decoders_raise_the_same_setting_errors(mysql, admin, db):
    ex(admin, f"CREATE TABLE {db}.t (id INT PRIMARY KEY, a INT, b INT)",
       f"INSERT INTO {db}.t VALUES (1, 1, 1)")
    src = MySqlSource(spec(), mysql.cdc)
    cases = [
        ("binlog_format=ROW", ["SET SESSION binlog_format = 'STATEMENT'",
                               f"INSERT INTO {db}.t VALUES (2, 2, 2)", "SET SESSION binlog_format = 'ROW'"]),
        ("binlog_row_image=FULL", ["SET SESSION binlog_row_image = 'MINIMAL'",
                                   f"UPDATE {db}.t SET a = 3 WHERE id = 1",
                                   "SET SESSION binlog_row_image = 'FULL'"]),
        ("binlog_row_metadata=FULL", ["SET GLOBAL binlog_row_metadata = 'MINIMAL'",
                                      f"INSERT INTO {db}.t VALUES (4, 4, 4)",
                                      "SET GLOBAL binlog_row_metadata = 'FULL'"]),
    ]
    try:
        for setting, sqls in cases:
            h0 = src.head()
            ex(admin, *sqls)
            h1 = src.head()
            messages = []
            for reader in (library_reader, fast_decoder):
                s = MySqlSource(spec([f"{db}.t"]), mysql.cdc, decoder=reader)
                with pytest.raises(SourceSettingError, match=setting) as err:
                    list(s.read(h0, h1))
                messages.append(str(err.value))
                s.close()
            assert messages[0] == messages[1]
    finally:
        ex(admin, "SET GLOBAL binlog_row_metadata = 'FULL'")
        src.close()


def test_values_where_the_fast_decoder_corrects_the_library(mysql, admin, db):
    ex(admin, "SET time_zone = '+00:00'", "SET sql_mode = 'ALLOW_INVALID_DATES'",
       f"CREATE TABLE {db}.z (id INT PRIMARY KEY, y YEAR, ts TIMESTAMP NULL, d DATE, dt DATETIME, "
       f"u2 VARCHAR(10) CHARACTER SET ucs2, u16 VARCHAR(10) CHARACTER SET utf16, "
       f"u32 VARCHAR(10) CHARACTER SET utf32, l1 VARCHAR(10) CHARACTER SET latin1, "
       f"e ENUM('é', 'x') CHARACTER SET latin1, bn BINARY(3))",
       f"CREATE TABLE {db}.pfx (name VARCHAR(40), v INT, PRIMARY KEY (name(4)))")
    src = MySqlSource(spec([f"{db}.z", f"{db}.pfx"]), mysql.cdc)
    h0 = src.head()
    ex(admin, f"INSERT INTO {db}.z VALUES (1, 0, '0000-00-00 00:00:00', '2024-02-30', "
              f"'2023-02-29 10:00:00', 'aé', 'b€', 'c😀', x'81e9', 'é', x'000000')",
       f"INSERT INTO {db}.pfx VALUES ('prefix-key', 1)")
    h1 = src.head()
    got = [e for e in src.read(h0, h1) if isinstance(e, ChangeEvent)]
    assert src.decoder is fast_decoder
    assert got[0].after == {"id": 1, "y": None, "ts": None, "d": None, "dt": None, "u2": "aé",
                            "u16": "b€", "u32": "c😀", "l1": "\x81é", "e": "é", "bn": "AAAA"}
    assert got[1].key == {"name": "prefix-key"}
    src.close()


def test_an_event_larger_than_one_protocol_packet(mysql, admin, db):
    """Row events of 16 MiB and more span several protocol packets."""
    ex(admin, f"CREATE TABLE {db}.big (id INT PRIMARY KEY, body LONGTEXT)")
    src = MySqlSource(spec([f"{db}.big"]), mysql.cdc)
    h0 = src.head()
    ex(admin, f"INSERT INTO {db}.big VALUES (1, REPEAT('0123456789abcdef', 1100000)), (2, 'small')")
    h1 = src.head()
    src.close()
    lib, fast, _, _ = read_both(mysql, [f"{db}.big"], h0, h1)
    assert_same(lib, fast)
    assert len(fast[0].after["body"]) == 17_600_000 and fast[1].after == {"id": 2, "body": "small"}
