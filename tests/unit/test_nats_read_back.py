"""The NATS sink's read-back bookkeeping (no server): where the read-back starts (the last
commit marker, as a claim carries it forward), which subjects it reads, the ack timeout
setting, how long a passed claim check covers publishing, the run report's field, and by what
a stored change is known on the other server of a GTID pair."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace

import pytest
from tidegate.connections import Connection
from tidegate.coordinator import SinkReport
from tidegate.errors import NonRetryableSinkError
from tidegate.events import ChangeEvent, ControlMessage
from tidegate.sinks.nats.markers import COMMIT_SEQ_HEADER, commit_seq_of
from tidegate.sinks.nats.read_back import Stored, change_of, tx_prefix
from tidegate.sinks.nats.sink import NatsSink
from tidegate.sinks.nats.spec import NatsSinkSpec
from tidegate.spec import PipelineSpec, SourceSpec

SPEC = NatsSinkSpec(id="bus", kind="nats", conn_id="nats", stream="CDC",
                    subject="{pipeline}.{schema}.{table}", duplicate_window_s=120.0)


def sink(spec: NatsSinkSpec = SPEC, **extra) -> NatsSink:
    pipeline = PipelineSpec(pipeline="orders", source=SourceSpec("mysql", "db"), sinks=(spec,))
    return NatsSink(pipeline, spec, Connection("nats", "nats", host="127.0.0.1", port=4222, extra=extra))


def msg(seq: int, **headers: str) -> SimpleNamespace:
    return SimpleNamespace(seq=seq, headers=headers)


def test_the_read_back_starts_after_the_last_commit_marker():
    assert commit_seq_of(None) == 0  # no marker yet: the whole stream
    assert commit_seq_of(msg(41, **{"Nats-Msg-Id": "orders|e3|..."})) == 41  # a commit marker
    assert commit_seq_of(msg(57, **{COMMIT_SEQ_HEADER: "41"})) == 41  # a claim carries it forward
    assert commit_seq_of(msg(57, **{COMMIT_SEQ_HEADER: "0"})) == 0  # claims before any commit
    assert commit_seq_of(msg(57)) == 57  # a claim of an older version: from the claim on


def test_the_read_back_covers_the_data_control_and_dlq_subjects():
    assert sink().read_back_filters() == ["orders.*.*", "orders.__control", "orders.__dlq"]
    # A template whose filter covers the pipeline's channels reads one filter.
    wide = NatsSinkSpec(**{**SPEC.__dict__, "subject": "{pipeline}.{table}"})
    assert sink(wide).read_back_filters() == ["orders.*"]


def test_publish_timeout_is_a_connection_extra():
    assert sink().publish_timeout_s == 10.0
    assert sink(publish_timeout="2.5").publish_timeout_s == 2.5
    for bad in ("soon", 0, -1):
        with pytest.raises(NonRetryableSinkError, match=r"'nats': extra publish_timeout .* positive"):
            sink(publish_timeout=bad)


def test_a_claim_check_covers_half_the_duplicate_window():
    s = sink()
    assert s._claim_fresh_s() == 60.0
    s.stream_duplicate_window_s = 2.0  # the existing stream's window wins
    assert s._claim_fresh_s() == 1.0


def test_the_run_report_says_what_was_skipped():
    rep = SinkReport("bus", "nats", True, None, None, skipped=20)
    assert rep.to_json()["skipped"] == 20



def change(event_id: str, total_order: int, tx_id: str = "0-1-42", **kw) -> ChangeEvent:
    return ChangeEvent.build(
        tenant="default", pipeline="orders", connector="mysql", db="shop", schema="shop", table="t",
        op="c", before=None, after={"id": total_order}, key={"id": total_order}, tx_id=tx_id,
        event_id=event_id, position={}, ts_ms=1_764_000_000_000, total_order=total_order,
        data_collection_order=total_order, **kw)


class Stream:
    """What the stream holds after the last commit marker, for Stored's one fetch; counts them."""

    def __init__(self, events: list[ChangeEvent | ControlMessage]):
        self.events = events
        self.fetches: list[int] = []

    async def changes_after(self, after_seq: int) -> set:
        self.fetches.append(after_seq)
        return {change_of(ev.value) for ev in self.events} - {None}


def holding(events: list[ChangeEvent | ControlMessage]) -> tuple[Stored, Stream]:
    stream = Stream(events)
    stored = Stored(stream.changes_after)
    stored.add({ev.idempotency_key for ev in events}, 41)
    return stored, stream


def holds(stored: Stored, events: list[ChangeEvent | ControlMessage]) -> list[bool]:
    return [asyncio.run(stored.holds(ev.idempotency_key, ev.value)) for ev in events]


def test_a_change_read_from_either_server_of_a_gtid_pair_is_known_by_its_place_in_its_transaction():
    """Campaign seed 5821: the replica's copies of changes a killed run stored from the primary
    have other Nats-Msg-Ids (an event id is a position in one server's log) and were stored twice."""
    primary = [change(f"mysql-bin.000003:{1520 + 90 * i}:0", i) for i in (1, 2, 3)]
    replica = [change(f"mysql-bin.000001:{981 + 90 * i}:0", i) for i in (1, 2, 3, 4)]
    assert {e.idempotency_key for e in primary}.isdisjoint(e.idempotency_key for e in replica)
    stored, stream = holding(primary[:2])  # the killed run stored two of the three
    assert holds(stored, replica) == [True, True, False, False]
    assert stream.fetches == [41]  # once, from where the read-back started
    # the same place in another transaction, or in another table, is another change
    other = [change("mysql-bin.000001:981:0", 1, "0-1-43"),
             dataclasses.replace(replica[0], table="u")]
    assert holds(holding(primary)[0], other) == [False, False]


def test_what_the_same_server_stored_is_matched_by_id_and_nothing_is_fetched():
    events = [change(f"mysql-bin.000003:{1520 + 90 * i}:0", i) for i in (1, 2, 3, 4)]
    stored, stream = holding(events[:2])
    assert holds(stored, events) == [True, True, False, False]
    assert stream.fetches == []
    # a message refused in the middle of an attempt: what follows it in its transaction is
    # compared by change (one fetch), and is stored under its own id all the same
    stored, stream = holding([events[0], events[2]])
    assert holds(stored, events) == [True, False, True, False]
    assert stream.fetches == [41]


def test_snapshot_rows_and_dead_letters_are_known_by_id_only():
    row = change('{"id":7}', 1, tx_id="snapshot:ab12", snapshot="true")
    assert change_of(row.value) is None  # its id names no server
    assert change_of(b'{"error": "too large", "idempotency_key": "x", "event": "{..."}') is None
    live = change("mysql-bin.000003:1520:0", 1)
    assert change_of(live.value) == ("default|orders|shop.t|0-1-42", 1)
    assert tx_prefix(live.idempotency_key) == "default|orders|shop.t|0-1-42"


def schema_change(file: str, pos: int, gtid: str | None, table: str = "t") -> ControlMessage:
    return ControlMessage("default", "orders", "schema_change", f"{file}:{pos}:shop.{table}",
                          {"file": file, "pos": pos, "gtid": gtid}, 1_764_000_000_000,
                          {"change": "alter", "ddl": f"ALTER TABLE shop.{table} ADD c INT", "db": "shop",
                           "schema": "shop", "table": table, "columns": []}, tx_id=gtid or "")


def test_a_schema_change_read_from_either_server_of_a_gtid_pair_is_known_by_its_gtid_and_table():
    """A DDL among what a killed run stored: its control message's id is a position in the
    primary's log, the replica's copy has another (test_nats_failover.py stored it twice)."""
    primary = schema_change("mysql-bin.000003", 1520, "0-1-42")
    replica = schema_change("mysql-bin.000001", 981, "0-1-42")
    assert primary.idempotency_key != replica.idempotency_key
    assert change_of(primary.value) == change_of(replica.value)
    stored, stream = holding([primary])
    later = schema_change("mysql-bin.000001", 1400, "0-1-43")
    other_table = schema_change("mysql-bin.000001", 981, "0-1-42", table="u")  # one DDL, two tables
    assert holds(stored, [replica, later, other_table]) == [True, False, False]
    assert stream.fetches == [41]
    # read without GTIDs, a schema change names no transaction both servers know: by id only
    assert change_of(schema_change("mysql-bin.000001", 981, None).value) is None
