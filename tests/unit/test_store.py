import sqlite3

import pytest
from _tidegate_fakes import pos
from tidegate.errors import StaleEpochError
from tidegate.sources.postgres.position import Lsn, PgPosition
from tidegate.store import StoreError, open_store
from tidegate.store.postgres import redact
from tidegate.store.sqlite import SqliteStore


@pytest.fixture()
def url(tmp_path):
    return f"sqlite:///{tmp_path}/state/ckpt.sqlite"


@pytest.fixture()
def store(url):
    s = open_store(url)
    yield s
    s.close()


def test_sqlite_settings_and_migrations(store, url):
    from tidegate.store.migrations import LATEST, MIGRATIONS

    assert store.schema_version() == LATEST == max(m[0] for m in MIGRATIONS)
    conn = store._conn
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert store.migrate() == LATEST  # idempotent
    rows = conn.execute("SELECT version, description FROM tidegate_schema_version").fetchall()
    assert [r[0] for r in rows] == [m[0] for m in MIGRATIONS]


def test_a_store_of_schema_1_is_migrated_with_its_checkpoints(tmp_path):
    """Existing deployments upgrade in place: version 2 adds columns, nothing is lost."""
    import json
    import sqlite3

    from _tidegate_fakes import pos
    from tidegate.store import migrations

    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.execute(migrations.render(migrations.VERSION_TABLE, "sqlite"))
    for sql in migrations.MIGRATIONS[0][2]:
        conn.execute(migrations.render(sql, "sqlite"))
    conn.execute("INSERT INTO tidegate_schema_version VALUES (1, 'v1', 'then')")
    conn.execute("INSERT INTO tidegate_checkpoints (ckpt_key, version, pipeline, sink_id, position, "
                 "written_at, kind) VALUES ('p::sink::s', 1, 'p', 's', ?, 'then', 'write')",
                 (json.dumps(pos(3).to_json()),))
    conn.commit()
    conn.close()
    store = open_store(f"sqlite:///{path}")
    try:
        rec = store.checkpoints.get("p", "s")
        assert (store.schema_version(), rec.position, rec.control) == (migrations.LATEST, pos(3), None)
    finally:
        store.close()


def test_newer_schema_is_refused(store, url):
    store._conn.execute("INSERT INTO tidegate_schema_version VALUES (99, 'future', 'now')")
    with pytest.raises(StoreError, match="newer"):
        open_store(url)


def test_env_var_and_bad_scheme(tmp_path, monkeypatch):
    monkeypatch.setenv("TIDEGATE_CHECKPOINT_STORE", f"sqlite:///{tmp_path}/env.sqlite")
    with open_store() as s:
        assert s.url.endswith("env.sqlite")
    with pytest.raises(StoreError, match="unsupported"):
        open_store("mongodb://x")


def test_versions_history_and_read_a_version(store):
    e = store.leases.acquire("p", "r1")
    for n in (1, 2, 3):
        rec = store.checkpoints.write("p", "s", pos(n), run_id="r1", epoch=e)
        assert rec.version == n and rec.key == "p::sink::s"
    assert store.checkpoints.get("p", "s").position == pos(3)
    assert [h.version for h in store.checkpoints.history("p", "s")] == [1, 2, 3]
    assert store.checkpoints.version("p", "s", 2).position == pos(2)
    assert store.checkpoints.version("p", "s", 9) is None
    assert store.checkpoints.get("p", "other") is None


def test_stale_epoch_refused_atomically(url):
    a, b = open_store(url), open_store(url)  # two processes' views of one store
    ea = a.leases.acquire("p", "old-run")
    a.checkpoints.write("p", "s", pos(1), run_id="old-run", epoch=ea)
    eb = b.leases.acquire("p", "new-run")
    assert eb == ea + 1
    with pytest.raises(StaleEpochError, match="epoch 1.*current lease epoch is 2"):
        a.checkpoints.write("p", "s", pos(9), run_id="old-run", epoch=ea)
    with pytest.raises(StaleEpochError):
        a.checkpoints.write_many("p", {"s": pos(9), "t": pos(9)}, run_id="old-run", epoch=ea)
    assert b.checkpoints.get("p", "s").position == pos(1)
    assert b.checkpoints.get("p", "t") is None
    b.checkpoints.write("p", "s", pos(2), run_id="new-run", epoch=eb)
    with pytest.raises(StaleEpochError):  # never had a lease at all
        a.checkpoints.write("q", "s", pos(1), run_id="x", epoch=1)
    a.close()
    b.close()


def test_rewind_is_a_recorded_new_version_and_fences(store):
    e = store.leases.acquire("p", "r1")
    store.checkpoints.write("p", "s", pos(1), run_id="r1", epoch=e)
    store.checkpoints.write("p", "s", pos(5), run_id="r1", epoch=e)
    rec = store.checkpoints.rewind("p", "s", 1, reason="re-deliver after consumer bug", who="ann")
    assert (rec.version, rec.position, rec.kind, rec.source_version) == (3, pos(1), "rewind", 1)
    assert rec.reason == "re-deliver after consumer bug" and rec.who == "ann"
    assert store.checkpoints.get("p", "s").position == pos(1)
    with pytest.raises(StaleEpochError):  # the run that was in flight cannot undo the rewind
        store.checkpoints.write("p", "s", pos(6), run_id="r1", epoch=e)
    with pytest.raises(StoreError):
        store.checkpoints.rewind("p", "s", 42, reason="x")
    with pytest.raises(ValueError):
        store.checkpoints.rewind("p", "s", 1, reason=" ")


def test_source_identity(store):
    assert store.checkpoints.source_identity("p") is None
    store.checkpoints.set_source_identity("p", {"system_id": "73", "timeline": 1})
    store.checkpoints.set_source_identity("p", {"system_id": "74", "timeline": 2})
    assert store.checkpoints.source_identity("p") == {"system_id": "74", "timeline": 2}
    e = store.leases.acquire("p", "r")
    with pytest.raises(StaleEpochError):
        store.checkpoints.set_source_identity("p", {"x": 1}, epoch=e - 1)


def test_incidents_halt_until_resolved(store):
    a, b = PgPosition(Lsn.parse("0/100")), PgPosition(Lsn.parse("0/9000"))
    assert not store.incidents.is_halted("p")
    inc = store.incidents.record("p", "slot_dropped", a, b, detail="slot tidegate_p missing", run_id="r1")
    assert store.incidents.is_halted("p") and inc.from_position == a and inc.to_position == b
    store.incidents.record("p", "failover", None, None, resolved=True, resolution="auto", who="tidegate",
                           reason="GTIDs still available")
    assert [i.kind for i in store.incidents.all("p", unresolved_only=True)] == ["slot_dropped"]
    done = store.incidents.resolve(inc.id, resolution="resnapshot", who="bob", reason="ticket 12")
    assert done.resolved and done.resolved_by == "bob" and done.reason == "ticket 12"
    assert not store.incidents.is_halted("p")
    with pytest.raises(StoreError):
        store.incidents.resolve(inc.id, resolution="accept_gap", who="bob", reason="again")
    assert store.incidents.all("p")[0].to_json()["from"] == {"kind": "postgres", "lsn": "0/100",
                                                             "system_id": None, "timeline": None}


def test_journal(store):
    j = store.runs.begin("p", "scheduled__1", interval_start="2026-01-01T00:00:00+00:00",
                         interval_end="2026-01-01T00:01:00+00:00")
    store.runs.sink(j, "s", start=None, end=pos(1), events=1, bytes=10, status="ok")
    store.runs.sink(j, "s", start=None, end=pos(2), events=2, bytes=20, status="ok")
    store.runs.finish(j, "success")
    [entry] = store.runs.entries("p", "scheduled__1")
    assert entry.status == "success" and entry.finished_at and entry.interval_end.endswith("01:00+00:00")
    assert entry.sinks["s"].end == pos(2) and entry.sinks["s"].events == 2
    assert store.runs.entries("p", "other") == []
    assert store.checkpoints.pipelines() == []  # journal-only pipelines are not listed


def test_run_records(store, url):
    assert store.runs.record("p", "r1") is None and store.runs.records("p") == []
    store.runs.put_record("p", "r1", {"mode": "incremental", "bounds": {"upto": 7}})
    store.runs.put_record("p", "r2", {"mode": "replay"})
    store.runs.put_record("q", "r1", {"mode": "dry_run"})
    assert store.runs.record("p", "r1") == {"mode": "incremental", "bounds": {"upto": 7}}
    assert store.runs.record("q", "r1") == {"mode": "dry_run"}  # per pipeline
    assert store.runs.records("p") == [("r2", {"mode": "replay"}), ("r1", {"mode": "incremental",
                                                                          "bounds": {"upto": 7}})]
    # a retried run id replaces its record, which becomes the newest
    store.runs.put_record("p", "r1", {"mode": "incremental", "attempt": 2})
    assert store.runs.records("p") == [("r1", {"mode": "incremental", "attempt": 2}),
                                       ("r2", {"mode": "replay"})]
    assert store.runs.records("p", limit=1) == [("r1", {"mode": "incremental", "attempt": 2})]
    raw = sqlite3.connect(url[len("sqlite:///"):]).execute(
        "SELECT record FROM tidegate_run_records WHERE pipeline = 'p' AND run_id = 'r1'").fetchone()[0]
    assert raw == '{"attempt": 2, "mode": "incremental"}'  # keys sorted: the same record, the same text
    with pytest.raises(TypeError):
        store.runs.put_record("p", "r3", {"at": object()})
    assert store.runs.record("p", "r3") is None


def test_store_survives_reopen(url):
    s = open_store(url)
    e = s.leases.acquire("p", "r")
    s.checkpoints.write("p", "s", pos(7), run_id="r", epoch=e)
    s.close()
    s = SqliteStore(url[len("sqlite:///"):])
    assert s.checkpoints.get("p", "s").position == pos(7)
    s.close()


def test_positions_stored_as_canonical_json(store, url):
    e = store.leases.acquire("p", "r")
    store.checkpoints.write("p", "s", pos(7), run_id="r", epoch=e)
    raw = sqlite3.connect(url[len("sqlite:///"):]).execute(
        "SELECT position FROM tidegate_checkpoints").fetchone()[0]
    assert raw == ('{"file":"mysql-bin.000001","gtid_set":null,"kind":"mysql","pos":7000,"server_id":null,'
                   '"server_uuid":null}')


def test_redact_postgres_urls():
    assert redact("postgresql://u:secret@h:5432/db?sslmode=require") == "postgresql://u@h:5432/db"
    assert "secret" not in redact("host=h port=1 dbname=d user=u password=secret")
