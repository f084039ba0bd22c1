"""Kafka sink (confluent-kafka / librdkafka).

Modes (docs/architecture.md, "Guarantees and what they rest on"):

* ``exactly_once: true``: one Kafka transaction per sub-batch, ``transactional.id``
  ``tidegate-{tenant}.{pipeline}.{sink_id}`` (stable, so opening a new run fences a zombie). The
  sub-batch's end position is written in the same transaction as a record in the compacted
  checkpoint topic (``checkpoint_topic``, default ``_tidegate_checkpoints``, key
  ``{pipeline}::sink::{sink_id}``, value a :class:`~tidegate.checkpoints.SinkCheckpoint`: the
  position and the store version it extends). :meth:`KafkaSink.committed_checkpoint` reads the
  last such record with ``read_committed``. Any error aborts the transaction.
* default: idempotent producer, ``acks=all`` (at-least-once; consumers dedup by the
  ``idempotency_key`` header).

Control messages go to the pipeline's control topic (``{pipeline}.__control``, or the sink's
``control``; created with one partition so they stay in order) inside the same transaction as
the data around them. An event the broker refuses on its own (larger than the topic's
``max.message.bytes``) or whose topic name is invalid is poison: with ``on_poison: halt`` the
sub-batch fails naming it and nothing of it is visible; with ``dlq`` the sub-batch is delivered
again with the event's dead-letter record in ``{pipeline}.__dlq`` (or the sink's ``dlq``) in its
place, in one transaction.

Every message: key = JSON of the primary key (``event.key_bytes``), partitioner
``murmur2_random`` (Java-compatible), headers ``idempotency_key``, ``op`` and ``table``
(``schema.table``), value = the envelope.

Errors (``classify_kafka_error``):

* retryable: local queue full, timeouts, broker/transport down, leader changes and every
  error librdkafka marks retriable;
* non-retryable: authentication/authorization failures, message too large, unknown topic
  (with ``create_topics: false``), invalid configuration;
* fatal: producer fenced by a newer instance of the same ``transactional.id``, and every
  error librdkafka marks fatal (the producer is unusable; the run must stop). A transaction
  open longer than ``transaction.timeout.ms`` is aborted by the broker, which fences the
  producer too: when the failed transaction had been open that long, the error says the
  transaction timed out (and names the setting) instead of "another run took over".

A broker certificate that fails verification and a refused SASL login show first in the error
callback (every client has one: producer, admin client, checkpoint reader); a metadata call only
sees a transport failure after its whole timeout. So metadata is asked for in short slices and
such a cause ends the call at once, as a non-retryable error naming the sink and the connection.

Connection: ``extra`` holds librdkafka properties verbatim (``bootstrap.servers``,
``security.protocol``, ``sasl.mechanism``, ``ssl.ca.location``, ...). Without
``bootstrap.servers`` the connection's host[:port] is used; a login/password become
``sasl.username``/``sasl.password`` (``sasl.mechanism`` PLAIN and ``security.protocol``
SASL_SSL unless the extras say otherwise). The producer, the admin client and the consumer that
reads the checkpoint topic back all get the same security settings. librdkafka checks the broker's
host name against its certificate by default (``ssl.endpoint.identification.algorithm=https``).
Secrets never reach logs or exceptions.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ...batching import SubBatch
from ...checkpoints import SinkCheckpoint
from ...connections import Connection
from ...debezium.envelope import DebeziumEncoder
from ...errors import (
    ErrorClass,
    NonRetryableSinkError,
    RetryableSinkError,
    SinkError,
    TimedOutTransactionError,
)
from ...filters import ColumnFilters
from ...positions import Position
from ...spec import PipelineSpec
from .._common import TemplateNames, secrets_of
from ..base import RetryPolicy, Sink, is_control
from .spec import KafkaSinkSpec

log = logging.getLogger(__name__)

DEFAULT_CHECKPOINT_TOPIC = "_tidegate_checkpoints"
OP_TIMEOUT_S = 30.0  # default for admin calls, init/abort of transactions, checkpoint reads
POLL_EVERY = 2000  # serve callbacks every N produced messages
_OP_HEADERS = {op: ("op", op.encode()) for op in ("c", "u", "d", "r")}  # one tuple per op, not per message
# Every client (producer, admin, checkpoint reader), under the connection's own settings. A new
# librdkafka client learns the brokers from its bootstrap connection, drops it, and waits
# reconnect.backoff.ms / 2 before connecting to a learned broker: 50 ms per client with the
# default 100 ms, 11 ms with 20 ms (later reconnects still back off up to
# reconnect.backoff.max.ms).
_CLIENT_DEFAULTS = {"reconnect.backoff.ms": 20}
TRANSACTION_TIMEOUT_MS = 120_000  # the producer's transaction.timeout.ms unless the connection sets it

# librdkafka properties that are the consumer's or the admin client's business only.
_PRODUCER_ONLY = {
    "acks", "enable.idempotence", "partitioner", "linger.ms", "queue.buffering.max.ms",
    "queue.buffering.max.messages", "queue.buffering.max.kbytes", "batch.num.messages",
    "batch.size", "compression.type", "compression.codec", "message.timeout.ms",
    "delivery.timeout.ms", "transactional.id", "transaction.timeout.ms", "retries",
    "message.send.max.retries", "delivery.report.only.error", "max.in.flight",
    "max.in.flight.requests.per.connection", "on_delivery", "request.required.acks",
    "enable.gapless.guarantee", "sticky.partitioning.linger.ms", "retry.backoff.ms",
}

_FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
           KafkaError.TRANSACTION_COORDINATOR_FENCED}
_AUTH = {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED,
         KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED,
         KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
         KafkaError._SSL}
_TOO_LARGE = {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_MSG_SIZE}
_PURGED = {KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT}
_UNKNOWN_TOPIC = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC,
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
_NON_RETRYABLE = _AUTH | _TOO_LARGE | _UNKNOWN_TOPIC | {
    KafkaError._INVALID_ARG, KafkaError.INVALID_CONFIG, KafkaError.INVALID_REPLICATION_FACTOR,
    KafkaError.INVALID_PARTITIONS, KafkaError.POLICY_VIOLATION, KafkaError.TOPIC_EXCEPTION,
    KafkaError.UNSUPPORTED_VERSION, KafkaError._UNSUPPORTED_FEATURE, KafkaError.INVALID_RECORD,
    KafkaError.INVALID_MSG}


def classify_kafka_error(err: KafkaError) -> ErrorClass:
    """The error class of a librdkafka error (see the module docstring)."""
    code = err.code()
    if code in _FENCED or err.fatal():
        return ErrorClass.FATAL
    if code in _NON_RETRYABLE:
        return ErrorClass.NON_RETRYABLE
    if code in _RETRYABLE or err.retriable():
        return ErrorClass.RETRYABLE
    if err.txn_requires_abort():  # abortable, no worse cause known: abort and try again
        return ErrorClass.RETRYABLE
    return ErrorClass.NON_RETRYABLE


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (as Java's ``Utils.murmur2``), unsigned 32-bit."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    rest, idx = length % 4, length & ~3
    if rest == 3:
        h ^= data[idx + 2] << 16
    if rest >= 2:
        h ^= data[idx + 1] << 8
    if rest >= 1:
        h ^= data[idx]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def murmur2_partition(key: bytes, partitions: int) -> int:
    """The partition Java clients (and librdkafka's ``murmur2_random``) pick for ``key``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def client_config(conn: Connection) -> dict[str, Any]:
    """librdkafka properties common to producer, consumer and admin client, from a connection."""
    cfg: dict[str, Any] = {}
    for k, v in (conn.extra or {}).items():
        if k.startswith("__") or k in ("conn_type", "extra"):
            continue
        cfg[k] = str(v).lower() if isinstance(v, bool) else v
    if "bootstrap.servers" not in cfg:
        if not conn.host:
            raise NonRetryableSinkError(
                f"Kafka connection {conn.conn_id!r} names no broker: set extra "
                f"'bootstrap.servers' (host:port[,host:port]) or the connection host")
        hosts = conn.host
        if conn.port and "," not in hosts and ":" not in hosts:
            hosts = f"{hosts}:{conn.port}"
        cfg["bootstrap.servers"] = hosts
    if conn.login and "sasl.username" not in cfg:
        cfg["sasl.username"] = conn.login
        if conn.password:
            cfg["sasl.password"] = conn.password
        cfg.setdefault("sasl.mechanism", "PLAIN")
        cfg.setdefault("security.protocol", "SASL_SSL")
    return cfg


class KafkaSink(Sink):
    kind = "kafka"
    label = "Kafka"
    retry_policy = RetryPolicy(base_s=0.1, max_s=10.0, attempts=3)
    op_timeout_s: float = OP_TIMEOUT_S  # admin calls, init/abort of transactions, checkpoint reads

    def __init__(self, pipeline: PipelineSpec, sink: KafkaSinkSpec, conn: Connection):
        base = client_config(conn)
        super().__init__(sink_id=sink.id, pipeline=pipeline.pipeline, tenant=pipeline.tenant,
                         required=sink.required, conn=conn,
                         secrets=secrets_of(conn, base), spec=sink)
        if not sink.topic and sink.envelope != "debezium":  # Debezium's envelope names its own topics
            raise NonRetryableSinkError(f"Kafka sink {sink.id!r} of pipeline {pipeline.pipeline!r} "
                                        f"has no topic template")
        self.spec = sink
        self.exactly_once = sink.exactly_once
        self.tombstones = sink.tombstones_on_delete
        # '.' appears in no tenant, pipeline or sink id: two tenants' ids can never coincide.
        self.transactional_id = f"tidegate-{self.tenant}.{self.pipeline}.{self.sink_id}"
        self.checkpoint_topic = sink.checkpoint_topic or DEFAULT_CHECKPOINT_TOPIC
        self._base = base
        self._topic_of = TemplateNames(sink.topic, self.pipeline)
        # envelope: debezium: Debezium's records instead of the tidegate envelope; the source's
        # catalog (column types) is asked for when the first event is encoded (use_source).
        self._source_info: Any = lambda: None
        self._debezium = (DebeziumEncoder(sink.debezium, self.pipeline, lambda: self._source_info(),
                                          excluded=_excluded_columns(pipeline))
                          if sink.envelope == "debezium" and sink.debezium is not None else None)
        if self._debezium is not None and not sink.topic:
            enc = self._debezium
            self._topic_of = lambda ev: enc.topic(ev.schema, ev.table)  # type: ignore[assignment]
        self._known_topics: set[str] = set()
        self._producer: Producer | None = None
        self._connected = False  # the producer has a connection to a broker it learned (_connect)
        self._admin: AdminClient | None = None
        self._delivery_errors: list[tuple[KafkaError, str, int, bytes | None]] = []
        self._client_errors: list[KafkaError] = []
        self._logged_codes: set[int] = set()
        self._fatal: SinkError | None = None
        self._needs_abort = False  # an abort that timed out must be retried before anything else
        self._uncertain = False  # a failed transaction may have committed: check before resending
        self._tx_began: float | None = None  # time.monotonic() at begin_transaction, while one is open
        self._ckpt_partitions: int | None = None
        self._refused: dict[str, str] = {}  # idempotency key -> why the broker refused the event
        # heartbeat_interval_ms: when the last heartbeat was written (read back from its topic
        # once, then kept), and the one queued in the delivery in progress
        self._last_heartbeat_ms: int | None = None
        self._heartbeat_queued: int | None = None

    def target_of(self, table: Any) -> str:
        return self._topic_of(table)

    def use_source(self, source_info: Any) -> None:
        """Where ``envelope: debezium`` reads the source's column types: a callable returning a
        :class:`~tidegate.debezium.envelope.SourceInfo` (asked once, on the first event)."""
        self._source_info = source_info

    # ------------------------------------------------------------------ config

    def producer_config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            **_CLIENT_DEFAULTS,
            "client.id": self.transactional_id,
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",
            # A sub-batch is produced in one go and flushed (commit_transaction, flush) at its
            # end, which sends at once whatever waits: the linger only groups records while it
            # is produced. 25 ms rather than 5: fuller batches, and the broker spent 0.1 s less
            # CPU per 200k changes (0.34-0.50 s against 0.45-0.76 s, a local broker).
            "linger.ms": 25,
            "compression.type": "lz4",
            # The broker's (or topic's) limit decides what is too large, not a 1 MB client default.
            "message.max.bytes": 16 * 1024 * 1024,
            "delivery.report.only.error": True,
        }
        if self.exactly_once:
            cfg["transactional.id"] = self.transactional_id
            cfg["transaction.timeout.ms"] = TRANSACTION_TIMEOUT_MS
        else:
            cfg["message.timeout.ms"] = 120_000
        cfg.update(self._base)
        cfg["on_delivery"] = self._on_delivery
        cfg["error_cb"] = self._on_error
        cfg["logger"] = logging.getLogger(__name__ + ".librdkafka")
        return cfg

    def _client_base(self) -> dict[str, Any]:
        """The connection's settings that are not the producer's, over :data:`_CLIENT_DEFAULTS`:
        the start of the admin client's and the checkpoint reader's configurations."""
        return {**_CLIENT_DEFAULTS, **{k: v for k, v in self._base.items() if k not in _PRODUCER_ONLY}}

    def _admin_config(self) -> dict[str, Any]:
        cfg = self._client_base()
        cfg["logger"] = logging.getLogger(__name__ + ".librdkafka")
        cfg["error_cb"] = self._on_error  # a refused certificate or login shows here first
        return cfg

    def _checkpoint_reader_config(self) -> dict[str, Any]:
        """The consumer that reads the checkpoint topic back: the connection's security settings
        (as the producer's and the admin client's), read_committed."""
        cfg = self._client_base()
        cfg.update({"group.id": f"tidegate-ckpt-{uuid.uuid4().hex}", "enable.auto.commit": False,
                    "isolation.level": "read_committed", "enable.partition.eof": True,
                    "auto.offset.reset": "earliest",
                    # The end of the partition shows as an empty fetch, which the broker holds
                    # for fetch.wait.max.ms (500 ms by default) per window read.
                    "fetch.wait.max.ms": 10,
                    "logger": logging.getLogger(__name__ + ".librdkafka"), "error_cb": self._on_error})
        return cfg

    @property
    def _timeout_s(self) -> float:
        key = "transaction.timeout.ms" if self.exactly_once else "message.timeout.ms"
        ms = self._base.get(key) or (120_000)
        return float(ms) / 1000.0 + 10.0

    # ------------------------------------------------------------------ callbacks

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self._delivery_errors.append((err, msg.topic(), len(msg), msg.key()))

    def _on_error(self, err: KafkaError) -> None:
        self._client_errors.append(err)
        # librdkafka reconnects every few ms and reports each refusal: say each kind once.
        level = logging.DEBUG if err.code() in self._logged_codes else logging.WARNING
        self._logged_codes.add(err.code())
        log.log(level, "Kafka sink %r: client error %s: %s", self.sink_id, err.name(), self.redact(err.str()))

    # ------------------------------------------------------------------ errors

    @staticmethod
    def _kafka_error_of(exc: BaseException) -> KafkaError | None:
        if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
            return exc.args[0]
        return None

    def classify_client_error(self, exc: BaseException) -> ErrorClass:
        err = self._kafka_error_of(exc)
        if err is not None:
            return classify_kafka_error(err)
        if isinstance(exc, BufferError):
            return ErrorClass.RETRYABLE
        return super().classify_client_error(exc)

    def describe_client_error(self, exc: BaseException) -> str:
        err = self._kafka_error_of(exc)
        return f"{err.name()}: {err.str()}" if err is not None else super().describe_client_error(exc)

    def error(self, exc: BaseException, doing: str) -> SinkError:
        """As :meth:`Sink.error`; a producer fenced by its own timed-out transaction is a
        :class:`TimedOutTransactionError` (a new attempt of the run can deliver it)."""
        err = super().error(exc, doing)
        if (err.error_class is ErrorClass.FATAL and self._kafka_error_of(exc) is not None
                and self._tx_open_past_timeout() is not None):
            return TimedOutTransactionError(str(err))
        return err

    def explain(self, exc: BaseException, text: str, doing: str) -> str | None:
        if isinstance(exc, BufferError):
            return f"{self.where}: local producer queue full while {doing}"
        err = self._kafka_error_of(exc)
        if err is None:
            return None
        code = err.code()
        fatal = classify_kafka_error(err) is ErrorClass.FATAL
        # A transaction open past its timeout was aborted by the broker, which fenced the
        # producer; the client then says "fenced", INVALID_TXN_STATE or INVALID_PRODUCER_EPOCH
        # (after a broker restart) although no other run may exist.
        timed_out = self._timed_out_transaction(text, doing) if fatal else None
        if timed_out is not None:
            return timed_out
        if code in _FENCED or (fatal and "fenc" in text.lower()):
            return (f"{self.where}: producer with transactional.id {self.transactional_id!r} was fenced by "
                    f"a newer instance (another run took over this pipeline and sink) while {doing}: "
                    f"{text}. This run must stop; its transaction is aborted.")
        if code in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._SSL):
            return (f"{self.where}: authentication with the brokers failed while {doing}; check the "
                    f"credentials and security settings of connection {self.conn.conn_id!r} ({text})")
        if code in _AUTH:
            return (f"{self.where}: not authorized while {doing} ({text}); grant the connection's "
                    f"principal the needed ACLs")
        return None

    @property
    def transaction_timeout_ms(self) -> int:
        """The producer's transaction.timeout.ms (the connection's extra, else the sink's default)."""
        return int(self._base.get("transaction.timeout.ms") or TRANSACTION_TIMEOUT_MS)

    def _timed_out_transaction(self, text: str, doing: str) -> str | None:
        """The message of a producer fenced because its own transaction outlived
        transaction.timeout.ms (a stalled process, a sub-batch too slow): the broker aborted the
        transaction and bumped the producer's epoch, which the producer then reads as "fenced by
        a newer instance" although no other run may exist. None when the open transaction is
        younger than the timeout (then another instance did fence it)."""
        open_s = self._tx_open_past_timeout()
        if open_s is None:
            return None
        timeout_ms = self.transaction_timeout_ms
        # What happened and the fix first: reports cut long messages.
        conn = self.conn.conn_id if self.conn is not None else "?"
        return (f"{self.where}: the transaction timed out: open {open_s:.1f}s, longer than "
                f"transaction.timeout.ms ({timeout_ms} ms), so the broker aborted it and fenced this "
                f"producer (a stalled run or a slow sub-batch, not necessarily another run; if sub-batches "
                f"take that long, raise transaction.timeout.ms in the extra of connection {conn!r}, at "
                f"most the broker's transaction.max.timeout.ms) while {doing}. None of it is visible to "
                f"read_committed consumers; a rerun delivers it again. The client said: {text}")

    def _tx_open_past_timeout(self) -> float | None:
        """Seconds the open transaction has been open, when that is at least
        transaction.timeout.ms; else None."""
        if self._tx_began is None:
            return None
        open_s = time.monotonic() - self._tx_began
        return open_s if open_s * 1000 >= self.transaction_timeout_ms else None

    def _error(self, err: KafkaError, doing: str) -> SinkError:
        """A SinkError for a librdkafka error object (from a callback or metadata)."""
        return self.error(KafkaException(err), doing)

    def _delivery_failure(self) -> SinkError | None:
        """The worst delivery error seen (fatal > non-retryable > retryable), as a SinkError."""
        if not self._delivery_errors:
            return None
        # Purged messages are a consequence (of an abort or a failed transaction), not a cause.
        causes = [e for e in self._delivery_errors if e[0].code() not in _PURGED] or self._delivery_errors
        err, topic, size, key = min(causes, key=lambda e: _RANK[classify_kafka_error(e[0])])
        n = len(self._delivery_errors)
        what = f"{n} message{'s' if n != 1 else ''} failed"
        if err.code() in _TOO_LARGE:
            return NonRetryableSinkError(
                f"Kafka sink {self.sink_id!r}: a message of {size} bytes for topic {topic!r} "
                f"(key {key.decode(errors='replace')[:200] if key else None}) is larger than the broker "
                f"accepts "
                f"({err.name()}); raise the topic's max.message.bytes (broker message.max.bytes) or "
                f"shrink the row. {what}.")
        if err.code() in _UNKNOWN_TOPIC:
            return self._missing_topic_error(topic)
        e = self._error(err, f"delivering to topic {topic!r}")
        return type(e)(f"{e} ({what})")

    def _client_failure(self) -> SinkError | None:
        """A client-level error that will not heal by waiting (authentication, fatal)."""
        for err in self._client_errors:
            if err.fatal() or err.code() in _AUTH:
                return self._error(err, "talking to the brokers")
        return None

    def _missing_topic_error(self, topic: str) -> SinkError:
        return NonRetryableSinkError(
            f"Kafka sink {self.sink_id!r} (pipeline {self.pipeline!r}): topic {topic!r} does not exist "
            f"and create_topics is false for this sink; create the topic or set create_topics: true")

    # ------------------------------------------------------------------ life cycle

    def _ensure_admin(self) -> None:
        if self._admin is None:
            try:
                self._admin = AdminClient(self._admin_config())
            except KafkaException as exc:
                raise self.error(exc, "creating the admin client") from None

    def open(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        self._ensure_admin()
        if self.exactly_once:
            self._ensure_checkpoint_topic()
        if self.spec.topic and "{" not in self._topic_of.template.replace("{pipeline}", ""):
            self._ensure_topics([self._topic_of.template.format(pipeline=self.pipeline)])
        if self._producer is None:
            try:
                p = Producer(self.producer_config())
            except KafkaException as exc:
                raise self.error(exc, "creating the producer") from None
            self._connected = False
            if self.exactly_once:
                try:
                    self._connect(p, self.checkpoint_topic)  # which exists by now
                    p.init_transactions(self.op_timeout_s)  # fences older instances, aborts their tx
                except KafkaException as exc:
                    err = self.error(exc, "initialising transactions")
                    if err.error_class is ErrorClass.FATAL:
                        self._fatal = err
                    raise err from None
            self._producer = p

    def _connect(self, p: Producer, topic: str) -> None:
        """Connect ``p`` to a broker it learned before it asks for its producer id (both modes
        have one). Asked while it has none (its bootstrap connection answered the first metadata
        request and was dropped, the learned broker not connected yet), a producer waits for its
        retry timer, 500 ms: an exactly-once producer's `init_transactions` in about one start
        in three, an idempotent producer's first delivery in every start (librdkafka 2.16,
        measured on a local broker). The first look-up of ``topic``, which exists, may be that
        bootstrap answer; the second goes to a learned broker, once connected (~15 ms for both)."""
        for _ in range(2):
            p.list_topics(topic, timeout=self.op_timeout_s)
        self._connected = True

    def _restart_producer(self) -> None:
        p, self._producer = self._producer, None
        if p is not None:
            try:
                p.abort_transaction(5)
            except Exception:  # noqa: BLE001, S110 - the new producer fences this one anyway
                pass
        self._needs_abort = False
        self.open()

    def close(self) -> None:
        p, self._producer = self._producer, None
        if p is not None:
            try:
                if self.exactly_once and self._needs_abort:
                    p.abort_transaction(5)
                else:
                    p.flush(5)
            except Exception:  # noqa: BLE001, S110 - close must not raise
                pass
        self._admin = None

    # ------------------------------------------------------------------ topics

    def _ensure_topics(self, topics: Iterable[str]) -> None:
        missing = [t for t in dict.fromkeys(topics) if t not in self._known_topics]
        if not missing:
            return
        assert self._admin is not None
        for t in missing:
            md = self._list_topics(t, f"looking up topic {t!r}")
            tm = md.topics.get(t)
            if tm is not None and tm.error is None:
                self._known_topics.add(t)
                continue
            if tm is not None and tm.error.code() not in _UNKNOWN_TOPIC:
                raise self._error(tm.error, f"looking up topic {t!r}")
            if not self.spec.create_topics:
                raise self._missing_topic_error(t)
            # One partition keeps the control channel in order (and the heartbeats, whose last
            # one is read back); every other topic as configured.
            heartbeats = self._debezium.heartbeat_topic if self._debezium is not None else None
            partitions = 1 if t in (self.control_name, heartbeats) else self.spec.partitions
            self._create_topic(t, partitions, self.spec.replication_factor, {})
            self._known_topics.add(t)

    def _list_topics(self, topic: str, doing: str) -> Any:
        """The metadata of one topic. A broker that refuses this client (its certificate failed
        verification, the SASL login was wrong) makes the metadata call fail only as a transport
        error, after the whole timeout; the error callback names the cause at once. So ask in
        short slices, and stop at a cause that waiting does not heal."""
        assert self._admin is not None
        self._client_errors.clear()  # only what this call meets counts
        deadline = time.monotonic() + self.op_timeout_s
        while True:
            try:
                return self._admin.list_topics(topic=topic,
                                               timeout=min(1.0, max(0.1, deadline - time.monotonic())))
            except KafkaException as exc:
                self._admin.poll(0)  # serves the error callback
                self._raise_client_failure()
                err = self._kafka_error_of(exc)
                if (err is not None and classify_kafka_error(err) is not ErrorClass.RETRYABLE) \
                        or time.monotonic() >= deadline:
                    raise self.error(exc, doing) from None

    def _create_topic(self, topic: str, partitions: int, replication: int, config: dict[str, str]) -> None:
        assert self._admin is not None
        t = self.op_timeout_s
        fut = self._admin.create_topics([NewTopic(topic, num_partitions=partitions,
                                                  replication_factor=replication, config=config)],
                                        operation_timeout=t, request_timeout=t)[topic]
        try:
            fut.result(timeout=self.op_timeout_s + 5)
            log.info("Kafka sink %r: created topic %r (partitions=%d, replication=%d%s)", self.sink_id,
                     topic, partitions, replication, f", {config}" if config else "")
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return
            e = self._error(err, f"creating topic {topic!r} (partitions={partitions}, "
                                 f"replication_factor={replication})")
            raise type(e)(f"{e}; check the sink's partitions / replication_factor settings") from None

    def _ensure_checkpoint_topic(self) -> None:
        t = self.checkpoint_topic
        if t in self._known_topics and self._ckpt_partitions:
            return
        md = self._list_topics(t, f"looking up checkpoint topic {t!r}")
        tm = md.topics.get(t)
        if tm is None or tm.error is not None:
            if tm is not None and tm.error.code() not in _UNKNOWN_TOPIC:
                raise self._error(tm.error, f"looking up checkpoint topic {t!r}")
            self._create_topic(t, 1, self.spec.replication_factor,
                               {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"})
            md = self._list_topics(t, f"looking up checkpoint topic {t!r}")
            tm = md.topics.get(t)
        self._ckpt_partitions = max(1, len(tm.partitions) if tm is not None else 1)
        self._known_topics.add(t)

    # ------------------------------------------------------------------ delivery

    def deliver(self, batch: SubBatch, extends: int | None = None) -> Position:
        if self._fatal is not None:
            raise self._fatal
        if self._producer is None:
            self.open()
        poison: dict = {}  # by idempotency key: (event, why)
        try:
            self._deliver_frames(batch, extends, poison)
        except SinkError:
            if not any(err.code() in _TOO_LARGE for err, *_ in self._delivery_errors):
                raise  # nothing the broker refused on its own
            rejected: dict = {}
            for chunk in batch.chunks():
                rejected.update(self._rejected_by_the_broker(chunk, self._topics_of(chunk)))
            if not rejected:
                raise
            self._check_poison(rejected)
            self._refused.update({k: why for k, (_, why) in rejected.items()})
            # Dead-letter what the broker refused and deliver the sub-batch again: in one
            # transaction (exactly-once), or only the dead letters (the rest is delivered).
            poison.update(rejected)
            if self.exactly_once:
                # A transaction that lost a message leaves the producer's sequence numbers in need
                # of a new epoch: a fresh producer (the same transactional.id) starts clean.
                self._restart_producer()
                self._deliver_frames(batch, extends, poison)
            else:
                again = [ev for ev, _ in rejected.values()]
                self._deliver_idempotent(again, self._topics_of(again), poison)
        self.dlq_count += len(poison)
        return batch.end_position

    def _topics_of(self, events: list) -> list[str]:
        return [self.control_name if is_control(ev) else self._topic_of(ev) for ev in events]

    def _prepare(self, events: list) -> tuple[list[str], dict]:
        """Each event's topic and the poison among them, by idempotency key: (event, why); what
        the broker refused in an earlier attempt stays poison when the coordinator retries the
        sub-batch. Their topics exist and the producer is connected when this returns."""
        topics = self._topics_of(events)
        refused = self._refused
        poison = {ev.idempotency_key: (ev, refused[ev.idempotency_key]) for ev in events
                  if ev.idempotency_key in refused} if refused else {}
        distinct = dict.fromkeys(topics)  # names are checked once each, not once per event
        if not all(_VALID_TOPIC.match(t) for t in distinct):
            poison.update({ev.idempotency_key: (ev, f"{t!r} is not a valid Kafka topic name")
                           for ev, t in zip(events, topics, strict=True) if not _VALID_TOPIC.match(t)})
        self._check_poison(poison)
        wanted = list(distinct) if not poison else [t for ev, t in zip(events, topics, strict=True)
                                                   if ev.idempotency_key not in poison]
        self._ensure_topics(wanted + ([self.dlq_name] if self.on_poison == "dlq" else []))
        if not self._connected and wanted:  # idempotent: before the first record (exactly-once: open)
            try:
                self._connect(self._producer, wanted[0])
            except KafkaException as exc:
                raise self.error(exc, "connecting the producer") from None
        return topics, poison

    def _deliver_frames(self, batch: SubBatch, extends: int | None, poison: dict) -> None:
        """The sub-batch frame by frame (one frame in memory, or a spilled transaction's frames
        read back from disk: tidegate/spill.py): one Kafka transaction with the checkpoint record
        when exactly-once (read_committed consumers see a source transaction whole or not at
        all), else flushed frame by frame. ``poison`` gains what each frame holds of it."""
        if not self.exactly_once:
            for chunk in batch.chunks():
                topics, found = self._prepare(chunk)
                poison.update(found)
                self._deliver_idempotent(chunk, topics, poison, heartbeat_at=batch.end_position)
            return

        def produce_all() -> None:
            for i, chunk in enumerate(batch.chunks()):
                topics, found = self._prepare(chunk)
                poison.update(found)
                self._produce_all(chunk, topics, poison, reset=i == 0)
            self._produce_heartbeat(batch.end_position)

        self._deliver_transaction(batch, produce_all, self.sink_record(batch, extends))

    def _check_poison(self, poison: dict) -> None:
        if poison and self.on_poison != "dlq":
            raise self.poison_error([ev for ev, _ in poison.values()],
                                    "; ".join(dict.fromkeys(why for _, why in poison.values())))

    def _rejected_by_the_broker(self, events: list, topics: list[str]) -> dict:
        """The events the broker refused on their own (too large for the topic): the failed
        delivery reports name a topic, a key and a size, which pick out the event."""
        refused = {(topic, key, size): err for err, topic, size, key in self._delivery_errors
                   if err.code() in _TOO_LARGE}
        why = ("the broker refused it ({}: larger than the topic's max.message.bytes / the broker's "
               "message.max.bytes)")
        out = {}
        for ev, topic in zip(events, topics, strict=True):
            err = refused.get((topic, ev.key_bytes, len(ev.value)))
            if err is not None:
                out[ev.idempotency_key] = (ev, why.format(err.name()))
        return out

    def _produce_all(self, events: list, topics: list[str], poison: dict | None = None,
                     heartbeat_at: Position | None = None, reset: bool = True) -> None:
        """Queue the records of ``events`` (and a heartbeat at ``heartbeat_at`` when one is due).
        ``reset=False``: a later frame of the same sub-batch (the envelope's transaction state
        carries on)."""
        p = self._producer
        assert p is not None
        produce, poll = p.produce, p.poll
        deadline = time.monotonic() + self._timeout_s
        table_hdr: dict[tuple[str, str], tuple[str, bytes]] = {}
        op_hdr = _OP_HEADERS
        if self._debezium is not None and reset:
            self._debezium.reset()  # a retried sub-batch starts its transactions afresh
        for i, (ev, topic) in enumerate(zip(events, topics, strict=True)):
            if poison and ev.idempotency_key in poison:
                value = self.dlq_record(ev, poison[ev.idempotency_key][1])
                topic = self.dlq_name
                headers = [("idempotency_key", ev.idempotency_key.encode()), ("dlq", b"1")]
            elif self._debezium is not None:
                self._produce_debezium(ev, topic, deadline)
                if i % POLL_EVERY == 0:
                    poll(0)
                    self._raise_client_failure()
                continue
            elif is_control(ev):
                value, headers = ev.value, [("idempotency_key", ev.idempotency_key.encode()),
                                            ("type", ev.type.encode())]
            else:
                tk = (ev.schema, ev.table)
                th = table_hdr.get(tk)
                if th is None:
                    th = table_hdr[tk] = ("table", f"{ev.schema}.{ev.table}".encode())
                op = ev.op
                value, headers = ev.value, [("idempotency_key", ev.idempotency_key.encode()),
                                            op_hdr.get(op) or ("op", op.encode()), th]
                if ev.headers:  # a primary-key change: each event names the other's key
                    headers += ev.headers.items()
            try:
                produce(topic, value, ev.key_bytes, headers=headers)
            except BufferError:  # local queue full: the slow path waits for deliveries
                self._produce(topic, value, ev.key_bytes, headers, deadline)
            if self.tombstones and ev.op == "d" and not is_control(ev) and topic != self.dlq_name:
                # same key, null value, right after the delete: compaction may drop the key
                self._produce(topic, None, ev.key_bytes,
                              [("idempotency_key", ev.idempotency_key.encode() + b"|tombstone")], deadline)
            if i % POLL_EVERY == 0:
                poll(0)
                self._raise_client_failure()
        if heartbeat_at is not None:
            self._produce_heartbeat(heartbeat_at)

    def _produce_debezium(self, item: Any, topic: str, deadline: float) -> None:
        """Debezium's records for one item: a change (and its tombstone, its transaction's BEGIN or
        END), or beside a control message a TRUNCATE's ``op: "t"`` or a DDL's schema change topic
        record; in the same transaction."""
        enc = self._debezium
        assert enc is not None
        if is_control(item):
            headers = [("idempotency_key", item.idempotency_key.encode()), ("type", item.type.encode())]
            self._produce(topic, item.value, item.key_bytes, headers, deadline)
            records = enc.truncate_records(item, self._topic_of)
            records += [r for r in [enc.schema_change_record(item)] if r is not None]
        else:
            records = enc.change_records(item, self._topic_of)
        self._ensure_topics([r.topic for r in records])
        for r in records:
            self._produce(r.topic, r.value, r.key, r.headers, deadline)

    def _produce(self, topic: str, value: bytes | None, key: bytes | None, headers: list, deadline: float
                 ) -> None:
        """Queue one record; while the local queue is full, serve delivery reports up to the
        deadline."""
        p = self._producer
        assert p is not None
        while True:
            try:
                p.produce(topic, value, key, headers=headers)
                return
            except BufferError:
                p.poll(0.05)
                self._raise_client_failure()
                if time.monotonic() > deadline:
                    raise RetryableSinkError(
                        f"Kafka sink {self.sink_id!r}: the local producer queue stayed full for "
                        f"{self._timeout_s:.0f}s (brokers slow or down)") from None

    def _serve_callbacks(self) -> None:
        try:
            if self._producer is not None:
                self._producer.poll(0)
        except Exception:  # noqa: BLE001, S110 - only collecting reports
            pass

    def _raise_client_failure(self) -> None:
        err = self._client_failure()
        if err is not None:
            raise err

    def _flush(self) -> None:
        p = self._producer
        assert p is not None
        deadline = time.monotonic() + self._timeout_s
        while True:
            left = p.flush(0.5)
            self._raise_client_failure()
            if left == 0:
                return
            if time.monotonic() > deadline:
                raise RetryableSinkError(f"Kafka sink {self.sink_id!r}: {left} messages not acknowledged "
                                         f"within {self._timeout_s:.0f}s (brokers slow or down)")

    def _deliver_idempotent(self, events: list, topics: list[str], poison: dict | None = None,
                            heartbeat_at: Position | None = None) -> None:
        self._delivery_errors.clear()
        self._client_errors.clear()
        self._heartbeat_queued = None
        try:
            self._produce_all(events, topics, poison, heartbeat_at)
            self._flush()
        except KafkaException as exc:
            raise self.error(exc, "producing") from None
        failure = self._delivery_failure()
        if failure is not None:
            raise failure
        self._heartbeat_written()

    # -- heartbeats (envelope: debezium, heartbeat_interval_ms)

    def heartbeat(self, position: Position) -> bool:
        """An idle run's heartbeat at ``position`` (its own transaction when exactly-once), if
        ``heartbeat_interval_ms`` has passed since the last one in the heartbeat topic."""
        if self._debezium is None or self.spec.heartbeat_interval_ms <= 0:
            return False
        if self._fatal is not None:
            raise self._fatal
        if self._producer is None:
            self.open()
        p = self._producer
        assert p is not None
        self._delivery_errors.clear()
        self._client_errors.clear()
        self._heartbeat_queued = None
        if not self.exactly_once:
            try:
                self._produce_heartbeat(position)
                self._flush()
            except KafkaException as exc:
                raise self.error(exc, "writing a heartbeat") from None
            failure = self._delivery_failure()
            if failure is not None:
                raise failure
            return self._heartbeat_written()
        if self._needs_abort:
            self._abort("retrying an earlier abort")
        if not self._heartbeat_due():
            return False
        try:
            p.begin_transaction()
        except KafkaException as exc:
            raise self._fail_tx(self.error(exc, "beginning a transaction"), abort=False) from None
        self._tx_began = time.monotonic()
        try:
            self._produce_heartbeat(position)
            self._commit_transaction()
        except Exception as exc:  # noqa: BLE001 - any error aborts the transaction
            raise self._fail_tx(self.error(exc, "writing a heartbeat"), abort=True) from None
        return self._heartbeat_written()

    def _heartbeat_due(self) -> int | None:
        """The time (ms) to write a heartbeat at, when one is due; None otherwise."""
        enc = self._debezium
        interval = self.spec.heartbeat_interval_ms
        if enc is None or interval <= 0:
            return None
        if self._last_heartbeat_ms is None:
            self._last_heartbeat_ms = self._read_last_heartbeat_ms()
        now = enc.clock() // 1_000_000
        return now if now - self._last_heartbeat_ms >= interval else None

    def _produce_heartbeat(self, position: Position) -> None:
        """Queue a heartbeat at ``position`` when one is due (:meth:`_heartbeat_written` records
        it once its transaction or flush succeeded)."""
        now = self._heartbeat_due()
        if now is None:
            return
        enc = self._debezium
        assert enc is not None
        r = enc.heartbeat_record(position)
        self._produce(r.topic, r.value, r.key, r.headers, time.monotonic() + self._timeout_s)
        self._heartbeat_queued = now

    def _heartbeat_written(self) -> bool:
        if self._heartbeat_queued is None:
            return False
        self._last_heartbeat_ms, self._heartbeat_queued = self._heartbeat_queued, None
        return True

    def _read_last_heartbeat_ms(self) -> int:
        """The ``ts_ms`` of the last committed heartbeat of this sink's prefix (0: none yet)."""
        enc = self._debezium
        assert enc is not None
        topic = enc.heartbeat_topic
        self._ensure_admin()
        self._ensure_topics([topic])
        key = enc.heartbeat_record(None).key or b""
        try:
            c = Consumer(self._checkpoint_reader_config())
        except KafkaException as exc:
            raise self.error(exc, "creating the heartbeat reader") from None
        try:
            low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=self.op_timeout_s)
            raw = self._scan(c, topic, 0, max(low, high - 64), key) if high > low else None
        except KafkaException as exc:
            self._raise_client_failure()
            raise self.error(exc, f"reading heartbeat topic {topic!r}") from None
        finally:
            c.close()
        if raw is None:
            return 0
        value = orjson.loads(raw)
        return int((value.get("payload") or value)["ts_ms"]) if isinstance(value, dict) else 0

    # -- exactly once

    def _deliver_transaction(self, batch: SubBatch, produce: Callable[[], None], record: SinkCheckpoint
                             ) -> None:
        """One Kafka transaction: what ``produce`` queues, then the checkpoint record."""
        p = self._producer
        assert p is not None
        if self._needs_abort:
            self._abort("retrying an earlier abort")
        if self._uncertain:
            # An earlier attempt failed at a point where the commit may have gone through.
            done = self.committed_checkpoint()
            self._uncertain = False
            if done is not None and done.extends == record.extends and done.position >= batch.end_position:
                log.info("Kafka sink %r: sub-batch %d (to %s) was already committed by an earlier attempt",
                         self.sink_id, batch.seq, batch.end_position)
                return
        self._delivery_errors.clear()
        self._client_errors.clear()
        self._heartbeat_queued = None
        try:
            p.begin_transaction()
        except KafkaException as exc:
            raise self._fail_tx(self.error(exc, "beginning a transaction"), abort=False) from None
        self._tx_began = time.monotonic()
        try:
            produce()
            self._produce_checkpoint(record)
            self._commit_transaction()
            self._heartbeat_written()
        except BaseException as exc:  # noqa: BLE001 - any error aborts the transaction
            if not isinstance(exc, Exception):  # KeyboardInterrupt & co: abort, then re-raise as is
                self._abort_quietly()
                raise
            raise self._fail_tx(self.error(exc, "delivering a transaction"), abort=True) from None

    def _produce_checkpoint(self, record: SinkCheckpoint) -> None:
        p = self._producer
        assert p is not None
        key = self.checkpoint_key.encode()
        part = murmur2_partition(key, self._ckpt_partitions or 1)
        p.produce(self.checkpoint_topic, record.dumps().encode(), key, partition=part)

    def _commit_transaction(self) -> None:
        p = self._producer
        assert p is not None
        try:
            p.commit_transaction(self._timeout_s)
        except KafkaException as exc:
            err = exc.args[0]
            if err.retriable() and not err.txn_requires_abort() and not err.fatal():
                self._uncertain = True
                p.commit_transaction(self._timeout_s)  # librdkafka: retry the commit once
                self._uncertain = False
                self._tx_began = None
                return
            raise
        # Committed: every message of the transaction was delivered (a failed message fails the
        # commit). Reports still arriving belong to earlier, aborted transactions (purged).
        self._delivery_errors.clear()
        self._tx_began = None

    def _fail_tx(self, failure: SinkError, *, abort: bool) -> SinkError:
        """Abort the failed transaction and pick the error to raise: the worst of the call's error
        and the delivery reports (which name the cause, e.g. the message that was too large)."""
        if failure.error_class is ErrorClass.FATAL:
            self._fatal = failure
            self._abort_quietly()
            return failure
        abort_err: SinkError | None = None
        if abort:
            try:
                self._abort("after a failed transaction")  # also serves the remaining reports
            except SinkError as exc:
                abort_err = exc
        self._serve_callbacks()
        failure = _worst(failure, self._delivery_failure())
        if abort_err is not None:
            if abort_err.error_class is ErrorClass.FATAL:
                self._fatal = abort_err
                return abort_err
            self._needs_abort = True
        if failure.error_class is ErrorClass.FATAL:
            self._fatal = failure
        self._uncertain = True
        return failure

    def _abort(self, why: str) -> None:
        p = self._producer
        assert p is not None
        try:
            p.abort_transaction(self.op_timeout_s)
            self._needs_abort = False
            self._tx_began = None
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() == KafkaError._STATE:  # no transaction in progress: nothing to abort
                self._needs_abort = False
                return
            raise self.error(exc, f"aborting a transaction {why}") from None

    def _abort_quietly(self) -> None:
        try:
            if self._producer is not None:
                self._producer.abort_transaction(5)
        except Exception:  # noqa: BLE001, S110 - the producer is unusable anyway
            pass

    # ------------------------------------------------------------------ sink-side checkpoint

    def committed_checkpoint(self) -> SinkCheckpoint | None:
        """The last committed checkpoint record of this sink (exactly-once mode); None in
        idempotent mode or when there is none. Needs no producer, so reading it fences nobody."""
        if not self.exactly_once:
            return None
        if self._fatal is not None:
            raise self._fatal
        self._ensure_admin()
        self._ensure_checkpoint_topic()
        raw = self._read_last_checkpoint()
        return SinkCheckpoint.loads(raw) if raw else None

    def _read_last_checkpoint(self) -> bytes | None:
        key = self.checkpoint_key.encode()
        part = murmur2_partition(key, self._ckpt_partitions or 1)
        try:
            c = Consumer(self._checkpoint_reader_config())
        except KafkaException as exc:
            raise self.error(exc, "creating the checkpoint reader") from None
        try:
            tp = TopicPartition(self.checkpoint_topic, part)
            low, high = c.get_watermark_offsets(tp, timeout=self.op_timeout_s)
            if high <= low:
                return None
            window = 512
            while True:
                start = max(low, high - window)
                found = self._scan(c, self.checkpoint_topic, part, start, key)
                if found is not None or start == low:
                    return found
                window *= 16
        except KafkaException as exc:
            self._raise_client_failure()  # a refused certificate or login, named by the callback
            raise self.error(exc, f"reading checkpoint topic {self.checkpoint_topic!r}") from None
        finally:
            c.close()

    def _scan(self, c: Consumer, topic: str, part: int, start: int, key: bytes) -> bytes | None:
        """The value of the last committed record with ``key`` in ``topic``'s partition ``part``
        from offset ``start`` on (None: none)."""
        c.assign([TopicPartition(topic, part, start)])
        last = None
        deadline = time.monotonic() + self.op_timeout_s
        while True:
            if time.monotonic() > deadline:
                raise RetryableSinkError(
                    f"Kafka sink {self.sink_id!r}: could not read topic "
                    f"{topic!r} to its end within {self.op_timeout_s:.0f}s (an open "
                    f"transaction of another producer holds the last stable offset)")
            msg = c.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return last
                raise KafkaException(msg.error())
            if msg.key() == key:
                last = msg.value()


_VALID_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_RANK = {ErrorClass.FATAL: 0, ErrorClass.NON_RETRYABLE: 1, ErrorClass.RETRYABLE: 2}


def _excluded_columns(pipeline: PipelineSpec) -> Any:
    """(db, table) -> the columns ``source.columns`` excludes there (none without rules)."""
    filters = ColumnFilters.of(pipeline.source.columns, b"")

    def excluded(db: str, table: str) -> frozenset[str]:
        tr = filters.for_table(db, table) if filters is not None else None
        return tr.excluded if tr is not None else frozenset()
    return excluded


def _worst(a: SinkError, b: SinkError | None) -> SinkError:
    """The more severe of two failures; on a tie the delivery error ``b`` (it names the cause)."""
    if b is None:
        return a
    return a if _RANK[a.error_class] < _RANK[b.error_class] else b


__all__ = ["KafkaSink", "classify_kafka_error", "client_config", "murmur2", "murmur2_partition",
           "DEFAULT_CHECKPOINT_TOPIC"]
