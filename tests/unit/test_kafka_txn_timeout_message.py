"""Which error a fenced Kafka producer reports (no broker): a transaction open longer than its
transaction.timeout.ms says it timed out, naming the setting and the connection; a younger
one (or none open) says another instance fenced it."""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, KafkaException
from tidegate.connections import Connection
from tidegate.errors import ErrorClass, TimedOutTransactionError
from tidegate.sinks.kafka.client import TRANSACTION_TIMEOUT_MS
from tidegate.sinks.kafka.sink import KafkaSink
from tidegate.sinks.kafka.spec import KafkaSinkSpec
from tidegate.spec import PipelineSpec, SourceSpec

SPEC = KafkaSinkSpec(id="events", kind="kafka", conn_id="k", topic="{pipeline}.{table}", exactly_once=True)
FENCED = KafkaError(KafkaError._FENCED, "Failed to end transaction: Local: This instance has been "
                    "fenced by a newer instance", fatal=True)


def sink(**extra) -> KafkaSink:
    pipeline = PipelineSpec(pipeline="orders", source=SourceSpec("mysql", "db"), sinks=(SPEC,))
    conn = Connection("short_tx", "kafka", extra={"bootstrap.servers": "h:1", **extra})
    return KafkaSink(pipeline, SPEC, conn)


def test_a_transaction_older_than_its_timeout_says_it_timed_out():
    s = sink(**{"transaction.timeout.ms": 2000})
    assert s.settings.transaction_timeout_ms == 2000
    s._tx_began = time.monotonic() - 3.0  # begun 3 s ago
    e = s.error(KafkaException(FENCED), "delivering a transaction")
    text = str(e)
    assert e.error_class is ErrorClass.FATAL  # this producer is done ...
    assert isinstance(e, TimedOutTransactionError)  # ... but a new attempt of the run can deliver it
    assert "the transaction timed out: open 3.0s, longer than transaction.timeout.ms (2000 ms)" in text
    assert "extra of connection 'short_tx'" in text
    assert "another run took over" not in text
    assert "fenced by a newer instance" in text  # the client's own words come last


def test_a_younger_transaction_or_none_open_is_fenced_by_another_run():
    s = sink()
    assert s.settings.transaction_timeout_ms == TRANSACTION_TIMEOUT_MS
    for began in (None, time.monotonic() - 3.0):
        s._tx_began = began
        e = s.error(KafkaException(FENCED), "committing")
        assert not isinstance(e, TimedOutTransactionError)
        text = str(e)
        assert "fenced by a newer instance (another run took over this pipeline and sink)" in text
        assert "timed out" not in text


def test_any_fatal_transaction_error_past_the_timeout_is_the_timeout():
    """After a broker restart the client may say INVALID_TXN_STATE rather than fenced; past the
    timeout it is the same story, and a new attempt of the run can deliver it."""
    s = sink(**{"transaction.timeout.ms": 2000})
    s._tx_began = time.monotonic() - 5.0
    state = KafkaError(KafkaError.INVALID_TXN_STATE, "Failed to end transaction", fatal=True)
    e = s.error(KafkaException(state), "committing")
    assert isinstance(e, TimedOutTransactionError)
    assert "the transaction timed out" in str(e)
    s._tx_began = time.monotonic() - 0.5  # younger than its timeout: stays what it was
    assert not isinstance(s.error(KafkaException(state), "committing"), TimedOutTransactionError)
