"""The failover guard's decisions, with a scripted source and recording sinks (the real-server
proofs are tests/integration/test_guards_*.py and test_continuity_e2e.py)."""

from __future__ import annotations

import textwrap

import pytest
from _tidegate_fakes import FakeParts, FakeSink, QuietSource
from tidegate import guards
from tidegate.errors import CannotTranslateError, SourceError
from tidegate.run import RunContext
from tidegate.sink_checkpoints import SinkCheckpoint
from tidegate.sources.mysql.position import BinlogPosition, GtidSet
from tidegate.sources.postgres.position import Lsn, PgPosition
from tidegate.spec import load_spec
from tidegate.store import open_store

OLD, NEW = {"kind": "mysql", "server_id": 1}, {"kind": "mysql", "server_id": 2}


def old_pos(n: int, gtid: bool = True) -> BinlogPosition:
    return BinlogPosition("mysql-bin.000009", n * 100, server_id=1,
                          gtid_set=GtidSet.parse(f"0-1-{n}") if gtid else None)


class NewServer(QuietSource):
    """The server behind the connection after the change: it places a GTID set ``0-1-n`` at
    offset 1000 + n of its own binlog, or refuses as scripted."""

    kind = "mysql"

    def __init__(self, identity=NEW, refuse: Exception | None = None):
        self._identity, self.refuse, self.asked = identity, refuse, []

    def identity(self):
        return dict(self._identity)

    def head(self):
        return BinlogPosition("mysql-bin.000002", 5000, server_id=self._identity.get("server_id"))

    def read(self, start, upto):
        return iter(())

    translates_positions = True

    def translate(self, checkpoint):
        if checkpoint.gtid_set is None:
            raise CannotTranslateError(f"checkpoint {checkpoint} carries no GTID set")
        self.asked.append(str(checkpoint.gtid_set))
        if self.refuse is not None:
            raise self.refuse
        n = checkpoint.gtid_set.mariadb[0][2]
        return BinlogPosition("mysql-bin.000002", 1000 + n, server_id=2, gtid_set=checkpoint.gtid_set)

    def describe_change(self, old):
        return f"server_id {old['server_id']} -> {self._identity['server_id']}"


@pytest.fixture()
def setup(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent("""
        pipeline: p
        source: {kind: mysql, conn_id: src}
        sinks:
          - {id: a, kind: redis, conn_id: r, stream: s}
          - {id: b, kind: redis, conn_id: r, stream: s}
    """))
    spec = load_spec(str(path))
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    epoch = store.leases.acquire("p", "r0")
    store.checkpoints.write_many("p", {"a": old_pos(10), "b": old_pos(12)}, run_id="r0", epoch=epoch)
    store.checkpoints.set_source_identity("p", OLD)

    yield spec, store
    store.close()


def test_gtid_failover_translates_each_sink_including_its_sink_side_record(setup):
    spec, store = setup
    source = NewServer()
    # b committed up to GTID 0-1-15 on the old primary; its store write was lost in a crash
    sinks = [FakeSink("a"), FakeSink("b", committed=SinkCheckpoint(old_pos(15), 1))]
    out = guards.guard_failover(RunContext(spec, run_id="r1", parts=FakeParts(source, sinks), store=store))
    assert out["status"] == "failover_continued"
    assert source.asked == ["0-1-10", "0-1-15"]
    now = store.checkpoints.current("p")
    assert {sid: (r.position.pos, r.position.server_id, r.kind) for sid, r in now.items()} == {
        "a": (1010, 2, "failover"), "b": (1015, 2, "failover")}
    assert store.checkpoints.source_identity("p") == NEW
    [inc] = store.incidents.all("p")
    assert (inc.kind, inc.resolved, inc.resolution) == ("failover", True, "auto")
    assert inc.from_position == old_pos(10) and inc.to_position.pos == 1010
    # b's old record names version 1; the store is at version 2 now: it can never pull b back
    assert now["b"].version == 2


@pytest.mark.parametrize("case", ["no_gtids", "gtids_missing"])
def test_failover_that_cannot_be_translated_halts_with_the_range(setup, case):
    spec, store = setup
    if case == "no_gtids":
        epoch = store.leases.acquire("p", "r0")
        store.checkpoints.write("p", "b", old_pos(12, gtid=False), run_id="r0", epoch=epoch)
        source = NewServer()
    else:
        source = NewServer(refuse=SourceError("the server has not executed 0-1-12"))
    before = {sid: r.version for sid, r in store.checkpoints.current("p").items()}
    with pytest.raises(guards.ContinuityHalt) as halt:
        guards.guard_failover(RunContext(spec, run_id="r1", parts=FakeParts(source, [FakeSink("a"),
                                         FakeSink("b")]), store=store))
    inc = halt.value.incident
    assert (inc.kind, inc.resolved) == ("failover", False)
    assert inc.from_position == old_pos(10) and inc.to_position == source.head()
    assert "server_id 1 -> 2" in inc.detail
    assert ("carries no GTID set" if case == "no_gtids" else "has not executed") in inc.detail
    assert {sid: r.version for sid, r in store.checkpoints.current("p").items()} == before  # nothing moved
    assert store.checkpoints.source_identity("p") == OLD


def test_required_sink_that_cannot_be_read_fails_the_guard_without_moving_anything(setup):
    spec, store = setup

    class Down(FakeSink):
        def committed_checkpoint(self):
            raise ConnectionError("redis is down")

    with pytest.raises(ConnectionError):
        guards.guard_failover(RunContext(spec, run_id="r1", parts=FakeParts(NewServer(), [FakeSink("a"),
                                         Down("b")]), store=store))
    assert all(r.kind == "write" for r in store.checkpoints.current("p").values())


def test_postgres_cluster_change_halts_and_says_what_changed(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("pipeline: p\nsource: {kind: postgres, conn_id: src}\n"
                    "sinks: [{id: a, kind: redis, conn_id: r, stream: s}]\n")
    spec = load_spec(str(path))
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    epoch = store.leases.acquire("p", "r0")
    store.checkpoints.write("p", "a", PgPosition(Lsn(100), "111", 1), run_id="r0", epoch=epoch)
    store.checkpoints.set_source_identity("p", {"kind": "postgres", "system_id": "111", "timeline": 1})

    class OtherCluster(NewServer):
        kind = "postgres"
        translates_positions = False

        def describe_change(self, old):
            return f"another PostgreSQL cluster (system identifier {old['system_id']} -> 222)"

        def head(self):
            return PgPosition(Lsn(50), "222", 1)

    other = OtherCluster({"kind": "postgres", "system_id": "222", "timeline": 1})
    with pytest.raises(guards.ContinuityHalt) as halt:
        guards.guard_failover(RunContext(spec, run_id="r1", parts=FakeParts(other), store=store))
    inc = halt.value.incident
    assert "another PostgreSQL cluster (system identifier 111 -> 222)" in inc.detail
    assert inc.from_position == PgPosition(Lsn(100), "111", 1)
    assert inc.to_position == PgPosition(Lsn(50), "222", 1)
    store.close()
