"""The Delta sink's commit ledger (tidegate.sinks.delta.ledger): txnVersions ordered by lease epoch
first, what a table's history says it covers, and which transactions a table still needs."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta

import pytest
from tidegate.positions import IncomparablePositionsError, SnapshotPosition
from tidegate.sinks.delta import ledger
from tidegate.sources.mysql.position import BinlogPosition, GtidSet

APP = "acme/orders::sink::lake"


def pos(n: int, server_id: int = 1) -> BinlogPosition:
    return BinlogPosition("mysql-bin.000003", n, server_id=server_id)


def meta(**kw) -> str:
    args = dict(app=APP, pipeline="orders", sink="lake", epoch=3, extends=7, covers=pos(100))
    return ledger.commit_metadata(**{**args, **kw})


def test_txn_versions_order_by_epoch_then_store_version():
    assert ledger.txn_version(2, 5) < ledger.txn_version(2, 6)  # a run's next sub-batch
    assert ledger.txn_version(2, 10**6) < ledger.txn_version(3, -1)  # any newer epoch, even its claim
    assert ledger.txn_version(3, -1) < ledger.txn_version(3, 0)  # the claim below the epoch's commits
    assert ledger.txn_version(None, 4) == 5  # no lease (the sink used alone): the store version + 1
    assert ledger.txn_version(2, 5) > 10**6  # above every txnVersion of the sink's first form (extends)
    assert ledger.txn_epoch(ledger.txn_version(9, 123)) == 9 and ledger.txn_epoch(41) == 0
    with pytest.raises(ValueError, match="does not fit"):
        ledger.txn_version(1, 1 << 32)


def test_metadata_names_the_app_the_txn_and_what_the_commit_covers():
    d = json.loads(meta(controls=[{"type": "gap"}]))
    assert d["tidegate"]["app"] == APP and d["tidegate"]["txn"] == ledger.txn_version(3, 7)
    assert d["control"] == [{"type": "gap"}]
    assert ledger.parse_metadata(meta(), APP)["covers"] == pos(100).to_json()
    for other in (None, "", "not json", json.dumps({"tidegate": {"app": "x/y::sink::z"}}),
                  json.dumps({"tidegate": {"pipeline": "orders", "sink": "lake", "position": "..."}})):
        assert ledger.parse_metadata(other, APP) is None  # another writer, DDL, the sink's first form


def test_covered_position_is_the_newest_covering_commit_of_the_app():
    history = [None,  # an ALTER TABLE without metadata
               meta(app="other/orders::sink::lake", covers=pos(900)),  # another sink's commit
               meta(covers=None, claim=True, extends=-1),  # a claim covers nothing
               meta(covers=pos(300)), meta(covers=pos(200))]
    assert ledger.covered_position(history, APP) == pos(300)
    assert ledger.covered_position([None, "x"], APP) is None
    assert ledger.newest_txn(history, APP) == ledger.txn_version(3, -1)
    assert ledger.newest_txn([None], APP) is None


def test_a_table_holds_the_later_of_its_commits_and_the_sink_record():
    assert ledger.table_covers(pos(300), pos(200)) == pos(300)  # committed past the record (a crash)
    assert ledger.table_covers(pos(100), pos(200)) == pos(200)  # untouched since the record
    assert ledger.table_covers(None, pos(200)) == pos(200) and ledger.table_covers(pos(5), None) == pos(5)
    assert ledger.table_covers(None, None) is None
    with pytest.raises(IncomparablePositionsError):
        pos(1) > pos(2, server_id=2)  # noqa: B015 - the premise: two servers' positions do not compare
    assert ledger.table_covers(pos(1), pos(2, server_id=2)) == pos(1)


def test_the_record_never_moves_back_but_into_a_snapshot_the_sink_had_not_entered():
    """Campaign seed 6013: a resnapshot starts with the sink's record at its handoff H. Its first
    chunks' record is the chunk (kept at H, adopted after a kill, it read as the snapshot
    completed and the sink never got the rest). A record at H of a sink with the snapshot's marks
    completed it; one past H, or after a rewind, stays where it is."""
    h = pos(500)
    s7 = SnapshotPosition("20261205T1825-a", 7, h)
    entered_none, entered_it = (lambda sid: False), (lambda sid: sid == "20261205T1825-a")
    assert ledger.record_after(s7, h, entered_none) == s7  # the sink at H before the snapshot
    assert ledger.record_after(s7, pos(400), entered_none) == s7  # (a handoff past the record)
    assert ledger.record_after(s7, h, entered_it) == h  # completed there, then rewound
    assert ledger.record_after(s7, pos(600), entered_none) == pos(600)  # past the handoff
    assert ledger.record_after(s7, SnapshotPosition("20261205T1825-a", 3, h), entered_none) == s7
    assert ledger.record_after(s7, SnapshotPosition("20261205T1825-a", 9, h), entered_none) == \
        SnapshotPosition("20261205T1825-a", 9, h)  # rewound to the snapshot's start
    assert ledger.record_after(pos(300), pos(450), entered_none) == pos(450)  # a log rewind
    assert ledger.record_after(s7, None, entered_none) == s7


def test_needs_the_transactions_after_what_the_table_holds():
    assert ledger.needs(pos(400), False, pos(300))
    assert not ledger.needs(pos(300), False, pos(300)) and not ledger.needs(pos(200), False, pos(300))
    assert ledger.needs(pos(300), True, pos(300))  # a split transaction's part: the whole is needed
    assert ledger.needs(pos(1), False, None)
    assert ledger.needs(pos(1), False, pos(9, server_id=2))  # another server's log: all of it


def snap(sid: str, chunk: int, handoff: int = 300) -> SnapshotPosition:
    return SnapshotPosition(sid, chunk, pos(handoff))


OLD, NEW = "20261201T000000000-aaaa", "20261203T000000000-bbbb"


def test_a_commit_holding_chunks_is_marked_with_its_snapshot_and_highest_chunk():
    history = [meta(covers=pos(500)), meta(covers=snap(NEW, 3), snapshot=snap(NEW, 3)),
               meta(covers=snap(OLD, 9), snapshot=snap(OLD, 9))]
    assert ledger.held_snapshot(history, APP) == (NEW, 3)  # the newest mark, past log-only commits
    assert ledger.held_snapshot([meta()], APP) is None
    assert ledger.held_snapshot([meta(app="x/y::sink::z", snapshot=snap(NEW, 1))], APP) is None


def test_a_new_snapshot_is_needed_whole_even_where_it_hands_off_at_what_the_table_covers():
    """A resnapshot of a healthy pipeline hands off at the checkpoint: its chunks lie just before
    what the table covers, yet the table never held them (found by campaign seed 5781)."""
    covers = pos(300)
    assert snap(NEW, 1) < covers  # why the log's rule (ledger.needs) skipped them
    assert ledger.needs_chunk(snap(NEW, 0), False, (OLD, 9), covers)  # snapshot_started: the reset
    assert ledger.needs_chunk(snap(NEW, 1), False, (OLD, 9), covers)
    assert ledger.needs_chunk(snap(NEW, 1), False, None, covers)  # a table without marks
    assert ledger.needs_chunk(snap(NEW, 1), False, None, None)  # a table added to the pipeline


def test_a_snapshot_the_table_holds_is_not_written_again():
    """A rerun after a crash between two tables' commits, and a replay of a snapshot's run."""
    assert not ledger.needs_chunk(snap(NEW, 2), False, (NEW, 3), pos(900))
    assert not ledger.needs_chunk(snap(NEW, 3), False, (NEW, 3), pos(900))
    assert ledger.needs_chunk(snap(NEW, 4), False, (NEW, 3), pos(900))
    assert ledger.needs_chunk(snap(NEW, 3), True, (NEW, 3), pos(900))  # a leading part: the whole chunk
    assert not ledger.needs_chunk(snap(OLD, 9), False, (NEW, 3), pos(900))  # an older snapshot
    # without marks (tables written before them): a snapshot handing off before what the table
    # covers was delivered to it; within one snapshot, by chunk
    assert not ledger.needs_chunk(snap(OLD, 1, handoff=200), False, None, pos(300))
    assert not ledger.needs_chunk(snap(NEW, 2), False, None, snap(NEW, 2))
    assert ledger.needs_chunk(snap(NEW, 3), False, None, snap(NEW, 2))
    assert ledger.needs_chunk(snap(NEW, 1), False, None, pos(9, server_id=2))  # another server's log


DOMAINS = {"mariadb": ["0", "1", "7"],
           "mysql": ["3e11fa47-71ca-11e1-9e33-c80aa9429562", "8a94f357-aab4-11df-86ab-c80aa9429563"]}


def _histories(rng: random.Random, flavor: str) -> tuple[list[BinlogPosition], list[BinlogPosition]]:
    """One generated history of transactions as two servers of a GTID topology log it: each
    transaction's end on the primary (server 1) and on the replica (server 2, its own files and
    offsets), each carrying the executed GTID set after it."""
    primary, replica, done = [], [], {}
    at1, at2 = rng.randrange(4, 10_000), rng.randrange(4, 10_000)
    for _ in range(rng.randrange(1, 40)):
        domain = rng.choice(DOMAINS[flavor])
        done[domain] = done.get(domain, 0) + 1
        if flavor == "mariadb":
            text = ",".join(f"{d}-1-{n}" for d, n in sorted(done.items()))
        else:
            text = ",".join(f"{u}:1-{n}" for u, n in sorted(done.items()))
        gtids = GtidSet.parse(text)
        at1, at2 = at1 + rng.randrange(50, 5_000), at2 + rng.randrange(50, 5_000)
        primary.append(BinlogPosition("mysql-bin.000046", at1, gtid_set=gtids, server_id=1))
        replica.append(BinlogPosition("mysql-bin.000002", at2, gtid_set=gtids, server_id=2))
    return primary, replica


@pytest.mark.parametrize("seed", range(300))
def test_after_a_gtid_failover_a_table_needs_what_it_needed_on_the_old_server(seed):
    """Generated histories: a table whose commits cover a transaction on the old server, read
    again from the new one after a failover, needs exactly the transactions it would have needed
    on the old server (by GTID set), and of its covers and the sink's record the later counts."""
    rng = random.Random(seed)
    primary, replica = _histories(rng, rng.choice(["mariadb", "mysql"]))
    covers = rng.randrange(len(primary))
    for i in range(len(primary)):
        for partial in (False, True):
            assert ledger.needs(replica[i], partial, primary[covers]) == \
                ledger.needs(primary[i], partial, primary[covers]), (i, covers, partial)
        # a snapshot handing off there, judged by covers alone (a table without snapshot marks)
        assert ledger.needs_chunk(SnapshotPosition("s", 1, replica[i]), False, None, primary[covers]) == \
            ledger.needs_chunk(SnapshotPosition("s", 1, primary[i]), False, None, primary[covers])
        later = ledger.table_covers(primary[covers], replica[i])
        assert later is (replica[i] if i > covers else primary[covers]), (i, covers)


@pytest.mark.parametrize("seed", range(300))
def test_a_tables_lineage_is_what_its_restores_left(seed):
    """Generated histories of writes (some the app's, some another writer's) and RESTOREs to an
    earlier version, against the table's content as Delta defines it: a write adds its commit to
    the previous version's, a RESTORE to V makes it version V's. The lineage keeps exactly the
    writes the last version holds, newest first, and calls every other write undone."""
    rnd = random.Random(seed)
    commits, content = [], []  # content[v]: the writes version v holds
    for v in range(rnd.randint(1, 30)):
        if v and rnd.random() < 0.25:
            target = rnd.randrange(v)
            commits.append(ledger.Commit(v, None, target))
            content.append(content[target])
        else:
            commits.append(ledger.Commit(v, f"w{v}"))
            content.append((content[-1] if content else ()) + (v,))
    rnd.shuffle(commits)  # the order DESCRIBE HISTORY gives is not relied on
    kept, undone = ledger.lineage(commits)
    assert [c.version for c in kept if c.restored is None] == sorted(content[-1], reverse=True)
    writes = {c.version for c in commits if c.restored is None}
    lost = sorted(writes - set(content[-1]), reverse=True)
    assert [c.version for c in undone if c.restored is None] == lost


def _history_rows(*commits) -> list[dict]:
    """DESCRIBE HISTORY rows, newest first, of a table's commits given oldest first: ("w", covers,
    since) a commit of the app (since "-": the sink's form before ``since``), ("o",) another
    writer's, ("R", v) a RESTORE to version v."""
    t0, rows = datetime(2026, 12, 8), []
    for v, c in enumerate(commits):
        row = {"version": v, "timestamp": t0 + timedelta(seconds=v), "operation": "WRITE",
               "operationParameters": {}, "userMetadata": None}
        if c[0] == "R":
            row.update(operation="RESTORE", operationParameters={"version": str(c[1])})
        elif c[0] == "o":
            row["userMetadata"] = meta(app="x/y::sink::z")
        else:
            since = {} if c[2] == "-" else {"since": None if c[2] is None else pos(c[2])}
            row["userMetadata"] = meta(covers=pos(c[1]), **since)
        rows.append(row)
    return rows[::-1]


def history(*commits) -> tuple[list, list]:
    """A table's lineage from its commits, oldest first (:func:`_history_rows`), its whole history read."""
    return ledger.read_lineage(lambda n: _history_rows(*commits), APP, None)


@pytest.mark.parametrize("commits, loss", [
    # nothing restored; a restore that undid nothing of the app's, or only what a kept commit covers
    ([("w", 100, None), ("w", 200, 100)], None),
    ([("w", 100, None), ("o",), ("R", 0)], None),
    ([("w", 100, None), ("w", 100, 100), ("R", 0)], None),
    # restored behind the app's last commit: told, up to where it still holds
    ([("w", 100, None), ("w", 200, 100), ("w", 300, 200), ("R", 0)], (100, 300)),
    ([("w", 100, None), ("w", 200, 100), ("R", -1)], (None, 200)),  # back before the first
    ([("w", 100, None), ("w", 200, 100), ("R", 0), ("R", 1)], None),  # undone by a restore in turn
    # a rewind wrote it again from what it held: done once it reaches what was undone
    ([("w", 100, None), ("w", 300, 100), ("R", 0), ("w", 200, 100)], (200, 300)),
    ([("w", 100, None), ("w", 300, 100), ("R", 0), ("w", 200, 100), ("w", 400, 200)], None),
    # an operator went on without it: its commits say since the held position
    ([("w", 100, None), ("w", 300, 100), ("R", 0), ("w", 400, 100)], None),
    # restored between two sub-batches of a run: the next commit, written from further on, mends nothing
    ([("w", 100, None), ("w", 200, 100), ("R", 0), ("w", 300, 200)], (100, 200)),
    ([("w", 100, None), ("w", 200, 100), ("R", 0), ("w", 300, 200), ("w", 400, 300)], (100, 200)),
    # the sink's older form said nothing of since: what its newest commit covers decides
    ([("w", 100, "-"), ("w", 200, "-"), ("R", 0), ("w", 300, "-")], None),
    # two restores: from the earliest held to the latest undone
    ([("w", 100, None), ("w", 200, 100), ("R", 0), ("w", 300, 200), ("w", 400, 300), ("R", 3)], (100, 400)),
])
def test_a_restore_loses_what_it_undid_until_a_commit_written_from_what_it_kept_reaches_it(commits, loss):
    kept, undone = history(*commits)
    got = ledger.restore_loss(kept, undone, APP)
    assert (got and (got.held, got.lost)) == (loss and (loss[0] and pos(loss[0]), pos(loss[1])))


def test_a_restore_names_the_version_it_took_the_table_back_to():
    t0 = datetime(2026, 12, 7, 22, 1, 0)
    rows = [{"version": v, "timestamp": t0 + timedelta(seconds=10 * v), "operation": "WRITE",
             "operationParameters": {}} for v in range(5)]

    def restore(**params) -> dict:
        return {"version": 5, "timestamp": t0 + timedelta(seconds=60), "operation": "RESTORE",
                "operationParameters": {"version": None, "timestamp": None, **params}}

    assert ledger.restored_version(rows[3], rows) is None  # not a restore
    assert ledger.restored_version(restore(version="2"), rows) == 2
    assert ledger.restored_version(restore(timestamp="2026-12-07 22:01:25.000"), rows) == 2  # newest by then
    assert ledger.restored_version(restore(timestamp="2026-12-07 22:01:30"), rows) == 3
    # told rather than missed: a time before the table, or none that can be read
    for ts in ("2026-12-07 21:00:00", "yesterday", "2026-12-07 22:01:30+01:00"):
        assert ledger.restored_version(restore(timestamp=ts), rows) == -1


def test_a_table_written_again_from_what_it_held_skips_what_commits_after_the_restore_hold():
    """Restored between two sub-batches of a run (the next commit, 200 to 300, knew nothing of it),
    then written again from 100 after a rewind: it lacks (100, 200] only."""
    kept, undone = history(("w", 100, None), ("w", 200, 100), ("R", 0), ("w", 300, 200))
    loss = ledger.restore_loss(kept, undone, APP)
    assert loss == ledger.Loss(pos(100), pos(200), ((pos(200), pos(300)),))
    lacks = [n for n in (150, 200, 250, 300, 350) if ledger.needs(pos(n), False, loss.held)
             and not ledger.held_in(pos(n), False, loss.written)]
    assert lacks == [150, 200, 350]
    assert ledger.held_in(pos(200), True, loss.written)  # a leading part of a transaction ending there


def _unaware_run(first: int, n: int) -> list[tuple]:
    """``n`` commits of a run that knows of no RESTORE: each written from the one before."""
    return [("w", 10 * (first + i + 1), 10 * (first + i)) for i in range(n)]


@pytest.mark.parametrize("after", [1, ledger.RECHECK_COMMITS, 49])
def test_a_restore_among_the_newest_50_commits_has_the_whole_history_read(after):
    """A RESTORE to version 5 of 100 commits, then ``after`` commits of a run that did not know of
    it: read from the newest 50 commits, the lineage reads the whole history and tells the loss
    (what the RESTORE undid, up to the commit before it)."""
    commits = _unaware_run(0, 100) + [("R", 5)] + _unaware_run(100, after)
    rows, asked = _history_rows(*commits), []
    kept, undone = ledger.read_lineage(lambda n: asked.append(n) or (rows[:n] if n else rows), APP)
    assert asked == [50, None]
    assert ledger.restore_loss(kept, undone, APP)[:2] == (pos(60), pos(1000))


def test_a_restore_with_50_commits_after_it_is_not_read_which_is_why_a_run_reads_again():
    """The window's limit, kept as the reason for RECHECK_COMMITS: 50 commits of one run after a
    RESTORE push it out of the newest 50, and the lineage read from them tells no loss. A run
    reads a table's lineage again after RECHECK_COMMITS commits (test_delta_sink.py proves it on a
    real table), so it never writes that many after a RESTORE unaware."""
    assert ledger.RECHECK_COMMITS < 50
    rows = _history_rows(*_unaware_run(0, 100), ("R", 5), *_unaware_run(100, 50))
    kept, undone = ledger.read_lineage(lambda n: rows[:n] if n else rows, APP)
    assert ledger.restore_loss(kept, undone, APP) is None
    whole = ledger.read_lineage(lambda n: rows, APP, None)
    assert ledger.restore_loss(*whole, APP)[:2] == (pos(60), pos(1000))
