"""Replays and rewinds on PostgreSQL against the real server (wal2json), through `tidegate run`.

Every release advances the pipeline's slot, so without a replay window the WAL of an earlier run
is gone once a later run released: a replay, a backfill or a rewind of it is refused up front,
naming the range, where the slot stands and ``source.replay_retention``; nothing is delivered,
no incident is opened and the pipeline runs on. With ``source.replay_retention`` release keeps
the slot where the checkpoints were that long ago: a replay of the earlier run re-delivers
exactly its events (read back from Redis and from Kafka with read_committed), a rewind within
the window re-delivers what followed, and `tidegate status` shows the WAL the slot holds.
"""

from __future__ import annotations

import json
import textwrap
import uuid

import psycopg2
import pytest
from tidegate import bounds_step, cli
from tidegate.catalog import find
from tidegate.parts import Parts
from tidegate.plan import EXIT_FATAL, RunPlan
from tidegate.run import RunContext
from tidegate.sources.postgres.position import Lsn
from tidegate.store import open_store

from tests.integration.sink_readers import kafka_changes, redis_events

pytestmark = pytest.mark.integration


@pytest.fixture()
def pipeline(tmp_path, monkeypatch, service_env, postgres, kafka, redis_service):
    """(name, folder, admin connection): a table of its own, specs under ``folder``."""
    folder = tmp_path / "pipelines"
    folder.mkdir()
    monkeypatch.setenv("TIDEGATE_PIPELINES_DIR", str(folder))
    monkeypatch.setenv("TIDEGATE_CHECKPOINT_STORE", f"sqlite:///{tmp_path / 'ckpt.sqlite'}")
    name = f"rw_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(postgres.admin_dsn)
    admin.autocommit = True
    sql(admin, f"CREATE TABLE {name} (id int PRIMARY KEY, v text)",
        f"ALTER TABLE {name} REPLICA IDENTITY FULL")
    yield name, folder, admin
    sql(admin, f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = "
               f"'{name}'", f"DROP TABLE IF EXISTS {name}")
    admin.close()


def sql(admin, *stmts: str) -> None:
    with admin.cursor() as c:
        for st in stmts:
            c.execute(st)


def write_spec(folder, name: str, retention: str | None) -> None:
    window = f", replay_retention: {retention}" if retention is not None else ""
    (folder / f"{name}.yaml").write_text(textwrap.dedent(f"""
        pipeline: {name}
        source: {{kind: postgres, conn_id: cdc_postgres, slot: {name}, tables: [public.{name}]{window}}}
        sinks:
          - {{id: events, kind: kafka, conn_id: cdc_kafka, topic: "{{pipeline}}.{{table}}",
              exactly_once: true}}
          - {{id: cache, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:{{table}}"}}
    """))


def tidegate(capsys, *args: str) -> tuple[int, dict | None, str]:
    """A `tidegate` command in this process: (exit code, its JSON output, stderr)."""
    rc = cli.main(list(args))
    out = capsys.readouterr()
    return rc, json.loads(out.out) if out.out.strip().startswith("{") else None, out.err


def two_runs(capsys, admin, name: str) -> None:
    """r0 creates the slot, r1 delivers rows 1 and 2, r2 rows 3 and 4; each releases."""
    assert tidegate(capsys, "run", name, "--run-id", "r0")[0] == 0
    for run_id, ids in (("r1", (1, 2)), ("r2", (3, 4))):
        sql(admin, *(f"INSERT INTO {name} VALUES ({i}, 'v{i}')" for i in ids))
        rc, report, err = tidegate(capsys, "run", name, "--run-id", run_id)
        assert rc == 0 and report["events"] == 2, err


def slot_start(admin, name: str) -> Lsn:
    with admin.cursor() as c:
        c.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (name,))
        return Lsn.parse(c.fetchone()[0])


def run_start(name: str, run_id: str, sink: str):
    with open_store() as store:
        return store.runs.entries(name, run_id)[0].sinks[sink].start


def cached(redis_service, name: str) -> list[bytes]:
    return redis_events(redis_service.cdc, f"{name}:{name}")


def test_with_a_replay_window_an_earlier_run_is_replayed_exactly(pipeline, capsys, kafka_bootstrap,
                                                                redis_service):
    name, folder, admin = pipeline
    write_spec(folder, name, "1h")
    two_runs(capsys, admin, name)
    r1_start = run_start(name, "r1", "cache")
    assert slot_start(admin, name) <= r1_start.lsn  # r2's release kept r1's WAL

    rc, report, err = tidegate(capsys, "run", name, "--mode", "replay", "--replay-of", "r1", "--run-id", "r3")
    assert rc == 0, err
    events = cached(redis_service, name)
    assert [json.loads(e)["after"]["id"] for e in events] == [1, 2, 3, 4, 1, 2]
    assert events[4:] == events[:2]  # the same envelopes, byte for byte
    topic = kafka_changes(kafka_bootstrap, f"{name}.{name}")
    assert [m["after"]["id"] for m in topic] == [1, 2, 3, 4, 1, 2] and topic[4:] == topic[:2]

    # The cost shows: `tidegate status` and the preflight report the WAL the slot holds.
    rc, doc, err = tidegate(capsys, "status", name, "--json")
    held = doc["pipelines"][0]["log_held"]
    assert rc == 0 and held["slot"] == name and held["bytes"] > 0 and held["replay_retention_s"] == 3600, err
    source = Parts().source(find(name))
    try:
        (note,) = [p for p in source.preflight() if p.code == "wal_held"]
    finally:
        source.close()
    assert note.severity == "info" and "holds" in note.message and "replay_retention" in note.message

    # A rewind within the window: the next run re-delivers what followed the version.
    with open_store() as store:
        after_r1 = [h for h in store.checkpoints.history(name, "cache") if h.run_id == "r1"][-1]
    rc, _, err = tidegate(capsys, "checkpoints", "rewind", name, "cache",
                          "--to-version", str(after_r1.version), "--reason", "cache rebuilt")
    assert rc == 0, err
    assert tidegate(capsys, "run", name, "--run-id", "r4")[0] == 0
    assert [json.loads(e)["after"]["id"] for e in cached(redis_service, name)] == [1, 2, 3, 4, 1, 2, 3, 4]


def test_without_a_replay_window_a_replay_is_refused_up_front(pipeline, capsys, redis_service):
    name, folder, admin = pipeline
    write_spec(folder, name, None)  # default: 0
    two_runs(capsys, admin, name)
    r1_start = run_start(name, "r1", "cache")
    assert slot_start(admin, name) > r1_start.lsn  # released past r1

    rc, _, err = tidegate(capsys, "run", name, "--mode", "replay", "--replay-of", "r1", "--run-id", "r3")
    assert rc == EXIT_FATAL  # a retry cannot fix it
    assert "the replay of run 'r1' to sink" in err and f"({r1_start}," in err, err
    assert f"replication slot '{name}' now starts at {slot_start(admin, name)}" in err, err
    assert "source.replay_retention" in err and str(folder / f"{name}.yaml") in err, err
    # A backfill asks at its bounds step, before Spark: the same refusal.
    with pytest.raises(bounds_step.LogNotHeldError, match="source.replay_retention"):
        bounds_step.prepare_bounds(RunContext(find(name), RunPlan(mode="replay", replay_of="r1")),
                              missing_ok=True)
    # So does a rewind past the slot, before any version is written.
    with open_store() as store:
        history = store.checkpoints.history(name, "cache")
    versions, placed = len(history), history[0]  # placed at the head by r0, before r1's rows
    rc, _, err = tidegate(capsys, "checkpoints", "rewind", name, "cache",
                          "--to-version", str(placed.version), "--reason", "cache rebuilt")
    assert rc == EXIT_FATAL and "a rewind of sink cache" in err and "source.replay_retention" in err, err

    with open_store() as store:  # nothing lost, nothing recorded as lost, nothing moved
        assert store.incidents.all(name) == [] and not store.incidents.is_halted(name)
        assert len(store.checkpoints.history(name, "cache")) == versions
    assert [json.loads(e)["after"]["id"] for e in cached(redis_service, name)] == [1, 2, 3, 4]
    sql(admin, f"INSERT INTO {name} VALUES (5, 'v5')")
    rc, report, err = tidegate(capsys, "run", name, "--run-id", "r5")
    assert rc == 0 and report["events"] == 1, err
