"""The Postgres backend behaves like the SQLite one: fencing, history, rewind, incidents, journal,
run records."""


import pytest
from tidegate.errors import StaleEpochError
from tidegate.sources.postgres.position import Lsn, PgPosition
from tidegate.store import StoreError, open_store
from tidegate.store.migrations import LATEST

pytestmark = pytest.mark.integration


def p(n: int) -> PgPosition:
    return PgPosition(Lsn(n * 0x100), "7300000000000000001", 1)


def test_postgres_store_end_to_end(pg_scratch_dsn):
    dsn = pg_scratch_dsn
    a, b = open_store(dsn), open_store(dsn)
    assert a.schema_version() == LATEST and b.migrate() == LATEST
    assert "password" not in a.url
    ea = a.leases.acquire("pg", "r1")
    a.checkpoints.write_many("pg", {"s": p(1), "t": p(1)}, run_id="r1", epoch=ea)
    a.checkpoints.write("pg", "s", p(2), run_id="r1", epoch=ea)
    eb = b.leases.acquire("pg", "r2")
    with pytest.raises(StaleEpochError):
        a.checkpoints.write("pg", "s", p(3), run_id="r1", epoch=ea)
    assert {k: r.position for k, r in b.checkpoints.current("pg").items()} == {"s": p(2), "t": p(1)}
    b.checkpoints.write("pg", "s", p(4), run_id="r2", epoch=eb)
    rec = b.checkpoints.rewind("pg", "s", 1, reason="test", who="ci")
    assert rec.version == 4 and rec.position == p(1) and rec.kind == "rewind"
    assert [h.version for h in a.checkpoints.history("pg", "s")] == [1, 2, 3, 4]
    assert a.checkpoints.version("pg", "s", 3).position == p(4)
    with pytest.raises(StoreError):
        a.checkpoints.rewind("pg", "s", 99, reason="x")
    a.checkpoints.set_source_identity("pg", {"system_id": "73"})
    assert b.checkpoints.source_identity("pg") == {"system_id": "73"}
    inc = a.incidents.record("pg", "slot_invalidated", p(4), p(9), detail="wal_status lost")
    assert b.incidents.is_halted("pg") and inc.detected_at.endswith("+00:00")
    b.incidents.resolve(inc.id, resolution="accept_gap", who="ci", reason="test data")
    assert not a.incidents.is_halted("pg") and a.checkpoints.pipelines() == ["pg"]
    j = a.runs.begin("pg", "r2", interval_start="2026-01-01T00:00:00+00:00")
    a.runs.sink(j, "s", start=None, end=p(4), events=4, bytes=40, status="ok")
    a.runs.finish(j, "success")
    [entry] = b.runs.entries("pg", "r2")
    assert entry.status == "success" and entry.sinks["s"].end == p(4)
    cols = [{"name": "id", "type": "integer"}]
    a.columns.record("pg", "public", "t", p(5), cols)
    b.columns.record("pg", "public", "t", p(5), cols)  # the same fact again: kept once
    [tc] = b.columns.all("pg")
    assert (tc.schema, tc.table, tc.position, tc.columns) == ("public", "t", p(5), cols)

    # snapshots: the record, per-chunk rows, completion (TIMESTAMPTZ columns come back as text)
    from tidegate.positions import SnapshotPosition
    from tidegate.store import SnapshotRecord

    ec = b.leases.acquire("pg", "r3")
    rec = SnapshotRecord("pg", "s1", "resnapshot", p(9),
                         [{"db": "d", "schema": "d", "table": "t", "key": ["id"]}],
                         [{"table": 0, "lo": None, "hi": ["5"]}, {"table": 0, "lo": ["5"], "hi": None}], 42,
                         reason="gap")
    written = b.snapshots.begin(rec, {"s": SnapshotPosition("s1", 0, p(9))}, epoch=ec)
    assert a.checkpoints.get("pg", "s").position == SnapshotPosition("s1", 0, p(9)) == written["s"].position
    a.snapshots.record_chunk_rows("pg", "s1", 1, 5)
    a.snapshots.record_chunk_rows("pg", "s1", 2, 2)
    done = a.snapshots.finish("pg", "s1")
    assert (done.status, done.rows, done.handoff) == ("completed", 7, p(9))
    assert (done.chunks, done.ts_ms) == (rec.chunks, 42)
    assert done.started_at.endswith("+00:00") and done.finished_at
    a.close()
    b.close()


def test_postgres_run_records(pg_scratch_dsn):
    a, b = open_store(pg_scratch_dsn), open_store(pg_scratch_dsn)
    try:
        assert a.runs.record("pg", "r1") is None and a.runs.records("pg") == []
        a.runs.put_record("pg", "r1", {"mode": "incremental", "bounds": {"upto": [1, 2]}})
        b.runs.put_record("pg", "r2", {"mode": "replay"})
        b.runs.put_record("other", "r1", {"mode": "dry_run"})
        assert b.runs.record("pg", "r1") == {"mode": "incremental", "bounds": {"upto": [1, 2]}}
        assert a.runs.records("pg") == [("r2", {"mode": "replay"}),
                                        ("r1", {"mode": "incremental", "bounds": {"upto": [1, 2]}})]
        a.runs.put_record("pg", "r1", {"mode": "incremental", "attempt": 2})  # replaced, now the newest
        assert b.runs.records("pg", limit=1) == [("r1", {"mode": "incremental", "attempt": 2})]
        assert [r for r, _ in b.runs.records("pg")] == ["r1", "r2"]
    finally:
        a.close()
        b.close()
