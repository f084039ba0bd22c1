"""The adoption rule of sink-side checkpoint records (tidegate.sink_checkpoints), table-driven."""

import pytest
from tidegate.sink_checkpoints import RunStart, SinkCheckpoint, adopt, rewind_command
from tidegate.sources.mysql.position import BinlogPosition
from tidegate.sources.postgres.position import Lsn, PgPosition
from tidegate.store.records import CheckpointRecord


def bp(pos: int, server_id: int = 1) -> BinlogPosition:
    return BinlogPosition("mysql-bin.000003", pos, server_id=server_id)


def stored(version: int, position) -> CheckpointRecord:
    return CheckpointRecord("p", "s", version, position, "r", 1, "2026-01-01T00:00:00+00:00")


CASES = [
    # (store record, sink-side record, expected start, adopted?, why contains)
    (None, None, None, False, "no sink-side record"),
    (stored(3, bp(100)), None, bp(100), False, "no sink-side record"),
    (stored(3, bp(100)), SinkCheckpoint(bp(200), 3), bp(200), True, "extends version 3"),
    (None, SinkCheckpoint(bp(200), 0), bp(200), True, "extends version 0"),
    # extends an older version: a rewind / failover / accept_gap happened since
    (stored(4, bp(100)), SinkCheckpoint(bp(200), 3), bp(100), False, "store is at version 4"),
    # extends a newer version than the store knows (another store, a restored backup)
    (stored(2, bp(100)), SinkCheckpoint(bp(200), 3), bp(100), False, "store is at version 2"),
    # written before versions existed
    (stored(3, bp(100)), SinkCheckpoint(bp(200), None), bp(100), False, "without a store version"),
    # from another identity (old primary), even with a matching version number
    (stored(3, bp(100, server_id=2)), SinkCheckpoint(bp(900, server_id=1), 3), bp(100, server_id=2),
     False, "another source identity"),
    # not ahead (a replay re-wrote an older position under the current version)
    (stored(3, bp(300)), SinkCheckpoint(bp(200), 3), bp(300), False, "not ahead"),
    (stored(3, bp(300)), SinkCheckpoint(bp(300), 3), bp(300), False, "not ahead"),
    # Postgres: another timeline of the same cluster is another identity
    (stored(1, PgPosition(Lsn(100), "7", 2)), SinkCheckpoint(PgPosition(Lsn(500), "7", 1), 1),
     PgPosition(Lsn(100), "7", 2), False, "another source identity"),
]


@pytest.mark.parametrize("rec,side,start,adopted,why", CASES)
def test_adoption_rule(rec, side, start, adopted, why):
    a = adopt(rec, side)
    assert (a.position, a.adopted) == (start, adopted)
    assert why in a.why


@pytest.mark.parametrize("record", [SinkCheckpoint(bp(42), 7), SinkCheckpoint(bp(42), None),
                                    SinkCheckpoint(PgPosition(Lsn(9), "1", 1), 0)])
def test_record_round_trip(record):
    assert SinkCheckpoint.loads(record.dumps()) == record


def test_bare_position_record_of_older_versions_is_read_without_version():
    rec = SinkCheckpoint.loads('{"file": "mysql-bin.000001", "pos": 4, "server_id": 1}')
    assert rec.extends is None and rec.position == BinlogPosition("mysql-bin.000001", 4, server_id=1)


def test_a_run_start_names_the_rewinds_and_tells_whether_its_range_delivers_a_loss_again():
    def rec(version, n, kind="write", source_version=None):
        return CheckpointRecord("p", "lake", version, BinlogPosition("b.000001", n), None, None, "t",
                                kind=kind, source_version=source_version)

    history = (rec(1, 4, "head"), rec(2, 100), rec(3, 200), rec(4, 300))
    start = RunStart(BinlogPosition("b.000001", 300), history[-1], history)
    assert not start.going_on
    assert not start.delivers_after(BinlogPosition("b.000001", 200))
    assert start.delivers_after(BinlogPosition("b.000001", 300))
    assert not start.delivers_after(None)  # holds nothing, the range starts past the beginning
    again, on = start.rewinds("p", "lake", BinlogPosition("b.000001", 250))
    assert (again, on) == (rewind_command("p", "lake", 3), rewind_command("p", "lake", 4))
    assert start.rewinds("p", "lake", None)[0] == rewind_command("p", "lake", 1)  # before the first write
    assert start.rewinds("p", "lake", BinlogPosition("b.000001", 50))[0] == rewind_command("p", "lake", 1)
    on_anyway = history + (rec(5, 300, "rewind", source_version=4),)
    assert RunStart(BinlogPosition("b.000001", 300), on_anyway[-1], on_anyway).going_on
    rewound = history + (rec(5, 200, "rewind", source_version=3),)
    assert not RunStart(BinlogPosition("b.000001", 200), rewound[-1], rewound).going_on
    assert RunStart(None, None).delivers_after(None)  # a range from the beginning
