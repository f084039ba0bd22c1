"""The NATS sink's read-back bookkeeping (no server): where the read-back starts (the last
commit marker, as a claim carries it forward), which subjects it reads, the ack timeout
setting, how long a passed claim check covers publishing, and the run report's field."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from tidegate.connections import Connection
from tidegate.coordinator import SinkReport
from tidegate.errors import NonRetryableSinkError
from tidegate.sinks.nats.markers import COMMIT_SEQ_HEADER, commit_seq_of
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
