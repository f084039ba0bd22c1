"""The Postgres backend behaves like the SQLite one: fencing, history, rewind, incidents, journal."""


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
    ea = a.acquire_lease("pg", "r1")
    a.write_checkpoints("pg", {"s": p(1), "t": p(1)}, run_id="r1", epoch=ea)
    a.write_checkpoint("pg", "s", p(2), run_id="r1", epoch=ea)
    eb = b.acquire_lease("pg", "r2")
    with pytest.raises(StaleEpochError):
        a.write_checkpoint("pg", "s", p(3), run_id="r1", epoch=ea)
    assert {k: r.position for k, r in b.checkpoints("pg").items()} == {"s": p(2), "t": p(1)}
    b.write_checkpoint("pg", "s", p(4), run_id="r2", epoch=eb)
    rec = b.rewind_checkpoint("pg", "s", 1, reason="test", who="ci")
    assert rec.version == 4 and rec.position == p(1) and rec.kind == "rewind"
    assert [h.version for h in a.checkpoint_history("pg", "s")] == [1, 2, 3, 4]
    assert a.checkpoint_version("pg", "s", 3).position == p(4)
    with pytest.raises(StoreError):
        a.rewind_checkpoint("pg", "s", 99, reason="x")
    a.set_source_identity("pg", {"system_id": "73"})
    assert b.get_source_identity("pg") == {"system_id": "73"}
    inc = a.record_incident("pg", "slot_invalidated", p(4), p(9), detail="wal_status lost")
    assert b.is_halted("pg") and inc.detected_at.endswith("+00:00")
    b.resolve_incident(inc.id, resolution="accept_gap", who="ci", reason="test data")
    assert not a.is_halted("pg") and a.pipelines() == ["pg"]
    j = a.journal_begin("pg", "r2", interval_start="2026-01-01T00:00:00+00:00")
    a.journal_sink(j, "s", start=None, end=p(4), events=4, bytes=40, status="ok")
    a.journal_finish(j, "success")
    [entry] = b.journal("pg", "r2")
    assert entry.status == "success" and entry.sinks["s"].end == p(4)
    cols = [{"name": "id", "type": "integer"}]
    a.record_table_columns("pg", "public", "t", p(5), cols)
    b.record_table_columns("pg", "public", "t", p(5), cols)  # the same fact again: kept once
    [tc] = b.table_columns("pg")
    assert (tc.schema, tc.table, tc.position, tc.columns) == ("public", "t", p(5), cols)

    # snapshots: the record, per-chunk rows, completion (TIMESTAMPTZ columns come back as text)
    from tidegate.positions import SnapshotPosition
    from tidegate.store import SnapshotRecord

    ec = b.acquire_lease("pg", "r3")
    rec = SnapshotRecord("pg", "s1", "resnapshot", p(9),
                         [{"db": "d", "schema": "d", "table": "t", "key": ["id"]}],
                         [{"table": 0, "lo": None, "hi": ["5"]}, {"table": 0, "lo": ["5"], "hi": None}], 42,
                         reason="gap")
    written = b.begin_snapshot(rec, {"s": SnapshotPosition("s1", 0, p(9))}, epoch=ec)
    assert a.get_checkpoint("pg", "s").position == SnapshotPosition("s1", 0, p(9)) == written["s"].position
    a.record_chunk_rows("pg", "s1", 1, 5)
    a.record_chunk_rows("pg", "s1", 2, 2)
    done = a.finish_snapshot("pg", "s1")
    assert (done.status, done.rows, done.handoff) == ("completed", 7, p(9))
    assert (done.chunks, done.ts_ms) == (rec.chunks, 42)
    assert done.started_at.endswith("+00:00") and done.finished_at
    a.close()
    b.close()
