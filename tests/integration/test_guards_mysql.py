"""Continuity guards against real MariaDB faults: a purged binlog halts with the exact range
until an operator accepts the gap; a GTID failover to the replica continues without loss."""

from __future__ import annotations

import dataclasses
import textwrap
import time
import uuid

import pymysql
import pytest
from tidegate import guards
from tidegate.errors import ForeignPositionError, PositionPurgedError, SourceSettingError
from tidegate.events import ChangeEvent
from tidegate.parts import Parts
from tidegate.positions import SnapshotPosition, same_lineage
from tidegate.run import RunContext
from tidegate.snapshot.kept import forget_held
from tidegate.sources.mysql.preflight import check_server
from tidegate.sources.mysql.transactions import file_seq
from tidegate.spec import load_spec
from tidegate.store import open_store
from tidegate.store.records import SnapshotRecord

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


@pytest.fixture()
def setup(mysql, tmp_path):
    db = "guard_" + uuid.uuid4().hex[:8]
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    with admin.cursor() as c:
        c.execute(f"CREATE DATABASE {db}")
        c.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(20))")
    path = tmp_path / "g.yaml"
    path.write_text(textwrap.dedent(f"""
        pipeline: g_{db}
        source: {{kind: mysql, conn_id: src, server_id: 47001, tables: [{db}.t]}}
        sinks:
          - {{id: a, kind: redis, conn_id: r, stream: "s"}}
          - {{id: b, kind: redis, conn_id: r, stream: "s", required: false}}
    """))
    spec = load_spec(str(path))
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    yield spec, store, admin, db
    with admin.cursor() as c:
        c.execute(f"DROP DATABASE IF EXISTS {db}")
    admin.close()
    store.close()


def insert(admin, db, ids):
    with admin.cursor() as c:
        for i in ids:
            c.execute(f"INSERT INTO {db}.t VALUES (%s, %s)", (i, f"v{i}"))


def purge_to(admin, file, timeout=20.0):
    deadline = time.monotonic() + timeout
    with admin.cursor() as c:
        while True:
            c.execute(f"PURGE BINARY LOGS TO '{file}'")
            c.execute("SHOW BINARY LOGS")
            if c.fetchall()[0][0] == file:
                return
            assert time.monotonic() < deadline, "binlogs not purged"
            c.execute("FLUSH ENGINE LOGS")
            time.sleep(0.2)


def test_purged_binlog_halts_with_exact_range_until_gap_accepted(setup, mysql):
    spec, store, admin, db = setup
    lookup = {"src": mysql.cdc}.__getitem__
    source = Parts(lookup).source(spec)
    checkpoint = source.head()
    epoch = store.leases.acquire(spec.pipeline, "r0")
    store.checkpoints.write_many(spec.pipeline, {"a": checkpoint, "b": checkpoint}, run_id="r0", epoch=epoch)
    assert guards.guard_retention(RunContext(spec, run_id="r1", parts=Parts(lookup),
                                             store=store))["status"] == "ok"

    insert(admin, db, [1, 2])
    with admin.cursor() as c:
        c.execute("FLUSH BINARY LOGS")
    new_head = source.head()
    purge_to(admin, new_head.file)

    with pytest.raises(guards.ContinuityHalt) as halt:
        guards.guard_retention(RunContext(spec, run_id="r2", parts=Parts(lookup), store=store))
    inc = halt.value.incident
    assert (inc.kind, inc.from_position, inc.to_position) == ("binlog_purged", checkpoint,
                                                             source.earliest())
    assert inc.to_position.file == new_head.file and inc.to_position.pos == 4
    assert f"changes from {checkpoint}" in str(halt.value)
    # Every later run halts at the first guard, with the same incident.
    with pytest.raises(guards.ContinuityHalt) as again:
        guards.check_halted(RunContext(spec, store=store))
    assert again.value.incident.id == inc.id

    with pytest.raises(Exception, match="needs a reason"):
        guards.resolve_incidents(RunContext(spec, run_id="r3", parts=Parts(lookup), store=store),
                                            resolution="accept_gap", reason=" ", who="op")
    done = guards.resolve_incidents(RunContext(spec, run_id="r3", parts=Parts(lookup), store=store),
                                               resolution="accept_gap", reason="rows re-loaded by hand",
                                               who="alice")
    assert [(d["id"], d["resolution"], d["reason"], d["resolved_by"]) for d in done] == [
        (inc.id, "accept_gap", "rows re-loaded by hand", "alice")]
    guards.check_halted(RunContext(spec, store=store))  # no longer halted
    assert {sid: r.position for sid, r in store.checkpoints.current(spec.pipeline).items()} == {
        "a": inc.to_position, "b": inc.to_position}
    assert guards.guard_retention(RunContext(spec, run_id="r4", parts=Parts(lookup),
                                             store=store))["status"] == "ok"
    source.close()


def both_servers(spec, store, mysql, mysql_replica, redis_service):
    """Connection lookups of the primary and of its GTID replica (the sinks on one Redis), the
    pipeline's identity recorded on the primary by the failover guard."""
    primary = {"src": mysql.cdc, "r": redis_service.cdc}.__getitem__
    replica = {"src": mysql_replica.cdc, "r": redis_service.cdc}.__getitem__
    assert guards.guard_failover(RunContext(spec, run_id="r0", parts=Parts(primary),
                                            store=store))["status"] == "recorded"
    return primary, replica


def caught_up_source(spec, replica, target):
    """The pipeline's source on the replica, once the replica has applied the GTID set ``target``."""
    new = Parts(replica).source(spec)
    deadline = time.monotonic() + 20
    while not new.head().gtid_set.contains(target):
        assert time.monotonic() < deadline, "replica did not catch up"
        time.sleep(0.1)
    return new


def rows(source, start, upto):
    return [(e.op, e.after["id"]) for e in source.read(start, upto) if isinstance(e, ChangeEvent)]


def test_gtid_failover_to_replica_continues_without_loss_or_duplicate(setup, mysql, mysql_replica,
                                                                      redis_service):
    spec, store, admin, db = setup
    primary, replica = both_servers(spec, store, mysql, mysql_replica, redis_service)
    insert(admin, db, [1, 2])
    src = Parts(primary).source(spec)
    checkpoint = src.head()
    epoch = store.leases.acquire(spec.pipeline, "r1")
    store.checkpoints.write_many(spec.pipeline, {"a": checkpoint, "b": checkpoint}, run_id="r1", epoch=epoch)
    assert guards.guard_failover(RunContext(spec, run_id="r1", parts=Parts(primary),
                                            store=store))["status"] == "ok"
    insert(admin, db, [3, 4, 5])  # after the checkpoint: must arrive, once, after the failover
    target = src.head().gtid_set
    src.close()

    new = caught_up_source(spec, replica, target)

    result = guards.guard_failover(RunContext(spec, run_id="r2", parts=Parts(replica), store=store))
    assert result["status"] == "failover_continued"
    moved = store.checkpoints.get(spec.pipeline, "a").position
    assert moved.server_id == 2 and moved == store.checkpoints.get(spec.pipeline, "b").position
    assert rows(new, moved, new.head()) == [("c", 3), ("c", 4), ("c", 5)]
    incidents = store.incidents.all(spec.pipeline)
    assert [(i.kind, i.resolved, i.resolution) for i in incidents] == [("failover", True, "auto")]
    assert (incidents[0].from_position, incidents[0].to_position) == (checkpoint, moved)
    assert [h.kind for h in store.checkpoints.history(spec.pipeline, "a")] == ["write", "failover"]
    [entry] = [e for e in store.runs.entries(spec.pipeline) if e.mode == "failover"]
    assert {sid: (js.start, js.end) for sid, js in entry.sinks.items()} == {
        "a": (checkpoint, moved), "b": (checkpoint, moved)}
    guards.check_halted(RunContext(spec, store=store))
    assert guards.guard_failover(RunContext(spec, run_id="r3", parts=Parts(replica),
                                            store=store))["status"] == "ok"
    new.close()


def test_preflight_refuses_mariadb_without_gtid_strict_mode(setup, mysql):
    """A failover places checkpoints by GTID containment, sound only with gtid_strict_mode=ON:
    the preflight refuses a MariaDB server without it, naming the setting and the fix. The
    setting is turned off on the shared server for the one check and restored at once."""
    spec, store, admin, _ = setup
    lookup = {"src": mysql.cdc}.__getitem__
    passed = guards.preflight(RunContext(spec, parts=Parts(lookup),
                                         store=store))  # strict mode is on: no error
    assert not any("gtid_strict_mode" in w for w in passed.warnings)
    with admin.cursor() as c:
        c.execute("SELECT @@GLOBAL.gtid_strict_mode")
        (was,) = c.fetchone()
        try:
            c.execute("SET GLOBAL gtid_strict_mode = OFF")
            with pytest.raises(SourceSettingError) as refused:
                guards.preflight(RunContext(spec, parts=Parts(lookup), store=store))
        finally:
            c.execute("SET GLOBAL gtid_strict_mode = %s", (was,))
    message = str(refused.value)
    assert "gtid_strict_mode is 'OFF', CDC needs ON" in message
    assert "SET GLOBAL gtid_strict_mode=ON" in message and "my.cnf" in message
    guards.preflight(RunContext(spec, parts=Parts(lookup), store=store))  # on again: passes


def running_snapshot(setup, mysql, mysql_replica, redis_service):
    """Rows 1 and 2 written, then resnapshot ``s1`` (two chunks) begun at the primary's head,
    both sinks at its chunk 0: the replica's lookup, the primary's source, the handoff and the
    lease epoch of run r1."""
    spec, store, admin, db = setup
    primary, replica = both_servers(spec, store, mysql, mysql_replica, redis_service)
    insert(admin, db, [1, 2])
    src = Parts(primary).source(spec)
    handoff = src.head()
    snap = SnapshotRecord(spec.pipeline, "s1", "resnapshot", handoff, [], [{}, {}], 0)
    at = SnapshotPosition("s1", 0, handoff)
    epoch = store.leases.acquire(spec.pipeline, "r1")
    store.snapshots.begin(snap, {"a": at, "b": at}, epoch=epoch)
    return replica, src, handoff, epoch


def test_gtid_failover_during_a_snapshot_places_its_handoff_and_kept_reads_on_the_new_server(
        setup, mysql, mysql_replica, redis_service):
    """Found by the fault campaign (seed 5903: a resnapshot's run killed, then the connection on
    the replica): the checkpoints were translated, the snapshot's own handoff and its kept chunk
    reads' upper bounds were not, and every run after it failed comparing positions of two
    servers. The guard places them on the new server by GTID set: the log read from there, and
    up to each kept read's upper bound, holds the same transactions as on the old server."""
    spec, store, admin, db = setup
    replica, src, handoff, _ = running_snapshot(setup, mysql, mysql_replica, redis_service)
    insert(admin, db, [3])
    upper = src.head()  # chunk 1 read after row 3 was written: the keys changed up to here
    store.snapshots.keep_read(spec.pipeline, "s1", 1, upper, b"chunk 1")
    insert(admin, db, [4, 5])
    target = src.head().gtid_set
    assert rows(src, handoff, upper) == [("c", 3)]
    src.close()

    new = caught_up_source(spec, replica, target)
    result = guards.guard_failover(RunContext(spec, run_id="r2", parts=Parts(replica), store=store))
    assert result["status"] == "failover_continued"

    moved = store.snapshots.get(spec.pipeline, "s1")
    assert moved.handoff.server_id == 2 and moved.status == "running"
    kept = store.snapshots.kept_uppers(spec.pipeline, "s1")
    assert list(kept) == [1] and kept[1].server_id == 2
    assert store.snapshots.kept_read(spec.pipeline, "s1", 1)[1] == b"chunk 1"
    assert rows(new, moved.handoff, kept[1]) == [("c", 3)]
    assert rows(new, moved.handoff, new.head()) == [("c", 3), ("c", 4), ("c", 5)]
    for sid in ("a", "b"):  # the sinks' snapshot positions name the same handoff
        assert store.checkpoints.get(spec.pipeline, sid).position == SnapshotPosition("s1", 0, moved.handoff)
    # A second guard on the same server finds nothing to move.
    assert guards.guard_failover(RunContext(spec, run_id="r3", parts=Parts(replica),
                                            store=store))["status"] == "ok"
    new.close()


def test_after_a_gtid_failover_past_a_snapshot_the_next_run_lets_its_kept_reads_go(
        setup, mysql, mysql_replica, redis_service):
    """Found by the fault campaign (seed 5922: a resnapshot's run failed after every sink had
    passed the handoff, then the connection moved to the replica). The snapshot's kept chunk
    reads stay until the next run starts; that run compared the snapshot, on the old server,
    with the translated checkpoints, and every run after the failover failed. No sink is in the
    snapshot and every checkpoint is on the new server, so every sink holds those chunks: the
    next run lets their reads go."""
    spec, store, admin, db = setup
    replica, src, handoff, epoch = running_snapshot(setup, mysql, mysql_replica, redis_service)
    for chunk in (1, 2):
        insert(admin, db, [2 + chunk])
        store.snapshots.keep_read(spec.pipeline, "s1", chunk, src.head(), b"chunk %d" % chunk)
    past = src.head()  # both sinks delivered both chunks and the log after the handoff
    store.checkpoints.write_many(spec.pipeline, {"a": past, "b": past}, run_id="r1", epoch=epoch)
    insert(admin, db, [5])  # after the checkpoints: read from the replica after the failover
    target = src.head().gtid_set
    src.close()

    new = caught_up_source(spec, replica, target)
    result = guards.guard_failover(RunContext(spec, run_id="r2", parts=Parts(replica), store=store))
    assert result["status"] == "failover_continued"

    moved = {sid: store.checkpoints.get(spec.pipeline, sid).position for sid in ("a", "b")}
    assert {p.server_id for p in moved.values()} == {2}
    assert rows(new, moved["a"], new.head()) == [("c", 5)]  # nothing lost, nothing twice
    # What the next run does first (it failed here, comparing positions of two servers).
    forget_held(RunContext(spec, run_id="r3", parts=Parts(replica), store=store))
    assert store.snapshots.kept_chunks(spec.pipeline) == {}
    new.close()


def test_after_a_lossy_failover_past_a_snapshot_and_accept_gap_the_next_run_lets_its_kept_reads_go(
        setup, mysql, mysql_replica, redis_service):
    """The other way a pipeline changes server past a snapshot (seed 5922's defect, reached by
    accept_gap instead of a GTID failover): the replica stops applying (STOP SLAVE), a change
    commits on the primary only, both sinks pass it, and the connection moves to the replica.
    The guard halts (the checkpoints' GTIDs are not on the replica); accept_gap moves every sink
    to the replica's head and leaves the snapshot and its kept reads on the primary. The next
    run lets those reads go instead of failing to compare positions of two servers."""
    spec, store, admin, db = setup
    replica, src, handoff, epoch = running_snapshot(setup, mysql, mysql_replica, redis_service)
    for chunk in (1, 2):
        insert(admin, db, [2 + chunk])
        store.snapshots.keep_read(spec.pipeline, "s1", chunk, src.head(), b"chunk %d" % chunk)
    new = caught_up_source(spec, replica, src.head().gtid_set)
    stalled = pymysql.connect(**mysql_replica.mysql_kwargs(autocommit=True))
    try:
        with stalled.cursor() as c:
            c.execute("STOP SLAVE")
        insert(admin, db, [5])  # on the primary only: the replica never applies it
        past = src.head()
        store.checkpoints.write_many(spec.pipeline, {"a": past, "b": past}, run_id="r1", epoch=epoch)
        with pytest.raises(guards.ContinuityHalt) as halt:
            guards.guard_failover(RunContext(spec, run_id="r2", parts=Parts(replica), store=store))
        assert halt.value.incident.kind == "failover"
        assert "cannot be placed on the new server without loss" in str(halt.value)
        head = new.head()
        guards.resolve_incidents(RunContext(spec, run_id="r3", parts=Parts(replica), store=store),
                                 resolution="accept_gap", reason="row 5 entered again by hand", who="op")
        moved = {sid: store.checkpoints.get(spec.pipeline, sid).position for sid in ("a", "b")}
        assert moved == {"a": head, "b": head} and head.server_id == 2
        assert store.snapshots.get(spec.pipeline, "s1").handoff == handoff  # still on the primary
        # What the next run does first (without the fix: positions of two servers compared).
        forget_held(RunContext(spec, run_id="r4", parts=Parts(replica), store=store))
        assert store.snapshots.kept_chunks(spec.pipeline) == {}
        guards.check_halted(RunContext(spec, store=store))
    finally:
        with stalled.cursor() as c:
            c.execute("START SLAVE")
        stalled.close()
        src.close()
        new.close()


def flush_until_past(server, other, flushed_admin):
    """FLUSH BINARY LOGS on ``server`` until its newest binlog file's number is past ``other``'s."""
    with flushed_admin.cursor() as c:
        while server.head().file_seq <= other.head().file_seq:
            c.execute("FLUSH BINARY LOGS")


@pytest.mark.parametrize("newer", ["primary", "replica"])
def test_a_read_of_the_primarys_positions_on_the_replica_refuses_before_any_row(
        setup, mysql, mysql_replica, redis_service, newer):
    """A deliver task retried after the connection moved to the replica (Airflow retries the
    task; the DAG run's guards ran before the move) reads the bounds its record took on the
    primary. The replica's binlog files bear the same names with other contents at other
    offsets: the read refuses before it yields a row, whether the primary's file is newer than
    the replica's newest or the replica's files have passed its number, with one refusal that
    names the other server (the positions' lineage is compared before any file name). The next
    DAG run's guard translates the checkpoints."""
    spec, store, admin, db = setup
    primary, replica = both_servers(spec, store, mysql, mysql_replica, redis_service)
    src, new = Parts(primary).source(spec), Parts(replica).source(spec)
    replica_admin = pymysql.connect(**mysql_replica.mysql_kwargs(autocommit=True))
    try:
        if newer == "primary":
            flush_until_past(src, new, admin)
        else:
            flush_until_past(new, src, replica_admin)
        insert(admin, db, list(range(1, 200)))  # the replica's files grow past the primary's offsets
        start = src.head()
        insert(admin, db, [200, 201])
        upto = src.head()
        new.close()
        new = caught_up_source(spec, replica, upto.gtid_set)
        read = []
        with pytest.raises(ForeignPositionError, match="the position belongs to another server") as err:
            read.extend(new.read(start, upto))
        assert "(server_id 1) is not on cdc_mysql_replica" in str(err.value) and read == []
        assert err.value.fatal  # a retry of the task reads the same bounds: Airflow must not retry
    finally:
        replica_admin.close()
        src.close()
        new.close()


def test_a_primary_position_in_a_file_the_replica_no_longer_has_is_another_servers_not_purged(
        setup, mysql, mysql_replica, redis_service):
    """A checkpoint of the primary checked on the replica (preflight after the connection moved)
    whose file number is below the replica's earliest file: its own file of that name was purged
    there, which says nothing of the primary's. The check names the other server (the fix is
    the failover guard) instead of a purge (whose fix would be a resnapshot)."""
    spec, store, _, _ = setup
    primary, replica = both_servers(spec, store, mysql, mysql_replica, redis_service)
    src, new = Parts(primary).source(spec), Parts(replica).source(spec)
    try:
        start, earliest = src.head(), new.server.binlog_files()[0][0]
        older = dataclasses.replace(start, file=f"{start.basename}.{file_seq(earliest) - 1:06d}")
        assert same_lineage(start, older) and not same_lineage(older, new.head())
        with pytest.raises(ForeignPositionError, match="belongs to another server") as err:
            new.server.check_available(older)
        assert not isinstance(err.value, PositionPurgedError)
        problems = check_server(new.server, checkpoint=older)
        assert [p.message for p in problems if p.code == "retention"] == [str(err.value)]
    finally:
        src.close()
        new.close()
