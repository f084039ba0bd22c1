"""The Postgres (wal2json) source against the real PostgreSQL of scripts/services.

Each test works in its own schema with its own slot, and drops both.
"""

from __future__ import annotations

import json
import time
import uuid

import psycopg2
import pytest
from tidegate.batching import cut_sub_batches
from tidegate.errors import PositionPurgedError, SlotInvalidatedError, SlotMissingError
from tidegate.events import ChangeEvent, PositionMark
from tidegate.sources import make_source
from tidegate.sources.postgres.position import Lsn, PgPosition
from tidegate.sources.postgres.source import PostgresSource
from tidegate.sources.postgres.values import UNAVAILABLE
from tidegate.spec import PipelineSpec, SourceSpec

pytestmark = pytest.mark.integration


@pytest.fixture()
def admin(postgres):
    conn = psycopg2.connect(postgres.admin_dsn)
    conn.autocommit = True
    yield conn
    conn.close()


@pytest.fixture()
def schema(admin):
    name = "srcp_" + uuid.uuid4().hex[:10]
    q(admin, f"CREATE SCHEMA {name}")
    yield name
    q(admin, f"DROP SCHEMA IF EXISTS {name} CASCADE")


@pytest.fixture()
def make(postgres, schema):
    """make(tables) → a PostgresSource with its own slot (created now, dropped at the end)."""
    made = []

    def _make(tables, create=True):
        spec = PipelineSpec(pipeline="src_test", tenant="acme", sinks=(),
                            source=SourceSpec(kind="postgres", conn_id="cdc_postgres",
                                              tables=tuple(f"{schema}.{t}" for t in tables),
                                              slot="srcp_" + uuid.uuid4().hex[:12]))
        src = make_source(spec, postgres.cdc)
        assert isinstance(src, PostgresSource)
        made.append(src)
        if create:
            assert src.replication_slot.ensure() is not None
            assert src.replication_slot.ensure() is None  # idempotent
        return src

    yield _make
    for src in made:
        try:
            src.replication_slot.drop()
        finally:
            src.close()


def q(conn, sql, *args):
    with conn.cursor() as c:
        c.execute(sql, args or None)
        return c.fetchall() if c.description else None


def tx(conn, *sqls):
    conn.autocommit = False
    try:
        with conn.cursor() as c:
            for s in sqls:
                c.execute(s)
        conn.commit()
    finally:
        conn.autocommit = True


def rows(items):
    return [i for i in items if isinstance(i, ChangeEvent)]


def fingerprint(items):
    return [(e.value, e.tx_end, e.end_position.to_json() if e.end_position else None)
            for e in rows(items)]


# --------------------------------------------------------------------------- types

TYPES_DDL = """CREATE TABLE {s}.types (
  id int PRIMARY KEY, sm smallint, i int, bi bigint, nu numeric(30,10), nu0 numeric,
  r real, d double precision, t text, vc varchar(20), by bytea, bo boolean, dt date, tm time(6),
  ts timestamp(6), tz timestamptz, u uuid, j json, jb jsonb, ia int[], ta text[], n int)"""

TYPES_ROW = r"""INSERT INTO {s}.types VALUES (1, -32768, -2147483648, -9223372036854775808,
  '-12345678901234567890.0123456789', '123456789012345678901234567890.5000', 3.14,
  2.718281828459045, 'tëxt ✓ 😀', 'héllo', '\x00ff10', true, '2024-02-29', '23:59:59.999999',
  '2024-01-02 03:04:05.123456', '2024-01-02 03:04:05.5+02', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
  '{{"b": [1, 2.50]}}', '{{"a": 1}}', '{{1,NULL,3}}', ARRAY['a b', 'c,d', NULL, 'q"x', '{{y}}'], NULL)"""

TYPES_EXPECTED = {
    "id": 1, "sm": -32768, "i": -2147483648, "bi": -9223372036854775808,
    "nu": "-12345678901234567890.0123456789", "nu0": "123456789012345678901234567890.5000",
    "r": 3.14, "d": 2.718281828459045, "t": "tëxt ✓ 😀", "vc": "héllo", "by": "AP8Q", "bo": True,
    "dt": "2024-02-29", "tm": "23:59:59.999999", "ts": "2024-01-02T03:04:05.123456",
    "tz": "2024-01-02T01:04:05.5+00:00", "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
    "j": '{"b": [1, 2.50]}', "jb": '{"a": 1}', "ia": [1, None, 3], "ta": ["a b", "c,d", None, 'q"x', "{y}"],
    "n": None,
}


def test_every_listed_type_has_its_exact_json_value(admin, schema, make):
    q(admin, TYPES_DDL.format(s=schema))
    src = make(["types"])
    start = src.head()
    q(admin, TYPES_ROW.format(s=schema))
    q(admin, f"INSERT INTO {schema}.types (id) VALUES (2)")
    got = rows(src.read(start, src.head()))
    assert [e.op for e in got] == ["c", "c"]
    assert got[0].after == TYPES_EXPECTED
    assert json.loads(got[0].value)["after"] == TYPES_EXPECTED
    assert got[0].key == {"id": 1}
    assert got[1].after == {k: (2 if k == "id" else None) for k in TYPES_EXPECTED}
    assert got[0].connector == "postgresql" and got[0].schema == schema


def test_unchanged_toast_is_never_null(admin, schema, make):
    big = "(SELECT string_agg(md5(g::text || random()::text), '') FROM generate_series(1, 400) g)"
    q(admin, f"CREATE TABLE {schema}.full_t (id int PRIMARY KEY, v int, big text)",
      )
    q(admin, f"ALTER TABLE {schema}.full_t REPLICA IDENTITY FULL")
    q(admin, f"CREATE TABLE {schema}.dflt_t (id int PRIMARY KEY, v int, big text)")
    q(admin, f"INSERT INTO {schema}.full_t VALUES (1, 1, {big})")
    q(admin, f"INSERT INTO {schema}.dflt_t VALUES (1, 1, {big})")
    (full_big,) = q(admin, f"SELECT big FROM {schema}.full_t")[0]
    assert len(full_big) == 12800
    src = make(["full_t", "dflt_t"])
    start = src.head()
    q(admin, f"UPDATE {schema}.full_t SET v = 2")
    q(admin, f"UPDATE {schema}.dflt_t SET v = 2")
    full, dflt = rows(src.read(start, src.head()))
    assert full.after == {"id": 1, "v": 2, "big": full_big}
    assert full.before == {"id": 1, "v": 1, "big": full_big}
    assert dflt.after == {"id": 1, "v": 2, "big": UNAVAILABLE}
    assert dflt.before == {"id": 1}
    problems = src.preflight()
    ri = [p for p in problems if p.code == "replica_identity"]
    assert len(ri) == 1 and ri[0].detail["tables"] == [f"{schema}.dflt_t"]


# --------------------------------------------------------------------------- workload


def create_workload_tables(admin, schema):
    for t in ("orders", "items", "ignored"):
        cols = {"orders": "id bigint PRIMARY KEY, status text, total numeric(10,2)",
                "items": "id bigint PRIMARY KEY, order_id bigint, sku text",
                "ignored": "id bigint PRIMARY KEY"}[t]
        q(admin, f"CREATE TABLE {schema}.{t} ({cols})")
        q(admin, f"ALTER TABLE {schema}.{t} REPLICA IDENTITY FULL")


def workload_phase(admin, s: str, phase: int, big: int = 0) -> int:
    base = phase * 1_000_000
    n = 0
    for k in range(20):
        q(admin, f"INSERT INTO {s}.orders VALUES ({base + k}, 'new', {k}.50)")
        n += 1
    q(admin, f"UPDATE {s}.orders SET status = 'paid' WHERE id BETWEEN {base} AND {base + 9}")
    n += 10
    q(admin, f"DELETE FROM {s}.orders WHERE id BETWEEN {base + 15} AND {base + 19}")
    n += 5
    tx(admin, f"INSERT INTO {s}.orders VALUES ({base + 100}, 'multi', 1.00)",
       f"INSERT INTO {s}.items VALUES ({base + 100}, {base + 100}, 'sku-1'), "
       f"({base + 101}, {base + 100}, 'sku-2')",
       f"INSERT INTO {s}.ignored VALUES ({base + 100})",
       f"UPDATE {s}.orders SET status = 'shipped' WHERE id = {base + 100}")
    n += 4
    q(admin, f"INSERT INTO {s}.ignored VALUES ({base + 200})")  # only filtered rows
    q(admin, f"COMMENT ON TABLE {s}.orders IS 'phase {phase}'")  # an empty transaction
    if big:
        q(admin, f"INSERT INTO {s}.items SELECT {base} + 10000 + g, g, 'bulk-' || g "
                 f"FROM generate_series(1, {big}) g")
        n += big
    return n


def test_three_bounded_runs_equal_one_read(admin, schema, make):
    create_workload_tables(admin, schema)
    src = make(["orders", "items"])
    h = [src.head()]
    expected = 0
    for phase in range(3):
        expected += workload_phase(admin, schema, phase, big=50_000 if phase == 1 else 0)
        h.append(src.head())
    whole = list(src.read(h[0], h[3]))
    runs = [list(src.read(h[i], h[i + 1])) for i in range(3)]
    assert fingerprint(whole) == fingerprint(runs[0] + runs[1] + runs[2])
    events = rows(whole)
    assert len(events) == expected
    assert len({e.idempotency_key for e in events}) == expected
    assert {e.table for e in events} == {"orders", "items"}
    ends = [e.end_position for e in events if e.tx_end]
    assert ends == sorted(ends) and len(set(ends)) == len(ends)
    assert all(h[0] < e <= h[3] for e in ends)
    seen, current = set(), None
    for e in events:
        if e.tx_id != current:
            assert e.tx_id not in seen and e.total_order == 1
            seen.add(e.tx_id)
            current = e.tx_id
        if e.tx_end:  # tx_id = xid:commit LSN; the commit record starts before the end
            xid, commit = e.tx_id.split(":")
            assert int(xid) > 0 and Lsn.parse(commit) < e.end_position.lsn
    bulk = [e for e in events if e.table == "items" and e.after and e.after["sku"].startswith("bulk-")]
    assert len(bulk) == 50_000 and len({e.tx_id for e in bulk}) == 1
    ident = src.identity()
    assert ends[0].system_id == ident["system_id"] and ends[0].timeline == ident["timeline"]
    # each run ends at its bound (empty/filtered transactions at the end → a position mark)
    for i, run in enumerate(runs):
        last = run[-1]
        pos = last.position if isinstance(last, PositionMark) else last.end_position
        assert pos == h[i + 1]
    batches = list(cut_sub_batches(iter(whole), max_events=10_000, max_bytes=1 << 30))
    assert sum(b.event_count for b in batches) == expected
    assert batches[-1].end_position == h[3]
    # read in a child process (tidegate run), the items are the same, rebuilt from their bytes
    from tidegate.reader_process import read_in_child

    shipped = list(read_in_child(src, h[0], h[3]))
    assert fingerprint(shipped) == fingerprint(whole)
    assert [(e.idempotency_key, e.op, e.schema, e.table, e.tx_id) for e in rows(shipped)] == \
        [(e.idempotency_key, e.op, e.schema, e.table, e.tx_id) for e in rows(whole)]
    assert [i.position for i in shipped if isinstance(i, PositionMark)] == \
        [i.position for i in whole if isinstance(i, PositionMark)]
    # the read does not consume: the slot has not moved
    assert Lsn.parse(src.replication_slot.info()["confirmed_flush_lsn"]) <= h[0].lsn


def test_a_range_handed_to_a_reader_process_ahead_is_what_the_run_reads(admin, schema, make):
    """`tidegate run` hands the bounds step's plan to its reader process before it opens the
    sinks, so the WAL sender decodes meanwhile. Asked for that range, the run gets what the child
    read; asked for another (the run planned again: a checkpoint moved back), the early read is
    stopped, letting go of the slot, and the range asked for is read; handed over and never asked
    for, closing the reader stops it. Nothing moves the slot."""
    import multiprocessing

    from tidegate.reader_process import ReaderProcess
    from tidegate.segments import Slice

    create_workload_tables(admin, schema)
    src = make(["orders", "items"])
    h0 = src.head()
    workload_phase(admin, schema, 0)
    h1 = src.head()
    workload_phase(admin, schema, 2)
    h2 = src.head()
    whole, later = list(src.read(h0, h2)), list(src.read(h1, h2))
    assert len(rows(later)) < len(rows(whole))

    def started(before: set) -> multiprocessing.Process:
        [child] = set(multiprocessing.active_children()) - before
        return child

    before = set(multiprocessing.active_children())
    with ReaderProcess(min_bytes=0) as reader:
        reader.warm_up("postgres")
        reader.ahead(src, [Slice(h0, h1), Slice(h1, h2)])  # touching slices: one read
        early = started(before)
        assert fingerprint(reader.read_log(src, Slice(h0, h2))) == fingerprint(whole)
        assert not early.is_alive()
        reader.ahead(src, [Slice(h0, h2)])
        early = started(before)
        assert fingerprint(reader.read_log(src, Slice(h1, h2))) == fingerprint(later)
        assert not early.is_alive()
        reader.ahead(src, [Slice(h0, h2)])
        unread = started(before)
    assert not unread.is_alive()
    assert Lsn.parse(src.replication_slot.info()["confirmed_flush_lsn"]) <= h0.lsn


def test_writes_made_while_a_run_reads_are_in_the_next_run(admin, schema, make):
    create_workload_tables(admin, schema)
    src = make(["orders"])
    h0 = src.head()
    for k in range(50):
        q(admin, f"INSERT INTO {schema}.orders VALUES ({k}, 'before', 1)")
    h1 = src.head()
    it = src.read(h0, h1)
    first = [next(it)]
    q(admin, f"INSERT INTO {schema}.orders VALUES (1000, 'during', 1)")
    run1 = first + list(it)
    assert [e.after["id"] for e in rows(run1)] == list(range(50))
    h2 = src.head()
    assert [e.after["id"] for e in rows(src.read(h1, h2))] == [1000]


def test_a_transaction_committing_after_the_bound_is_in_the_next_run(admin, schema, make, postgres):
    create_workload_tables(admin, schema)
    src = make(["orders"])
    h0 = src.head()
    other = psycopg2.connect(postgres.admin_dsn)
    try:
        with other.cursor() as c:  # begins (and writes) before the bound, commits after it
            c.execute(f"INSERT INTO {schema}.orders VALUES (1, 'open', 1)")
            q(admin, f"INSERT INTO {schema}.orders VALUES (2, 'committed', 1)")
            h1 = src.head()
        other.commit()
    finally:
        other.close()
    h2 = src.head()
    assert [e.after["id"] for e in rows(src.read(h0, h1))] == [2]
    assert [e.after["id"] for e in rows(src.read(h1, h2))] == [1]


# --------------------------------------------------------------------------- slot


def test_release_advances_the_slot_never_past_or_back(admin, schema, make):
    create_workload_tables(admin, schema)
    src = make(["orders"])
    h0 = src.head()
    q(admin, f"INSERT INTO {schema}.orders VALUES (1, 'a', 1)")
    h1 = src.head()
    q(admin, f"INSERT INTO {schema}.orders VALUES (2, 'b', 1)")
    h2 = src.head()
    first = rows(src.read(h0, h1))
    src.release(first[-1].end_position)
    assert src.replication_slot.info()["confirmed_flush_lsn"] == str(first[-1].end_position.lsn)
    src.release(h0)  # never backwards
    assert src.replication_slot.info()["confirmed_flush_lsn"] == str(first[-1].end_position.lsn)
    assert [e.after["id"] for e in rows(src.read(first[-1].end_position, h2))] == [2]
    with pytest.raises(PositionPurgedError) as err:
        list(src.read(h0, h2))
    assert err.value.requested == h0
    assert err.value.earliest_available == first[-1].end_position


def test_dropped_slot_raises_slot_missing_with_the_position(admin, schema, make):
    create_workload_tables(admin, schema)
    src = make(["orders"])
    h0 = src.head()
    q(admin, f"INSERT INTO {schema}.orders VALUES (1, 'a', 1)")
    src.replication_slot.drop()
    with pytest.raises(SlotMissingError) as err:
        list(src.read(h0, src.head()))
    assert err.value.requested == h0 and err.value.slot == src.slot
    assert isinstance(err.value.earliest_available, PgPosition) and err.value.earliest_available > h0
    problems = src.check_server(checkpoint=h0)
    assert any(p.code == "slot" and p.severity == "error" for p in problems)


def test_invalidated_slot_raises_slot_invalidated(admin, schema, make):
    create_workload_tables(admin, schema)
    src = make(["orders"])
    h0 = src.head()
    q(admin, f"INSERT INTO {schema}.orders VALUES (1, 'a', 1)")
    (keep,) = q(admin, "SELECT setting::bigint FROM pg_settings WHERE name = 'wal_keep_size'")[0]
    try:
        # test-only: let the server drop WAL a slot still needs, then restore the setting
        q(admin, "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        q(admin, "SELECT pg_reload_conf()")
        time.sleep(0.2)
        deadline = time.monotonic() + 60
        while src.replication_slot.info()["wal_status"] != "lost":
            assert time.monotonic() < deadline, src.replication_slot.info()
            for _ in range(max(2, keep // 16 + 2)):  # past wal_keep_size, segment by segment
                q(admin, f"INSERT INTO {schema}.ignored VALUES ({uuid.uuid4().int % 10**12})")
                q(admin, "SELECT pg_switch_wal()")
            q(admin, "CHECKPOINT")
    finally:
        q(admin, "ALTER SYSTEM RESET max_slot_wal_keep_size")
        q(admin, "SELECT pg_reload_conf()")
    with pytest.raises(SlotInvalidatedError) as err:
        list(src.read(h0, src.head()))
    assert err.value.requested == h0 and err.value.slot == src.slot
    problems = src.check_server(checkpoint=h0)
    assert any(p.code == "slot" and "invalidated" in p.message for p in problems)


def test_preflight_settings_privileges_and_headroom(admin, schema, make):
    create_workload_tables(admin, schema)
    src = make(["orders", "items"])
    problems = src.check_server(checkpoint=src.head())
    assert [p for p in problems if p.severity == "error"] == []
    # a table without REPLICA IDENTITY FULL is listed by name
    q(admin, f"ALTER TABLE {schema}.items REPLICA IDENTITY DEFAULT")
    ri = [p for p in src.preflight() if p.code == "replica_identity"]
    assert len(ri) == 1 and ri[0].detail["tables"] == [f"{schema}.items"]
    assert "REPLICA IDENTITY FULL" in ri[0].message
    missing = PostgresSource(src.spec, src.conn, slot="srcp_never_" + uuid.uuid4().hex[:6])
    assert [p.severity for p in missing.preflight() if p.code == "slot"] == ["warning"]
    missing.close()
