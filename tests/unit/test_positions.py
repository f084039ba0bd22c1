import json

import pytest
from tidegate.positions import later, position_from_json, position_to_json
from tidegate.sources.mysql.position import BinlogPosition, GtidSet
from tidegate.sources.postgres.position import Lsn, PgPosition


@pytest.mark.parametrize("text", ["16/B374D848", "0/0", "FFFFFFFF/FFFFFFFF", "1/0", "0/1A"])
def test_lsn_parse_format_round_trip(text):
    assert str(Lsn.parse(text)) == text


def test_lsn_value_and_lowercase():
    assert Lsn.parse("16/B374D848").value == (0x16 << 32) | 0xB374D848
    assert str(Lsn.parse("16/b374d848")) == "16/B374D848"


def test_lsn_compares_as_unsigned_64_bit():
    assert Lsn.parse("80000000/0") > Lsn.parse("7FFFFFFF/FFFFFFFF")
    assert Lsn.parse("FFFFFFFF/FFFFFFFF") > Lsn.parse("0/0")
    assert Lsn.parse("1/0") > Lsn.parse("0/FFFFFFFF")
    assert Lsn.parse("0/10") == Lsn.parse("0/00000010")


@pytest.mark.parametrize("bad", ["", "16", "16/", "/1", "G/1", "123456789/0", "1/2/3", "-1/0"])
def test_lsn_malformed(bad):
    with pytest.raises(ValueError):
        Lsn.parse(bad)


def test_binlog_order_across_rotation():
    ps = [BinlogPosition("mysql-bin.000010", 4), BinlogPosition("mysql-bin.000009", 999999),
          BinlogPosition("mysql-bin.000009", 4), BinlogPosition("mysql-bin.000100", 4)]
    assert [str(p) for p in sorted(ps)] == ["mysql-bin.000009:4", "mysql-bin.000009:999999",
                                           "mysql-bin.000010:4", "mysql-bin.000100:4"]
    # lexical order would put .000100 before .000010 if the widths differed; seq is numeric
    assert BinlogPosition("b.9", 4) < BinlogPosition("b.10", 4)


def test_binlog_rejects_bad_file():
    with pytest.raises(ValueError):
        BinlogPosition("mysql-bin", 4)
    with pytest.raises(ValueError):
        BinlogPosition("mysql-bin.000001", -1)


def test_gtid_contains_mysql():
    a = GtidSet.parse("3E11FA47-71CA-11E1-9E33-C80AA9429562:1-5:7-9,aaaaaaaa-0000-0000-0000-000000000000:1")
    assert a.contains(GtidSet.parse("3e11fa47-71ca-11e1-9e33-c80aa9429562:2-4"))
    assert a.contains(GtidSet.parse("3e11fa47-71ca-11e1-9e33-c80aa9429562:7"))
    assert not a.contains(GtidSet.parse("3e11fa47-71ca-11e1-9e33-c80aa9429562:6"))
    assert not a.contains(GtidSet.parse("bbbbbbbb-0000-0000-0000-000000000000:1"))
    assert a.contains(None)


def test_gtid_contains_mariadb():
    a = GtidSet.parse("0-1-100,1-2-5")
    assert a.flavor == "mariadb"
    assert a.contains(GtidSet.parse("0-1-99"))
    assert a.contains(GtidSet.parse("0-3-100,1-2-5"))
    assert not a.contains(GtidSet.parse("0-1-101"))
    assert not a.contains(GtidSet.parse("2-1-1"))
    assert not a.contains(GtidSet.parse("3e11fa47-71ca-11e1-9e33-c80aa9429562:1"))


def test_gtid_string_round_trip():
    for text in ["0-1-100,1-2-5", "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:7"]:
        assert str(GtidSet.parse(text)) == text
    assert str(GtidSet.parse("u:1-3,u:4-6")) == "u:1-6"


@pytest.mark.parametrize("p", [
    BinlogPosition("mysql-bin.000003", 1234, GtidSet.parse("0-1-42"), 1, None),
    BinlogPosition("mysql-bin.000003", 4),
    PgPosition(Lsn.parse("16/B374D848"), "7312345678901234567", 1),
])
def test_json_round_trip(p):
    d = position_to_json(p)
    text = json.dumps(d)
    q = position_from_json(text)
    assert q == p and position_to_json(q) == d
    assert position_from_json(d) == p


def test_position_from_json_rejects_unknown():
    with pytest.raises(ValueError):
        position_from_json({"offset": 1})
    assert position_from_json(None) is None
    with pytest.raises(ValueError, match="unknown kind 'oracle'"):
        position_from_json({"kind": "oracle", "scn": 1})


def test_json_carries_its_kind_and_json_without_one_still_loads():
    b = BinlogPosition("mysql-bin.000003", 120, GtidSet.parse("0-1-7"), 1, "u")
    p = PgPosition(Lsn.parse("16/B374D848"), "7001", 2)
    assert position_to_json(b)["kind"] == "mysql" and position_to_json(p)["kind"] == "postgres"
    # what stores, sink-side records and journals of older versions hold: no "kind"
    old_b = {"file": "mysql-bin.000003", "pos": 120, "gtid_set": "0-1-7", "server_id": 1, "server_uuid": "u"}
    old_p = {"lsn": "16/B374D848", "system_id": "7001", "timeline": 2}
    assert position_from_json(old_b) == b and position_from_json(json.dumps(old_p)) == p
    snap = position_from_json({"snapshot": "s1", "chunk": 2, "handoff": old_p})
    assert snap.handoff == p and position_to_json(snap)["handoff"]["kind"] == "postgres"


def test_later():
    a, b = PgPosition(Lsn.parse("0/10")), PgPosition(Lsn.parse("0/20"))
    assert later(a, b) == b and later(b, a) == b
    assert later(None, a) == a and later(a, None) == a and later(None, None) is None


# --------------------------------------------------------------------------- lineage


def test_binlog_positions_of_two_servers_cannot_be_ordered():
    from tidegate.errors import IncomparablePositionsError

    primary = BinlogPosition("mysql-bin.000009", 500, server_id=1)
    replica = BinlogPosition("mysql-bin.000002", 900, server_id=2)
    for op in (lambda: primary < replica, lambda: primary >= replica, lambda: max(primary, replica),
               lambda: later(primary, replica), lambda: sorted([primary, replica])):
        with pytest.raises(IncomparablePositionsError, match="server_id [12].*server_id [12]"):
            op()
    assert primary != BinlogPosition("mysql-bin.000009", 500, server_id=2)
    assert primary == BinlogPosition("mysql-bin.000009", 500, server_id=1)
    # a position without identity (hand-made) orders against either
    assert BinlogPosition("mysql-bin.000009", 4) < primary


def test_mysql_server_uuid_is_part_of_the_lineage():
    from tidegate.errors import IncomparablePositionsError

    a = BinlogPosition("b.1", 4, server_id=1, server_uuid="aaaa")
    b = BinlogPosition("b.1", 8, server_id=1, server_uuid="bbbb")
    with pytest.raises(IncomparablePositionsError):
        _ = a < b


def test_pg_positions_of_two_clusters_or_timelines_cannot_be_ordered():
    from tidegate.errors import IncomparablePositionsError

    base = PgPosition(Lsn.parse("0/100"), "7300000000000000001", 1)
    other_cluster = PgPosition(Lsn.parse("0/200"), "7300000000000000002", 1)
    promoted = PgPosition(Lsn.parse("0/200"), "7300000000000000001", 2)
    for other in (other_cluster, promoted):
        with pytest.raises(IncomparablePositionsError):
            _ = base < other
    assert base < PgPosition(Lsn.parse("0/200"), "7300000000000000001", 1)


def test_lowest_start_and_min_go_through_the_lineage_check():
    from tidegate.coordinator import lowest_start
    from tidegate.errors import IncomparablePositionsError

    with pytest.raises(IncomparablePositionsError):
        lowest_start([BinlogPosition("b.1", 4, server_id=1), BinlogPosition("b.1", 8, server_id=2)])
