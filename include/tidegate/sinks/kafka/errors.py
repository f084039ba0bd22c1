"""What librdkafka reports and what the Kafka sink makes of it: the error classes (retryable,
non-retryable, fatal; the sink module's docstring lists them), the reports its callbacks
collect, and the messages that name the cause and the fix."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from ...errors import ErrorClass, SinkError

log = logging.getLogger("tidegate.sinks.kafka.sink")

FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
          KafkaError.TRANSACTION_COORDINATOR_FENCED}
AUTH = {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError._SSL}
LOGIN = {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._SSL}
TOO_LARGE = {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_MSG_SIZE}
PURGED = {KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT}
UNKNOWN_TOPIC = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC,
                 KafkaError._UNKNOWN_PARTITION}
_RETRYABLE = {KafkaError._QUEUE_FULL, KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT,
              KafkaError._MSG_TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
              KafkaError._RESOLVE, KafkaError._TIMED_OUT_QUEUE, KafkaError.NOT_ENOUGH_REPLICAS,
              KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND, KafkaError.LEADER_NOT_AVAILABLE,
              KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.NETWORK_EXCEPTION,
              KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR,
              KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.CONCURRENT_TRANSACTIONS,
              KafkaError.BROKER_NOT_AVAILABLE, KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT,
              KafkaError.KAFKA_STORAGE_ERROR}
_NON_RETRYABLE = AUTH | TOO_LARGE | UNKNOWN_TOPIC | {
    KafkaError._INVALID_ARG, KafkaError.INVALID_CONFIG, KafkaError.INVALID_REPLICATION_FACTOR,
    KafkaError.INVALID_PARTITIONS, KafkaError.POLICY_VIOLATION, KafkaError.TOPIC_EXCEPTION,
    KafkaError.UNSUPPORTED_VERSION, KafkaError._UNSUPPORTED_FEATURE, KafkaError.INVALID_RECORD,
    KafkaError.INVALID_MSG}
# The sink's error(exc, doing): a client exception as the SinkError that names the sink and the fix
Fail = Callable[[BaseException, str], SinkError]
RANK = {ErrorClass.FATAL: 0, ErrorClass.NON_RETRYABLE: 1, ErrorClass.RETRYABLE: 2}


def classify_kafka_error(err: KafkaError) -> ErrorClass:
    """The error class of a librdkafka error (see the sink module's docstring)."""
    code = err.code()
    if code in FENCED or err.fatal():
        return ErrorClass.FATAL
    if code in _NON_RETRYABLE:
        return ErrorClass.NON_RETRYABLE
    if code in _RETRYABLE or err.retriable():
        return ErrorClass.RETRYABLE
    if err.txn_requires_abort():  # abortable, no worse cause known: abort and try again
        return ErrorClass.RETRYABLE
    return ErrorClass.NON_RETRYABLE


def kafka_error_of(exc: BaseException) -> KafkaError | None:
    """The librdkafka error a KafkaException carries (None for any other exception)."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def worst(a: SinkError, b: SinkError | None) -> SinkError:
    """The more severe of two failures; on a tie the delivery error ``b`` (it names the cause)."""
    if b is None:
        return a
    return a if RANK[a.error_class] < RANK[b.error_class] else b


def open_past(began: float | None, timeout_ms: int) -> float | None:
    """Seconds a transaction begun at ``began`` (time.monotonic()) has been open, when that is
    at least ``timeout_ms``; else None (also when none is open)."""
    if began is None:
        return None
    open_s = time.monotonic() - began
    return open_s if open_s * 1000 >= timeout_ms else None


class Reports:
    """What the clients' callbacks said: every failed delivery (error, topic, size, key) and
    every client error, since the last :meth:`clear`. The producer, the admin client and the
    checkpoint reader all report here."""

    def __init__(self, sink_id: str, redact: Callable[[str], str]):
        self.sink_id = sink_id
        self.redact = redact
        self.delivery: list[tuple[KafkaError, str, int, bytes | None]] = []
        # Records written in another form than their event's bytes (Debezium's): a refusal of one
        # is known by its event's idempotency key (:meth:`reporter`), not by the record's size.
        self.refused_events: dict[str, KafkaError] = {}
        self.client: list[KafkaError] = []
        self._logged_codes: set[int] = set()

    def on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.failed(err, msg.topic(), len(msg), msg.key())

    def failed(self, err: KafkaError, topic: str, size: int, key: bytes | None, ident: str | None = None
               ) -> None:
        """One record not delivered: as a delivery report says it, or as ``produce()`` refused
        it itself (a record over the producer's own message.max.bytes never reaches a broker).
        ``ident``: the event a record written in another form than its bytes was written for."""
        self.delivery.append((err, topic, size, key))
        if ident is not None and err.code() in TOO_LARGE:
            self.refused_events[ident] = err

    def on_error(self, err: KafkaError) -> None:
        self.client.append(err)
        # librdkafka reconnects every few ms and reports each refusal: say each kind once.
        level = logging.DEBUG if err.code() in self._logged_codes else logging.WARNING
        self._logged_codes.add(err.code())
        log.log(level, "Kafka sink %r: client error %s: %s", self.sink_id, err.name(), self.redact(err.str()))

    def reporter(self, ident: str) -> Callable[[KafkaError | None, Any], None]:
        """The delivery callback of the records written for the event ``ident`` in another form
        than its envelope: one the broker refuses on its own names the event."""
        def report(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                self.failed(err, msg.topic(), len(msg), msg.key(), ident)
        return report

    def refused_here(self, exc: KafkaException, topic: str, value: bytes | None, key: bytes | None,
                     ident: str | None = None) -> bool:
        """Whether ``produce()`` raised ``exc`` for a record too large for the producer itself;
        such a refusal is kept as a failed delivery (:meth:`failed`), so it is poison as a
        broker's refusal is, and the records after it are still written."""
        err = kafka_error_of(exc)
        if err is None or err.code() not in TOO_LARGE:
            return False
        self.failed(err, topic, len(value or b""), key, ident)
        return True

    def clear(self) -> None:
        self.delivery.clear()
        self.refused_events.clear()
        self.client.clear()

    def too_large(self) -> bool:
        """Did the broker refuse a message on its own (larger than the topic accepts)?"""
        return any(err.code() in TOO_LARGE for err, *_ in self.delivery)

    def refused(self, events: list, topics: list[str]) -> dict:
        """The events the broker refused on their own, by idempotency key: (event, why). A
        failed delivery report names a topic, a key and a size, which pick out the event whose
        own bytes the record was; a record written in another form names its event itself."""
        why = ("Kafka refused it ({}: larger than the topic's max.message.bytes / the broker's "
               "message.max.bytes, or than the producer's message.max.bytes)")
        if self.refused_events:
            found = ((ev, self.refused_events.get(ev.idempotency_key)) for ev in events)
        else:
            refused = {(topic, key, size): err for err, topic, size, key in self.delivery
                       if err.code() in TOO_LARGE}
            found = ((ev, refused.get((topic, ev.key_bytes, len(ev.value))))
                     for ev, topic in zip(events, topics, strict=True))
        return {ev.idempotency_key: (ev, why.format(err.name())) for ev, err in found if err is not None}

    def new_refusals(self, chunks: Any, topics_of: Callable[[list], list[str]], known: dict) -> dict:
        """:meth:`refused` over a sub-batch's ``chunks`` (each chunk's topics by ``topics_of``),
        leaving out the idempotency keys in ``known``."""
        if not self.too_large():
            return {}
        found: dict = {}
        for chunk in chunks:
            found.update(self.refused(chunk, topics_of(chunk)))
        return {k: v for k, v in found.items() if k not in known}

    def lasting_client_error(self) -> KafkaError | None:
        """A client error that waiting does not heal (authentication, fatal), if one was seen."""
        for err in self.client:
            if err.fatal() or err.code() in AUTH:
                return err
        return None

    def worst_delivery(self) -> tuple[KafkaError, str, int, bytes | None] | None:
        """The worst failed delivery (fatal > non-retryable > retryable). Purged messages are a
        consequence (of an abort or a failed transaction), not a cause: one of them is the
        answer only when nothing else failed."""
        if not self.delivery:
            return None
        causes = [e for e in self.delivery if e[0].code() not in PURGED] or self.delivery
        return min(causes, key=lambda e: RANK[classify_kafka_error(e[0])])


def too_large_message(sink_id: str, err: KafkaError, topic: str, size: int, key: bytes | None,
                      what: str) -> str:
    return (f"Kafka sink {sink_id!r}: a message of {size} bytes for topic {topic!r} "
            f"(key {key.decode(errors='replace')[:200] if key else None}) is larger than the broker "
            f"accepts ({err.name()}); raise the topic's max.message.bytes (broker message.max.bytes) and, "
            f"past 16 MiB, the producer's message.max.bytes (the connection's extra), or shrink the row. "
            f"{what}.")


def missing_topic_message(sink_id: str, pipeline: str, topic: str) -> str:
    return (f"Kafka sink {sink_id!r} (pipeline {pipeline!r}): topic {topic!r} does not exist "
            f"and create_topics is false for this sink; create the topic or set create_topics: true")


def timed_out_message(where: str, open_s: float, timeout_ms: int, conn_id: str, text: str, doing: str) -> str:
    """A producer fenced because its own transaction outlived transaction.timeout.ms (a stalled
    process, a sub-batch too slow): the broker aborted the transaction and bumped the producer's
    epoch, which the producer then reads as "fenced by a newer instance" although no other run
    may exist. What happened and the fix first: reports cut long messages."""
    return (f"{where}: the transaction timed out: open {open_s:.1f}s, longer than "
            f"transaction.timeout.ms ({timeout_ms} ms), so the broker aborted it and fenced this "
            f"producer (a stalled run or a slow sub-batch, not necessarily another run; if sub-batches "
            f"take that long, raise transaction.timeout.ms in the extra of connection {conn_id!r}, at "
            f"most the broker's transaction.max.timeout.ms) while {doing}. None of it is visible to "
            f"read_committed consumers; a rerun delivers it again. The client said: {text}")


def explain(err: KafkaError, text: str, doing: str, *, where: str, transactional_id: str,
            conn_id: str) -> str | None:
    """The message with the fix for a fenced producer, a refused login, missing ACLs."""
    code = err.code()
    if code in FENCED or (classify_kafka_error(err) is ErrorClass.FATAL and "fenc" in text.lower()):
        return (f"{where}: producer with transactional.id {transactional_id!r} was fenced by "
                f"a newer instance (another run took over this pipeline and sink) while {doing}: "
                f"{text}. This run must stop; its transaction is aborted.")
    if code in LOGIN:
        return (f"{where}: authentication with the brokers failed while {doing}; check the "
                f"credentials and security settings of connection {conn_id!r} ({text})")
    if code in AUTH:
        return (f"{where}: not authorized while {doing} ({text}); grant the connection's "
                f"principal the needed ACLs")
    return None


__all__ = ["Fail", "Reports", "classify_kafka_error", "explain", "kafka_error_of", "missing_topic_message",
           "open_past", "timed_out_message", "too_large_message", "worst"]
