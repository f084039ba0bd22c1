"""Snapshot reads against the real MariaDB and PostgreSQL: a row read by snapshot has exactly the
values the same row has in a log event; chunks cover a (composite) primary key exactly once;
a table without a primary key is refused by name.

Every test works in its own database/schema (and slot), dropped at the end.
"""

from __future__ import annotations

import json
import random
import time
import uuid

import psycopg2
import pymysql
import pytest
from tidegate import snapshot
from tidegate.errors import SnapshotError
from tidegate.events import ChangeEvent, encode_row
from tidegate.snapshot import rows as snapshot_rows
from tidegate.sources import make_source
from tidegate.spec import PipelineSpec, SourceSpec

from tests.integration import test_source_mysql as mysql_types
from tests.integration import test_source_postgres as pg_types
from tests.integration.semisync import SemiSync

pytestmark = pytest.mark.integration


def read_all(src, table, chunk_rows):
    """Every chunk's rows (JSON form), and the chunk plan."""
    plan = src.snapshots().chunk_plan(table, chunk_rows)
    return [[encode_row(r) for r in src.snapshots().read_chunk(table, lo, hi)] for lo, hi in plan], plan


def log_after(src, start):
    return {json.dumps(e.key, sort_keys=True): e.after for e in src.read(start, src.head())
            if isinstance(e, ChangeEvent)}


def by_key(rows, key):
    return {json.dumps({k: r[k] for k in key}, sort_keys=True): r for r in rows}


def stdlib_json(obj, **kw):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False, **kw).encode("utf-8")


def assert_events_are_the_log_rows_as_stdlib_json(src, start, table_names):
    """Through the whole snapshot read path (plan, chunks, row events): every row's ``after`` is
    its log event's, and its bytes (value, key, event id) the stdlib's JSON of its envelope."""
    logged = {(e.table, json.dumps(e.key, sort_keys=True)): e.after for e in src.read(start, src.head())
              if isinstance(e, ChangeEvent)}
    rec = snapshot.plan_snapshot(src.spec, src, handoff=src.head(), kind="start")
    events = [e for n in range(1, len(rec.chunks) + 1)
              for e in snapshot.read_chunk(src.spec, src, rec, n).events]
    assert sorted({e.table for e in events}) == sorted(table_names)
    assert {(e.table, json.dumps(e.key, sort_keys=True)): e.after for e in events} == logged
    assert len(events) == len(logged)
    for e in events:
        assert e.value == stdlib_json(e.envelope()), e.after
        assert e.key_bytes == stdlib_json(e.key, sort_keys=True)
        assert e.event_id == stdlib_json(e.key).decode()
    return events


# --------------------------------------------------------------------------- MariaDB


@pytest.fixture()
def my(mysql):
    conn = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    db = "snapm_" + uuid.uuid4().hex[:10]
    ex = conn.cursor().execute
    ex(f"CREATE DATABASE {db} CHARACTER SET utf8mb4")
    made = []

    def source(*tables):
        spec = PipelineSpec(pipeline="snap_test", tenant="acme", sinks=(),
                            source=SourceSpec(kind="mysql", conn_id="cdc_mysql",
                                              tables=tuple(f"{db}.{t}" for t in tables),
                                              server_id=random.randint(100_000, 2_000_000_000)))
        made.append(make_source(spec, mysql.cdc))
        return made[-1]

    yield ex, db, source
    for s in made:
        s.close()
    ex(f"DROP DATABASE IF EXISTS {db}")
    conn.close()


EDGE_ROW_MYSQL = """INSERT INTO {db}.types VALUES (
  3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, '0.0000000001', 0, 3.1415927, -1e300,
  'c ', '', '', x'', x'00', x'', '0000-00-00', '00:00:00', '-00:00:01.500', '2024-01-02 03:04:05.000000',
  '2024-01-02 03:04:05.000', 0, 'small', 'a,b,c', 'b', b'0', b'0000000001', '[]', 7)"""


def test_mysql_snapshot_values_equal_the_log_values(my):
    ex, db, source = my
    ex(mysql_types.TYPES_DDL.format(db=db))
    src = source("types")
    start = src.head()
    ex("SET time_zone = '+00:00'")
    ex("SET sql_mode = ''")  # zero dates and YEAR 0000 are possible values too
    ex(mysql_types.TYPES_ROW.format(db=db))
    ex(f"INSERT INTO {db}.types (id) VALUES (2)")
    ex(EDGE_ROW_MYSQL.format(db=db))
    logged = log_after(src, start)
    [table] = src.snapshots().tables()
    assert table.key == ("id",)
    chunks, _ = read_all(src, table, 2)
    snap = by_key([r for c in chunks for r in c], table.key)
    assert len(logged) == len(snap) == 3
    assert snap == logged
    assert snap['{"id": 1}'] == mysql_types.TYPES_EXPECTED
    edge = snap['{"id": 3}']
    assert edge["d"] is None and edge["y"] is None and edge["f"] == 3.1415927 and edge["s"] == ["a", "b", "c"]


def test_mysql_snapshot_events_are_the_log_rows_as_stdlib_json(my):
    ex, db, source = my
    ex(mysql_types.TYPES_DDL.format(db=db))
    ex(f"CREATE TABLE {db}.floats (k DOUBLE PRIMARY KEY, f FLOAT, d DOUBLE)")
    src = source("types", "floats")
    start = src.head()
    ex("SET time_zone = '+00:00'")
    ex("SET sql_mode = ''")
    ex(mysql_types.TYPES_ROW.format(db=db))
    ex(f"INSERT INTO {db}.types (id) VALUES (2)")
    ex(EDGE_ROW_MYSQL.format(db=db))
    # floats orjson writes as the stdlib does, and some it does not (< 1e-4, >= 1e16), in the key too
    ex(f"INSERT INTO {db}.floats VALUES (0.5, 0.25, 1e-5), (1e-7, 1.5, 2.5), (1e20, 0, -0.0), "
       f"(3, NULL, 1e16)")
    events = assert_events_are_the_log_rows_as_stdlib_json(src, start, ["floats", "types"])
    assert len(events) == 7


def test_mysql_chunks_cover_a_composite_key_exactly_once(my):
    ex, db, source = my
    ex(f"CREATE TABLE {db}.lines (a INT, b VARCHAR(10), v INT, PRIMARY KEY (b, a))")
    ex(f"INSERT INTO {db}.lines SELECT seq % 7, CONCAT('k', seq % 13), seq FROM {db}.seq_1_to_91")
    ex(f"CREATE TABLE {db}.money (amount DECIMAL(30,2) PRIMARY KEY, n INT)")
    # keys that differ beyond a double's precision: DECIMAL bounds must stay exact
    ex(f"INSERT INTO {db}.money VALUES (12345678901234567.01, 1), (12345678901234567.02, 2), "
       f"(12345678901234567.03, 3)")
    src = source("lines", "money")
    lines, money = src.snapshots().tables()
    assert lines.key == ("b", "a") and money.key == ("amount",)
    chunks, plan = read_all(src, lines, 7)
    assert len(plan) == 14 and plan[0][0] is None and plan[-1][1] is None
    assert all(len(c) <= 7 for c in chunks) and sum(map(len, chunks)) == 91
    keys = [(r["b"], r["a"]) for c in chunks for r in c]
    assert len(set(keys)) == 91
    # rows written after the plan, below the first and above the last bound, are in the end chunks
    ex(f"INSERT INTO {db}.lines VALUES (0, 'a', 0), (9, 'zz', 0)")
    assert [r["b"] for r in src.snapshots().read_chunk(lines, *plan[0])][0] == "a"
    assert [r["b"] for r in src.snapshots().read_chunk(lines, *plan[-1])][-1] == "zz"
    chunks, plan = read_all(src, money, 1)
    assert [[r["n"] for r in c] for c in chunks] == [[1], [2], [3], []]


def test_mysql_table_without_primary_key_is_refused_by_name(my):
    ex, db, source = my
    ex(f"CREATE TABLE {db}.heap (v INT)")
    ex(f"CREATE TABLE {db}.ok (id INT PRIMARY KEY)")
    with pytest.raises(SnapshotError, match=rf"table {db}\.heap has no primary key.*ALTER TABLE {db}\.heap"):
        source("ok", "heap").snapshots().tables()
    with pytest.raises(SnapshotError, match=rf"does not capture {db}\.other"):
        source("ok").snapshots().tables([f"{db}.other"])
    with pytest.raises(SnapshotError, match=rf"cannot snapshot {db}\.gone: no such table"):
        source("gone").snapshots().tables()


# --------------------------------------------------------------------------- PostgreSQL


@pytest.fixture()
def pg(postgres):
    conn = psycopg2.connect(postgres.admin_dsn)
    conn.autocommit = True
    schema = "snapp_" + uuid.uuid4().hex[:10]

    def ex(sql, args=None):
        with conn.cursor() as c:
            c.execute(sql, args)

    ex(f"CREATE SCHEMA {schema}")
    made = []

    def source(*tables):
        spec = PipelineSpec(pipeline="snap_test", tenant="acme", sinks=(),
                            source=SourceSpec(kind="postgres", conn_id="cdc_postgres",
                                              tables=tuple(f"{schema}.{t}" for t in tables),
                                              slot="snapp_" + uuid.uuid4().hex[:12]))
        made.append(make_source(spec, postgres.cdc))
        return made[-1]

    yield ex, schema, source
    for s in made:
        try:
            s.replication_slot.drop()
        finally:
            s.close()
    ex(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    conn.close()


EXTRA_DDL_PG = """CREATE DOMAIN {s}.posint AS int CHECK (VALUE > 0);
CREATE TABLE {s}.extra (id int PRIMARY KEY, c5 char(5), nn numeric, rr real, dd double precision,
  ip inet, iv interval, dm {s}.posint, m2 int[], tzi timestamptz, b bool, o oid)"""
EXTRA_ROWS_PG = """INSERT INTO {s}.extra VALUES
  (1, 'ab', 'NaN', 'NaN', '-Infinity', '10.1.2.3/8', '1 day 02:03:04.5', 5, '{{{{1,2}},{{3,4}}}}', 'infinity',
   false, 42),
  (2, 'abcde', '0.000001000', 1.5e-7, 1e300, '::1', '-3 mons', 1, '{{}}', '2024-06-01 12:00:00+05:30',
   true, 0)"""


def write_pg_typed_rows(ex, s: str) -> None:
    """The typed rows of ``types`` and ``extra`` (every type at its edges), and a row of each
    with only its key (every other column null)."""
    ex(pg_types.TYPES_ROW.format(s=s))
    ex(f"INSERT INTO {s}.types (id) VALUES (2)")
    ex(EXTRA_ROWS_PG.format(s=s))
    ex(f"INSERT INTO {s}.extra (id) VALUES (3)")


def test_postgres_snapshot_values_equal_the_log_values(pg):
    ex, s, source = pg
    ex(pg_types.TYPES_DDL.format(s=s))
    ex(EXTRA_DDL_PG.format(s=s))
    ex(f"ALTER TABLE {s}.types REPLICA IDENTITY FULL")
    src = source("types", "extra")
    assert src.replication_slot.ensure() is not None
    start = src.head()
    write_pg_typed_rows(ex, s)
    logged = log_after(src, start)
    types, extra = src.snapshots().tables()
    rows = []
    for table in (types, extra):
        chunks, _ = read_all(src, table, 2)
        rows += [dict(r, _t=table.table) for c in chunks for r in c]
    snap = {}
    for r in rows:
        t = r.pop("_t")
        snap.setdefault(t, {}).update(by_key([r], ("id",)))
    # the log keys rows by id alone: compare per table
    assert len(snap["types"]) == 2 and len(snap["extra"]) == 3 and len(logged) == 3  # ids 1-3 overlap
    log_types = {json.dumps(e.key, sort_keys=True): e.after for e in src.read(start, src.head())
                 if isinstance(e, ChangeEvent) and e.table == "types"}
    log_extra = {json.dumps(e.key, sort_keys=True): e.after for e in src.read(start, src.head())
                 if isinstance(e, ChangeEvent) and e.table == "extra"}
    assert snap["types"] == log_types
    assert snap["extra"] == log_extra
    assert snap["types"]['{"id": 1}'] == pg_types.TYPES_EXPECTED
    one = snap["extra"]['{"id": 1}']
    assert one["c5"] == "ab   " and one["nn"] is None and one["dm"] == "5" and one["m2"] == [[1, 2], [3, 4]]


def test_postgres_snapshot_events_are_the_log_rows_as_stdlib_json(pg):
    ex, s, source = pg
    ex(pg_types.TYPES_DDL.format(s=s))
    ex(EXTRA_DDL_PG.format(s=s))
    ex(f"CREATE TABLE {s}.floats (k double precision PRIMARY KEY, f real, d double precision)")
    for t in ("types", "extra", "floats"):
        ex(f"ALTER TABLE {s}.{t} REPLICA IDENTITY FULL")
    src = source("types", "extra", "floats")
    assert src.replication_slot.ensure() is not None
    start = src.head()
    write_pg_typed_rows(ex, s)
    ex(f"INSERT INTO {s}.floats VALUES (0.5, 0.25, 1e-5), (1e-7, 1.5, 2.5), (1e20, 0, '-0'), (3, NULL, 1e16)")
    events = assert_events_are_the_log_rows_as_stdlib_json(src, start, ["extra", "floats", "types"])
    assert len(events) == 9


def test_postgres_chunks_cover_a_composite_key_exactly_once(pg):
    ex, s, source = pg
    ex(f"CREATE TABLE {s}.lines (a int, b text, v int, PRIMARY KEY (b, a))")
    ex(f"INSERT INTO {s}.lines SELECT g % 7, 'k' || (g % 13), g FROM generate_series(1, 91) g")
    ex(f"CREATE TABLE {s}.stamps (at timestamptz, id uuid, PRIMARY KEY (at, id))")
    ex(f"INSERT INTO {s}.stamps SELECT '2024-01-01'::timestamptz + g * interval '1 microsecond', "
       f"md5(g::text)::uuid FROM generate_series(1, 20) g")
    src = source("lines", "stamps")
    lines, stamps = src.snapshots().tables()
    assert lines.key == ("b", "a") and stamps.key == ("at", "id")
    chunks, plan = read_all(src, lines, 7)
    assert len(plan) == 14 and all(len(c) <= 7 for c in chunks)
    keys = [(r["b"], r["a"]) for c in chunks for r in c]
    assert len(keys) == len(set(keys)) == 91
    ex(f"INSERT INTO {s}.lines VALUES (0, 'a', 0), (9, 'zz', 0)")
    assert [r["b"] for r in src.snapshots().read_chunk(lines, *plan[0])][0] == "a"
    assert [r["b"] for r in src.snapshots().read_chunk(lines, *plan[-1])][-1] == "zz"
    chunks, plan = read_all(src, stamps, 3)
    assert [len(c) for c in chunks] == [3] * 6 + [2] and len({r["id"] for c in chunks for r in c}) == 20


def test_postgres_table_without_primary_key_is_refused_by_name(pg):
    ex, s, source = pg
    ex(f"CREATE TABLE {s}.heap (v int)")
    with pytest.raises(SnapshotError, match=rf"table {s}\.heap has no primary key"):
        source("heap").snapshots().tables()


# --------------------------------------------------------------------- commits logged before they are visible


def test_mariadb_semisync_commit_waiting_for_its_ack_is_after_the_handoff(my, mysql):
    """Semi-sync AFTER_SYNC with no replica: an UPDATE is in the binlog (the head is past it) and
    invisible. The handoff lies before it, so the log from the handoff delivers it; a chunk read
    meanwhile does not show it, and its upper bound covers it."""
    import threading

    ex, db, source = my
    ex(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v INT)")
    ex(f"INSERT INTO {db}.t VALUES (1, 0), (2, 0)")
    src = source("t")
    [table] = src.snapshots().tables()
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    waiter = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    a = admin.cursor().execute
    semisync = SemiSync(mysql.mysql_kwargs()["port"], a)
    try:
        semisync.on()
        t = threading.Thread(target=lambda: waiter.cursor().execute(f"UPDATE {db}.t SET v = 1 WHERE id = 1"))
        t.start()
        deadline = time.monotonic() + 10
        head = src.head()
        while not list(src.read(src.snapshots().handoff(head), head))[:-1] and time.monotonic() < deadline:
            time.sleep(0.05)  # until the UPDATE is in the binlog
            head = src.head()
        handoff = src.snapshots().handoff(head)
        assert handoff < head, "the waiting commit is in the binlog before the head"
        upper, rows = src.snapshots().open_chunk(table, None, None)
        assert [r["v"] for r in rows] == [0, 0], "the waiting commit is not visible yet"
        changes = [e for e in src.read(handoff, upper) if isinstance(e, ChangeEvent)]
        assert [(e.key, e.after["v"]) for e in changes] == [({"id": 1}, 1)]
        assert t.is_alive()
    finally:
        semisync.off()
        t.join(10)
        admin.close()
        waiter.close()
    assert not t.is_alive()


def test_postgres_handoff_waits_for_a_commit_held_by_a_synchronous_standby(pg, postgres):
    """A commit waiting for a synchronous standby that never answers (only the writer's session
    waits: synchronous_commit=local elsewhere) is flushed before the head and invisible; the
    handoff waits until it is visible, so every chunk read after it shows it."""
    import threading

    ex, schema, source = pg
    ex(f"CREATE TABLE {schema}.t (id int PRIMARY KEY, v int)")
    ex(f"INSERT INTO {schema}.t VALUES (1, 0), (2, 0)")
    src = source("t")
    src.replication_slot.ensure()
    [table] = src.snapshots().tables()
    admin = psycopg2.connect(postgres.admin_dsn)
    admin.autocommit = True
    waiter = psycopg2.connect(postgres.admin_dsn)
    waiter.autocommit = True
    a = admin.cursor().execute
    a("SET synchronous_commit = local")
    released: list[float] = []
    try:
        a("ALTER SYSTEM SET synchronous_standby_names = 'tidegate_nobody'")
        a("SELECT pg_reload_conf()")
        time.sleep(0.5)
        t = threading.Thread(target=lambda: waiter.cursor().execute(
            f"UPDATE {schema}.t SET v = 1 WHERE id = 1"))
        t.start()
        time.sleep(1.0)
        head = src.head()
        rows = src.snapshots().read_chunk(table, None, None)
        assert [r["v"] for r in rows] == [0, 0], "flushed, not visible"
        assert t.is_alive()

        def release_later() -> None:
            time.sleep(2.0)
            released.append(time.monotonic())
            a("ALTER SYSTEM RESET synchronous_standby_names")
            a("SELECT pg_reload_conf()")

        r = threading.Thread(target=release_later)
        r.start()
        assert src.snapshots().handoff(head) == head
        done = time.monotonic()
        r.join()
        assert released and done >= released[0], "the handoff waited for the standby's answer"
        assert [r["v"] for r in src.snapshots().read_chunk(table, None, None)] == [1, 0]
    finally:
        a("ALTER SYSTEM RESET synchronous_standby_names")
        a("SELECT pg_reload_conf()")
        t.join(10)
        admin.close()
        waiter.close()
    assert not t.is_alive()


# --------------------------------------------------------------------------- MariaDB: compiled chunk rows

COMPILED_DDL = """CREATE TABLE {db}.gen (
  id BIGINT PRIMARY KEY, u BIGINT UNSIGNED, i INT, si SMALLINT, ti TINYINT, mi MEDIUMINT,
  z INT(6) ZEROFILL, y YEAR, d2 DECIMAL(12,2), d10 DECIMAL(20,10), db DOUBLE, c CHAR(8),
  vc VARCHAR(40), tx TEXT, en ENUM('a','b','c d'), bn BINARY(4), vb VARBINARY(20), bl BLOB,
  dt DATE, t0 DATETIME, t3 DATETIME(3), t6 DATETIME(6), ts TIMESTAMP(6) NULL)"""

_TEXT_CHARS = "ab \"\\'\n\t\x01\x1fé€😀中"


def _generated_rows(rng: random.Random, n: int) -> list[tuple]:
    """Rows of :data:`COMPILED_DDL` with edge values of every column kind: NULLs, extremes,
    ZEROFILL and small decimals (the Python path writes those), zero and impossible dates
    (``sql_mode=''``), fractions of every width, escapes and non-ASCII text, bytes."""
    def pick(*choices):
        return rng.choice(choices)

    def rare(common, *edges):  # an edge value the compiled path leaves to the Python path, or not
        return rng.choice(edges) if rng.random() < 0.15 else common

    def text(k):
        return "".join(rng.choice(_TEXT_CHARS) for _ in range(rng.randint(0, k)))

    def stamp(frac):
        if rng.random() < 0.1:
            return pick("0000-00-00 00:00:00", "2024-02-30 01:02:03", None)
        base = f"{rng.randint(1000, 2037):04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} " \
               f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
        return base + ("." + "".join(rng.choice("0000123456789") for _ in range(frac)) if frac else "")

    rows = []
    for k in range(1, n + 1):
        rows.append((
            k * rng.choice((1, 1, 3)) if k > 1 else -2**63,
            pick(0, 2**64 - 1, rng.randint(0, 2**64 - 1), None),
            pick(-2**31, 2**31 - 1, rng.randint(-1000, 1000), None),
            rng.randint(-2**15, 2**15 - 1), pick(-128, 127, 0, None), rng.randint(-2**23, 2**23 - 1),
            rare(None, 0, 7, 123456), pick(0, 1901, 2155, 2024, None),
            pick("0.00", "-0.01", "9999999999.99", f"{rng.uniform(-1e6, 1e6):.2f}", None),
            rare(f"{rng.uniform(-1e5, 1e5):.10f}", "0.0000000000", "0.0000010000", "0.0000001000",
                 "-1.5000000000", None),
            rare(rng.uniform(-1e9, 1e9), 0.0, -0.0, 1e-5, 1e16, 1e300, -2.5e-300, 1 / 3, None),
            text(8), text(40), text(200), pick("a", "b", "c d", None),
            pick(b"", b"\x00\x01", bytes(rng.randrange(256) for _ in range(4)), None),
            bytes(rng.randrange(256) for _ in range(rng.randint(0, 20))),
            pick(None, bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))),
            pick("0000-00-00", "2024-02-29", "2023-02-29", "0001-01-01", "9999-12-31", None),
            stamp(0), stamp(3), stamp(6),
            pick(None, "1970-01-01 00:00:01.000000", "2038-01-19 03:14:07.999999",
                 (stamp(6) or "2001-01-01 00:00:00")[:19]),
        ))
    return rows


@pytest.mark.parametrize("seed", [71, 72, 73])
def test_mysql_compiled_chunk_rows_are_the_python_and_the_log_rows(my, seed):
    """A table whose columns are all of the compiled path's kinds, filled from a seed: every
    chunk's events (rows written from the server's packets) have the bytes of the Python path's
    events of the same chunk (pymysql's values through RowEvents), and their ``after`` is the
    log event's; nearly all of them came from the compiled path."""
    from tidegate.native import rowcodec

    assert rowcodec is not None, "the compiled path is not built (make native)"
    ex, db, source = my
    ex(COMPILED_DDL.format(db=db))
    src = source("gen")
    start = src.head()
    ex("SET time_zone = '+00:00'")
    ex("SET sql_mode = ''")
    rows = _generated_rows(random.Random(seed), 120)
    ex(f"INSERT IGNORE INTO {db}.gen VALUES " + ", ".join(["(" + ", ".join(["%s"] * 23) + ")"] * len(rows)),
       [v for r in rows for v in r])
    assert_compiled_rows_are_the_python_rows(src, start)


def assert_compiled_rows_are_the_python_rows(src, start):
    """The snapshot of the source's one table ``gen``: its events are the log's rows as the
    stdlib writes them; the compiled path wrote most of them, and every chunk's events have the
    bytes the Python path gives the same chunk (the rows' values through RowEvents)."""
    from tidegate.native import rowcodec
    from tidegate.shipped import ShippedEvent

    assert rowcodec is not None, "the compiled path is not built (make native)"
    events = assert_events_are_the_log_rows_as_stdlib_json(src, start, ["gen"])
    compiled = sum(isinstance(e, ShippedEvent) for e in events)
    # both paths ran: rows with a value the compiled path leaves to the Python path (a ZEROFILL
    # number, a small DECIMAL, NaN...) took it, the others the compiled one
    assert len(events) * 0.3 <= compiled < len(events), f"{compiled} of {len(events)} rows compiled"
    rec = snapshot.plan_snapshot(src.spec, src, handoff=src.head(), kind="start")
    for n in range(1, len(rec.chunks) + 1):
        table, c = snapshot.chunk_table(rec, n), rec.chunks[n - 1]
        fast = list(snapshot.read_chunk(src.spec, src, rec, n).events)
        _, plain_rows = src.snapshots().open_chunk(table, c["lo"], c["hi"])
        build = snapshot.RowEvents(src.spec, rec, table, n, src.connector, src.column_filters)
        plain = list(snapshot_rows._marked_rows(plain_rows, build, final=c["hi"] is None))
        assert [(e.value, e.key_bytes, e.idempotency_key) for e in fast] == \
            [(e.value, e.key_bytes, e.idempotency_key) for e in plain]
        assert all(type(e) is ChangeEvent for e in plain)


COMPILED_DDL_PG = """CREATE TABLE {s}.gen (
  id bigint PRIMARY KEY, i2 smallint, i4 int, o oid, n2 numeric(12,2), n numeric, r real,
  d double precision, b bool, t text, vc varchar(40), c char(8), dt date, tm time, u uuid, j jsonb,
  iv interval, t0 timestamp(0), t3 timestamp(3), tz timestamptz(6), ip inet)"""


def generated_rows_pg(rng: random.Random, n: int) -> list[tuple]:
    """Rows of :data:`COMPILED_DDL_PG` with edge values: NaN and the infinities, negative zero,
    numerics Decimal writes in exponent form, BC and infinite timestamps, escapes and non-ASCII
    text (no NUL: PostgreSQL's text refuses it)."""
    def pick(*choices):
        return rng.choice(choices)

    def rare(common, *edges):
        return rng.choice(edges) if rng.random() < 0.15 else common

    def text(k):
        return "".join(rng.choice("ab \"\\'\n\t\x01\x1fé€😀中") for _ in range(rng.randint(0, k)))

    def stamp(frac, zone=""):
        if rng.random() < 0.1:
            return pick("infinity", "-infinity", "0044-03-15 12:00:00 BC", None)
        base = f"{rng.randint(1, 9999):04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} " \
               f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
        return base + ("." + "".join(rng.choice("0000123456789") for _ in range(frac)) if frac else "") + zone

    return [(
        k * rng.choice((1, 1, 3)) if k > 1 else -2**63,
        pick(-2**15, 2**15 - 1, 0, None), rng.randint(-2**31, 2**31 - 1), pick(0, 4294967295, 42),
        pick("0.00", "-0.01", "9999999999.99", f"{rng.uniform(-1e6, 1e6):.2f}", None),
        rare(f"{rng.uniform(-1e5, 1e5):.6f}", "NaN", "0.000000100", "1e-9", "123456789012345678901234567890",
             "0.0", "-0.000001", None),
        rare(rng.uniform(-1e9, 1e9), "NaN", "-0", "Infinity", 1e-5, 3.4e38, None),
        rare(rng.uniform(-1e9, 1e9), "NaN", "-0", "-Infinity", 1e-7, 1e16, 1e300, 1 / 3, None),
        pick(True, False, None), text(200), text(40), text(8),
        pick("2024-02-29", "0001-01-01", "infinity", "0044-03-15 BC", None),
        pick("00:00:00", "23:59:59.999999", "12:30:00.5", None),
        str(uuid.UUID(int=rng.getrandbits(128))), pick('{"a": [1, 2.5, "é"]}', "[]", "null", None),
        pick("1 day 02:03:04.5", "-3 mons", "00:00:00", None),
        stamp(0), stamp(3), stamp(6, pick("+00", "+05:30", "-08")), pick("10.1.2.3/8", "::1", None),
    ) for k in range(1, n + 1)]


@pytest.mark.parametrize("seed", [81, 82, 83])
def test_postgres_compiled_chunk_rows_are_the_python_and_the_log_rows(pg, seed):
    """As the MariaDB test above, on PostgreSQL: the compiled path writes a chunk's events from
    each column's output text."""
    ex, s, source = pg
    ex(COMPILED_DDL_PG.format(s=s))
    ex(f"ALTER TABLE {s}.gen REPLICA IDENTITY FULL")
    src = source("gen")
    assert src.replication_slot.ensure() is not None
    start = src.head()
    rows = generated_rows_pg(random.Random(seed), 120)
    values = ", ".join(["(" + ", ".join(["%s"] * 21) + ")"] * len(rows))
    ex(f"INSERT INTO {s}.gen VALUES {values} ON CONFLICT DO NOTHING", [v for r in rows for v in r])
    assert_compiled_rows_are_the_python_rows(src, start)
