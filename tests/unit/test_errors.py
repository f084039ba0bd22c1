"""Engine errors cross process boundaries (the reader process of `tidegate run`) as themselves."""

from __future__ import annotations

import pickle

from tidegate.errors import (
    ErrorClass,
    IncomparablePositionsError,
    PoisonEventError,
    PositionPurgedError,
    SinkError,
    SpecError,
)
from tidegate.sources.mysql.position import BinlogPosition


def round_trip(exc):
    return pickle.loads(pickle.dumps(exc))


def test_keyword_attributes_survive_pickling():
    a, b = BinlogPosition("mysql-bin.000002", 4), BinlogPosition("mysql-bin.000009", 4)
    purged = round_trip(PositionPurgedError("binlog purged", requested=a, earliest_available=b))
    assert type(purged) is PositionPurgedError and str(purged) == "binlog purged"
    assert (purged.requested, purged.earliest_available, purged.kind) == (a, b, "binlog_purged")
    assert purged.fatal is PositionPurgedError.fatal

    other = round_trip(IncomparablePositionsError("two servers", a=a, b=b))
    assert (type(other), other.a, other.b) == (IncomparablePositionsError, a, b)
    sink = round_trip(SinkError("down", error_class=ErrorClass.RETRYABLE))
    assert sink.error_class is ErrorClass.RETRYABLE
    poison = round_trip(PoisonEventError("too large", events=["k1"]))
    assert poison.events == ["k1"]


def test_positional_constructors_survive_pickling():
    spec = round_trip(SpecError(["a.yaml: sinks: missing", "a.yaml: source.kind: unknown"]))
    assert spec.problems == ["a.yaml: sinks: missing", "a.yaml: source.kind: unknown"]
    assert str(spec) == "a.yaml: sinks: missing\na.yaml: source.kind: unknown"
