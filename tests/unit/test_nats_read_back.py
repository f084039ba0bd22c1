"""The NATS sink's read-back bookkeeping (no server): where the read-back starts (the last
commit marker, as a claim carries it forward), which subjects it reads, the ack timeout
setting, how long a passed claim check covers publishing, the run report's field, and by what
a stored change is known on the other server of a GTID pair."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from tidegate.connections import Connection
from tidegate.coordinator import SinkReport
from tidegate.errors import NonRetryableSinkError
from tidegate.events import NEW_KEY_HEADER, OLD_KEY_HEADER, ChangeEvent, split_key_change
from tidegate.sinks.nats.markers import COMMIT_SEQ_HEADER, commit_seq_of
from tidegate.sinks.nats.read_back import TX_ORDER_HEADER, replay_id
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
        op="c", before=None, after={"id": 7}, key={"id": 7}, tx_id=tx_id, event_id=event_id,
        position={}, ts_ms=1_764_000_000_000, total_order=total_order, data_collection_order=1, **kw)


def test_a_change_read_from_either_server_of_a_gtid_pair_is_known_by_its_place_in_its_transaction():
    """Campaign seed 5821: the replica's copy of a change a killed run stored from the primary has
    another Nats-Msg-Id (the event id is a position in one server's log) and was stored twice."""
    s = sink()
    on_primary, on_replica = change("mysql-bin.000003:1520:0", 4), change("mysql-bin.000001:981:0", 4)
    (_, _, primary_id, primary_headers), = s._messages([on_primary], {})
    (_, _, replica_id, replica_headers), = s._messages([on_replica], {})
    assert primary_id != replica_id
    assert primary_headers == {"Nats-Msg-Id": primary_id, TX_ORDER_HEADER: "4"}
    # what the read-back of the killed run's messages holds, then the run on the replica
    s._stored_ids = {primary_id, replay_id(primary_id, primary_headers[TX_ORDER_HEADER])}
    assert s._is_stored((None, b"", replica_id, replica_headers))
    # another change of the transaction, and the same place in another transaction, are not
    for other in (change("mysql-bin.000001:981:1", 5), change("mysql-bin.000001:981:0", 4, "0-1-43")):
        (m,) = s._messages([other], {})
        assert not s._is_stored(m)


def test_a_snapshot_row_carries_no_place_and_a_key_change_keeps_its_headers():
    s = sink()
    row = change('{"id":7}', 1, tx_id="snapshot:ab12", snapshot="true")
    (_, _, row_id, headers), = s._messages([row], {})
    assert headers == {"Nats-Msg-Id": row_id}  # its id names no server: no second identity
    gone, made = split_key_change(change("mysql-bin.000001:981:0", 2), {"id": 6})
    assert [m[3] for m in s._messages([gone, made], {})] == [
        {"Nats-Msg-Id": gone.idempotency_key, TX_ORDER_HEADER: "2", NEW_KEY_HEADER: '{"id":7}'},
        {"Nats-Msg-Id": made.idempotency_key, TX_ORDER_HEADER: "3", OLD_KEY_HEADER: '{"id":6}'}]
