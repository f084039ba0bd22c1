"""Sinks without servers: error classes, connection mapping, murmur2, subjects, preflight."""

from __future__ import annotations

import ctypes

import nats.errors as nerr
import nats.js.errors as jerr
import pytest
import redis.exceptions as rex
from confluent_kafka import KafkaError, KafkaException
from tidegate.connections import Connection
from tidegate.errors import ErrorClass, NonRetryableSinkError
from tidegate.sinks import make_sink
from tidegate.sinks.base import RetryPolicy
from tidegate.sinks.kafka.client import client_config
from tidegate.sinks.kafka.errors import classify_kafka_error
from tidegate.sinks.kafka.partition import murmur2, murmur2_partition
from tidegate.sinks.kafka.sink import KafkaSink
from tidegate.sinks.kafka.spec import KafkaSinkSpec
from tidegate.sinks.nats.client import classify_nats_error
from tidegate.sinks.nats.preflight import check_duplicate_window, retry_budget_s, schedule_interval_s
from tidegate.sinks.nats.sink import NatsSink
from tidegate.sinks.nats.spec import NatsSinkSpec
from tidegate.sinks.nats.subjects import subject_covers, subject_filter
from tidegate.sinks.redis.sink import RedisSink, classify_redis_error
from tidegate.sinks.redis.spec import RedisSinkSpec
from tidegate.spec import PipelineSpec, SinkSpec, SourceSpec

R, N, F = ErrorClass.RETRYABLE, ErrorClass.NON_RETRYABLE, ErrorClass.FATAL


def spec_for(sink: SinkSpec, schedule: str | None = None) -> PipelineSpec:
    return PipelineSpec(pipeline="orders", source=SourceSpec("mysql", "db"), sinks=(sink,), schedule=schedule)


KAFKA = KafkaSinkSpec(id="events", kind="kafka", conn_id="k", topic="{pipeline}.{schema}.{table}",
                 exactly_once=True)
NATS = NatsSinkSpec(id="bus", kind="nats", conn_id="n", stream="CDC", subject="{pipeline}.{schema}.{table}")
REDIS = RedisSinkSpec(id="cache", kind="redis", conn_id="r", stream="{pipeline}:{schema}.{table}")


# --------------------------------------------------------------------------- kafka


@pytest.mark.parametrize("code,fatal,expected", [
    (KafkaError._FENCED, True, F), (KafkaError.PRODUCER_FENCED, False, F),
    (KafkaError.INVALID_PRODUCER_EPOCH, False, F), (KafkaError._FATAL, True, F),
    (KafkaError.SASL_AUTHENTICATION_FAILED, False, N), (KafkaError._AUTHENTICATION, False, N),
    (KafkaError.TOPIC_AUTHORIZATION_FAILED, False, N), (KafkaError.MSG_SIZE_TOO_LARGE, False, N),
    (KafkaError.UNKNOWN_TOPIC_OR_PART, False, N), (KafkaError._QUEUE_FULL, False, R),
    (KafkaError._MSG_TIMED_OUT, False, R), (KafkaError._TIMED_OUT, False, R),
    (KafkaError._TRANSPORT, False, R), (KafkaError._ALL_BROKERS_DOWN, False, R),
    (KafkaError.NOT_ENOUGH_REPLICAS, False, R), (KafkaError.REQUEST_TIMED_OUT, False, R),
])
def test_kafka_error_classes(code, fatal, expected):
    err = KafkaError(code, "x", fatal=fatal)
    assert classify_kafka_error(err) is expected
    sink = KafkaSink(spec_for(KAFKA), KAFKA, Connection("k", "kafka", extra={"bootstrap.servers": "h:1"}))
    assert sink.classify(KafkaException(err)) is expected
    assert sink.error(KafkaException(err), "testing").error_class is expected


def test_kafka_buffer_error_is_retryable():
    sink = KafkaSink(spec_for(KAFKA), KAFKA, Connection("k", "kafka", extra={"bootstrap.servers": "h:1"}))
    assert sink.classify(BufferError("queue full")) is R


def test_kafka_fenced_message_names_transactional_id():
    sink = KafkaSink(spec_for(KAFKA), KAFKA, Connection("k", "kafka", extra={"bootstrap.servers": "h:1"}))
    err = KafkaError(KafkaError._FENCED, "Producer fenced by newer instance", fatal=True)
    e = sink.error(KafkaException(err), "committing")
    assert f"tidegate-{sink.tenant}.orders.events" in str(e) and "fenced" in str(e)


def test_kafka_client_config_from_connection_maps_sasl_and_keeps_extras():
    c = Connection("k", "kafka", host="b1:9093,b2:9093", login="svc", password="p4ss-word",
                   extra={"ssl.ca.location": "/ca.pem", "linger.ms": 20,
                          "enable.ssl.certificate.verification": True})
    cfg = client_config(c)
    assert cfg["bootstrap.servers"] == "b1:9093,b2:9093"
    assert cfg["sasl.username"] == "svc" and cfg["sasl.password"] == "p4ss-word"
    assert cfg["security.protocol"] == "SASL_SSL" and cfg["sasl.mechanism"] == "PLAIN"
    assert cfg["ssl.ca.location"] == "/ca.pem" and cfg["enable.ssl.certificate.verification"] == "true"
    sink = KafkaSink(spec_for(KAFKA), KAFKA, c)
    p = sink.settings.producer()
    assert p["transactional.id"] == "tidegate-default.orders.events" and p["partitioner"] == "murmur2_random"
    assert p["acks"] == "all" and p["enable.idempotence"] is True and p["linger.ms"] == 20
    # secrets are redacted from anything the sink says
    assert sink.redact("auth failed for svc with p4ss-word") == "auth failed for svc with ***"
    assert "p4ss-word" not in repr(c)


def test_kafka_clients_start_with_tidegates_defaults_which_the_connection_overrides():
    plain = KafkaSink(spec_for(KAFKA), KAFKA, Connection("k", "kafka", extra={"bootstrap.servers": "h:1"}))
    for cfg in (plain.settings.producer(), plain.settings.admin(), plain.settings.reader()):
        assert cfg["reconnect.backoff.ms"] == 20
    assert plain.settings.producer()["linger.ms"] == 25
    own = KafkaSink(spec_for(KAFKA), KAFKA, Connection("k", "kafka", extra={
        "bootstrap.servers": "h:1", "reconnect.backoff.ms": 250, "linger.ms": 0}))
    for cfg in (own.settings.producer(), own.settings.admin(), own.settings.reader()):
        assert cfg["reconnect.backoff.ms"] == 250
    assert own.settings.producer()["linger.ms"] == 0


def test_kafka_connection_without_broker_is_a_clear_error():
    with pytest.raises(NonRetryableSinkError, match="bootstrap.servers"):
        client_config(Connection("k", "kafka"))


def test_murmur2_matches_java_clients():
    # Vectors from Apache Kafka's UtilsTest (Java ints).
    for text, want in [("21", -973932308), ("foobar", -790332482), ("a-little-bit-long-string", -985981536),
                       ("a-little-bit-longer-string", -1486304829), ("abc", 479470107),
                       ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971)]:
        assert ctypes.c_int32(murmur2(text.encode())).value == want
    assert 0 <= murmur2_partition(b'{"id":7}', 6) < 6


# --------------------------------------------------------------------------- redis


@pytest.mark.parametrize("exc,expected", [
    (rex.AuthenticationError("invalid username-password pair"), N),
    (rex.ResponseError("WRONGPASS invalid username-password pair or user is disabled."), N),
    (rex.ResponseError("NOAUTH Authentication required."), N),
    (rex.NoPermissionError("NOPERM this user has no permissions to run the 'xadd' command"), N),
    (rex.ExecAbortError("EXECABORT Transaction discarded because of: NOPERM no permissions"), N),
    (rex.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused."), R),
    (rex.TimeoutError("Timeout reading from socket"), R), (rex.BusyLoadingError("LOADING"), R),
    (rex.ReadOnlyError("READONLY You can't write against a read only replica."), R),
    (rex.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), N),
])
def test_redis_error_classes(exc, expected):
    assert classify_redis_error(exc) is expected
    sink = RedisSink(spec_for(REDIS), REDIS, Connection("r", "redis", host="h", port=1, password="pw-x1"))
    assert sink.classify(exc) is expected
    assert sink.error(exc, "testing").error_class is expected


def test_redis_client_kwargs_from_connection():
    c = Connection("r", "redis", host="cache", port=6380, login="tidegate", password="s3cret", schema="2",
                   extra={"ssl": "true", "ssl_ca_certs": "/ca.pem"})
    kw = RedisSink(spec_for(REDIS), REDIS, c).client_kwargs()
    got = (kw["host"], kw["port"], kw["db"], kw["username"], kw["password"])
    assert got == ("cache", 6380, 2, "tidegate", "s3cret")
    assert kw["ssl"] is True and kw["ssl_ca_certs"] == "/ca.pem"


# --------------------------------------------------------------------------- nats


@pytest.mark.parametrize("exc,expected", [
    (nerr.Error("nats: 'Authorization Violation'"), N), (nerr.MaxPayloadError(), N),
    (jerr.APIError(code=400, err_code=10058, description="stream name already in use"), N),
    (jerr.ServiceUnavailableError(code=503, description="JetStream system temporarily unavailable"), R),
    (jerr.NoStreamResponseError(), R), (nerr.TimeoutError(), R), (TimeoutError(), R),
    (nerr.ConnectionClosedError(), R), (nerr.NoServersError(), R),
])
def test_nats_error_classes(exc, expected):
    assert classify_nats_error(exc) is expected
    sink = NatsSink(spec_for(NATS), NATS, Connection("n", "nats", host="h", port=1))
    assert sink.classify(exc) is expected


def test_subject_filter_and_coverage():
    assert subject_filter("{pipeline}.{schema}.{table}", "orders") == "orders.*.*"
    assert subject_filter("cdc.{pipeline}.t_{table}", "orders") == "cdc.orders.>"
    assert subject_filter("fixed.subject", "orders") == "fixed.subject"
    assert subject_covers("orders.>", "orders.*.*") and subject_covers("orders.*.*", "orders.*.*")
    assert subject_covers(">", "a.b") and not subject_covers("orders.*", "orders.*.*")
    assert not subject_covers("orders.*.*", "orders.>") and not subject_covers("other.>", "orders.*.*")


def test_schedule_interval_and_duplicate_window_preflight():
    assert schedule_interval_s("*/1 * * * *") == 60 and schedule_interval_s("* * * * *") == 60
    assert schedule_interval_s("*/15 * * * *") == 900 and schedule_interval_s("5 * * * *") == 3600
    assert schedule_interval_s("0 */6 * * *") == 6 * 3600 and schedule_interval_s("30 2 * * *") == 86400
    assert schedule_interval_s("@hourly") == 3600 and schedule_interval_s("@continuous") == 0
    assert schedule_interval_s(None) is None and schedule_interval_s("0 9 * * 1-5") is None
    assert retry_budget_s(RetryPolicy(0.05, 5.0, 3), 10.0) == pytest.approx(30.15)
    check_duplicate_window(120, 60, 30, stream="S")
    with pytest.raises(NonRetryableSinkError) as err:
        check_duplicate_window(60, 300, 30.15, stream="CDC")
    assert "duplicate_window 60s" in str(err.value) and "interval 300s" in str(err.value)
    assert "retry budget 30.15s" in str(err.value) and "330.15s" in str(err.value)
    sink = NatsSink(spec_for(NATS), NATS, Connection("n", "nats", host="h", port=1))
    sink.preflight(60)  # default window 120 s ≥ 60 s + 30.15 s
    with pytest.raises(NonRetryableSinkError):
        sink.preflight(100)


def test_nats_connect_options_keep_credentials_out_of_urls():
    c = Connection("n", "nats", host="bus", port=4333, login="u", password="pw-n4ts",
                   extra={"connect_timeout": 3})
    opts = NatsSink(spec_for(NATS), NATS, c).client.options()
    assert opts["servers"] == ["nats://bus:4333"] and opts["user"] == "u" and opts["password"] == "pw-n4ts"
    assert all("pw-n4ts" not in s for s in opts["servers"])


def test_make_sink_builds_each_kind_and_refuses_unknown():
    conn = Connection("x", "x", host="h", port=1, extra={"bootstrap.servers": "h:1"})
    assert isinstance(make_sink(spec_for(KAFKA), KAFKA, conn), KafkaSink)
    assert isinstance(make_sink(spec_for(NATS), NATS, conn), NatsSink)
    assert isinstance(make_sink(spec_for(REDIS), REDIS, conn), RedisSink)
    odd = SinkSpec(id="x", kind="s3", conn_id="x")
    with pytest.raises(ValueError, match="unknown kind"):
        make_sink(spec_for(odd), odd, conn)
    s = make_sink(spec_for(REDIS), REDIS, conn)
    got = (s.kind, s.sink_id, s.pipeline, s.checkpoint_key)
    assert got == ("redis", "cache", "orders", f"{s.tenant}/orders::sink::cache")


def test_a_watch_error_raised_for_a_lost_connection_is_told_from_a_moved_key():
    """redis-py raises WatchError in both cases; only the one it raises while handling a
    connection error may hide an EXEC that ran (the Redis sink then reads its record first)."""
    from tidegate.sinks.redis.sink import _connection_lost

    try:
        try:
            raise rex.ConnectionError("Connection closed by server.")
        except rex.ConnectionError:
            raise rex.WatchError("A ConnectionError occurred while watching one or more keys") from None
    except rex.WatchError as lost:
        assert lost.__context__ is not None and _connection_lost(lost)
    assert not _connection_lost(rex.WatchError("Watched variable changed."))
