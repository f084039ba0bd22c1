"""A snapshot chunk's first read, kept in the store while a sink lacks the chunk (tidegate.chunk_reads):
its encoding, the store's keeping and letting go, and which chunks every sink holds. The guarantee
itself (every sink ends with the same events after a kill between two sinks' commits of a chunk)
is proven against real servers in tests/integration/test_snapshot_split.py."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

from _tidegate_fakes import pos
from tidegate import snapshot
from tidegate.positions import SnapshotPosition
from tidegate.run import RunContext
from tidegate.snapshot import kept
from tidegate.snapshot import rows as snapshot_rows
from tidegate.sources.base import SnapshotTable
from tidegate.spec import load_spec_text
from tidegate.store import open_store
from tidegate.store.records import SnapshotRecord

TABLES = [SnapshotTable("shop", "shop", "orders", ("id",)).to_json()]
CHUNKS = [{"table": 0, "lo": None, "hi": [3]}, {"table": 0, "lo": [3], "hi": [6]},
          {"table": 0, "lo": [6], "hi": None}]
FIELDS = ("value", "key_bytes", "idempotency_key", "op", "db", "schema", "table", "tx_id", "tx_end",
          "commit_us")


def spec(sinks: int):
    lines = "".join(f"  - {{id: s{i}, kind: kafka, conn_id: k, topic: t}}\n" for i in range(sinks))
    return load_spec_text("pipeline: p\ntenant: t\nsource: {kind: mysql, conn_id: c}\nsinks:\n" + lines)


def chunk_events(rec, ids, chunk=1):
    table = SnapshotTable.from_json(rec.tables[0])
    build = snapshot.RowEvents(spec(1), rec, table, chunk, "mysql")
    return list(snapshot_rows._marked_rows(({"id": i, "v": "é∑", "n": None} for i in ids), build, final=True))


def test_a_read_comes_back_as_the_same_events():
    rec = SnapshotRecord("p", "s1", "start", pos(1), TABLES, CHUNKS, 0)
    events = chunk_events(rec, range(1, 2 * kept.BATCH + 2))  # three frames
    events[5].__dict__["headers"] = {"tidegate-old-key": b'{"id":0}'}  # as a key change carries
    blob = kept.encode(iter(events))
    back = list(kept.decode(blob))

    def fields(evs):
        return [[getattr(e, f) for f in FIELDS] + [getattr(e, "headers", None)] for e in evs]

    assert fields(back) == fields(events)
    assert [e.snapshot for e in back] == ["true"] * (len(events) - 1) + ["last"]
    assert back[0].key == {"id": 1} and json.loads(back[0].value)["after"]["v"] == "é∑"
    assert len(blob) * 5 < sum(len(e.value) for e in events)  # compressed


def test_one_sink_keeps_nothing_and_two_keep_the_first_read(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 's.sqlite'}")
    rec = SnapshotRecord("p", "s1", "start", pos(1), TABLES, CHUNKS, 0)
    first, later = chunk_events(rec, [1, 2]), chunk_events(rec, [2])
    upper, events = kept.first_read(RunContext(spec(1), store=store), rec, 1, pos(5), iter(first))
    assert upper == pos(5) and store.snapshots.kept_chunks("p") == {}
    upper, events = kept.first_read(RunContext(spec(2), store=store), rec, 1, pos(5), iter(first))
    assert upper == pos(5) and [e.value for e in events] == [e.value for e in first]
    # a later run's read of the chunk (fewer rows, a later upper bound) gives way to the kept one
    upper, events = kept.first_read(RunContext(spec(2), store=store), rec, 1, pos(9), iter(later))
    assert upper == pos(5) and [e.value for e in events] == [e.value for e in first]
    # one kept by a version that wrote another format (an upgrade between a kill and its rerun):
    # read again, and this read kept, rather than every retry failing
    store.snapshots.forget_read("p", "s1", 2)
    store.snapshots.keep_read("p", "s1", 2, pos(5), (99).to_bytes(4, "big") + b"later")
    upper, events = kept.first_read(RunContext(spec(2), store=store), rec, 2, pos(9), iter(later))
    assert upper == pos(9) and [e.value for e in events] == [e.value for e in later]
    assert kept.readable(store.snapshots.kept_read("p", "s1", 2)[1])
    store.close()


def test_reads_go_once_every_sink_holds_their_chunks(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 's.sqlite'}")
    epoch = store.leases.acquire("p", "r")
    rec = SnapshotRecord("p", "s1", "start", pos(3), TABLES, CHUNKS, 0)
    at = lambda chunk: SnapshotPosition("s1", chunk, pos(3))  # noqa: E731
    store.snapshots.begin(rec, {"s0": at(0), "s1": at(0)}, epoch=epoch)
    for chunk in (1, 2, 3):
        blob = kept.encode(chunk_events(rec, [chunk]))
        store.snapshots.keep_read("p", "s1", chunk, pos(3 + chunk), blob)
    two = RunContext(spec(2), store=store)
    store.checkpoints.write_many("p", {"s0": at(2), "s1": at(1)}, run_id="r", epoch=epoch)
    kept.forget_held(two)
    assert store.snapshots.kept_chunks("p") == {"s1": [2, 3]}  # s1 lacks chunk 2
    store.checkpoints.write_many("p", {"s1": pos(8)}, run_id="r", epoch=epoch)  # past the handoff
    kept.forget_held(two)
    assert store.snapshots.kept_chunks("p") == {"s1": [3]}  # s0 lacks chunk 3
    store.snapshots.finish("p", "s1")
    assert store.snapshots.kept_chunks("p") == {}
    # a new snapshot lets every read of the ones before it go
    store.snapshots.keep_read("p", "s1", 1, pos(4), kept.encode(chunk_events(rec, [1])))
    store.snapshots.begin(dataclasses.replace(rec, snapshot_id="s2"), {}, epoch=epoch)
    assert store.snapshots.kept_chunks("p") == {}
    store.close()


def test_what_a_sink_holds_of_a_snapshot():
    last = SnapshotPosition("s1", 3, pos(3))
    at = lambda p: SimpleNamespace(position=p)  # noqa: E731 - a checkpoint record's one field read
    assert kept._held(None, last) == 0
    assert kept._held(at(SnapshotPosition("s1", 2, pos(3))), last) == 2
    assert kept._held(at(pos(2)), last) == 0  # before the snapshot
    assert kept._held(at(pos(3)), last) == 3  # at its handoff: past every chunk
    assert kept._held(at(SnapshotPosition("s0", 9, pos(2))), last) == 0  # an older snapshot


def test_a_sink_on_another_server_than_a_snapshot_it_is_not_in_holds_all_of_it():
    """Seed 5922: after a GTID failover (or an accepted gap on a new server), a checkpoint on the
    new server is past a snapshot left on the old one, whatever its file and offset; inside the
    snapshot, the chunk counts as before."""
    last = SnapshotPosition("s1", 3, pos(30, server_id=1))
    at = lambda p: SimpleNamespace(position=p)  # noqa: E731
    for offset in (1, 30, 90):
        assert kept._held(at(pos(offset, server_id=2)), last) == 3
    assert kept._held(at(SnapshotPosition("s2", 1, pos(1, server_id=2))), last) == 3  # a later snapshot
    assert kept._held(at(SnapshotPosition("s1", 2, pos(1, server_id=2))), last) == 2  # moved with it
    assert kept._held(at(pos(20, server_id=1)), last) == 0  # same server, before it: as before
