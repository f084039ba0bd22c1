"""Kafka sink (confluent-kafka / librdkafka).

Modes (docs/architecture.md, "Guarantees and what they rest on"):

* ``exactly_once: true``: one Kafka transaction per sub-batch, ``transactional.id``
  ``tidegate-{tenant}.{pipeline}.{sink_id}`` (stable, so opening a new run fences a zombie). The
  sub-batch's end position is written in the same transaction as a record in the compacted
  checkpoint topic (``checkpoint_topic``, default ``_tidegate_checkpoints``, key
  ``{pipeline}::sink::{sink_id}``, value a :class:`~tidegate.sink_checkpoints.SinkCheckpoint`: the
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

Errors (``errors.classify_kafka_error``):

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

The sink's parts, one role each: ``client.py`` (the clients' settings), ``errors.py`` (error
classes, callback reports, messages), ``topics.py`` (look-up and creation), ``writer.py`` (the
producer and the records of a frame), ``readback.py`` (the last committed record with a key),
``heartbeats.py`` (``envelope: debezium``'s heartbeats), ``partition.py`` (murmur2). The
envelope's encoder (Debezium's records) and the parser of its spec fields come from the kind
(``sinks/kafka/__init__.py``), so this package never imports ``debezium/``.
"""


from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from ...batching import SubBatch
from ...connections import Connection
from ...errors import ErrorClass, NonRetryableSinkError, SinkError, TimedOutTransactionError
from ...positions import Position
from ...sink_checkpoints import SinkCheckpoint
from ...spec import PipelineSpec
from .._common import TemplateNames, secrets_of
from ..base import RetryPolicy, Sink, is_control
from . import errors
from .client import ClientSettings, client_config
from .heartbeats import Heartbeats
from .partition import murmur2_partition
from .readback import LastRecord
from .spec import KafkaSinkSpec
from .topics import Topics
from .writer import RecordWriter

log = logging.getLogger(__name__)

DEFAULT_CHECKPOINT_TOPIC = "_tidegate_checkpoints"
_VALID_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
# (pipeline spec, sink spec, source info) -> the sink's record encoder, or None for the tidegate
# envelope (the kind's ``envelope`` hook: tidegate.debezium.envelope.encoder_for)
EnvelopeFactory = Callable[[PipelineSpec, KafkaSinkSpec, Callable[[], Any]], Any]


class KafkaSink(Sink):
    kind = "kafka"
    label = "Kafka"
    retry_policy = RetryPolicy(base_s=0.1, max_s=10.0, attempts=3)

    def __init__(self, pipeline: PipelineSpec, sink: KafkaSinkSpec, conn: Connection,
                 envelope: EnvelopeFactory | None = None):
        base = client_config(conn)
        super().__init__(sink_id=sink.id, pipeline=pipeline.pipeline, tenant=pipeline.tenant,
                         required=sink.required, conn=conn, secrets=secrets_of(conn, base), spec=sink)
        if not sink.topic and sink.envelope != "debezium":  # Debezium's envelope names its own topics
            raise NonRetryableSinkError(f"Kafka sink {sink.id!r} of pipeline {pipeline.pipeline!r} "
                                        f"has no topic template")
        self.spec = sink
        self.exactly_once = sink.exactly_once
        # An idempotent producer is fenced by nothing: a zombie's records would land (campaign
        # KAFKA=idempotent, seed 6225); the coordinator checks the lease before each sub-batch.
        self.fences_zombies = self.keeps_record = self.exactly_once  # idempotent: no record, no fencing
        # '.' appears in no tenant, pipeline or sink id: two tenants' ids can never coincide.
        self.transactional_id = f"tidegate-{self.tenant}.{self.pipeline}.{self.sink_id}"
        self.checkpoint_topic = sink.checkpoint_topic or DEFAULT_CHECKPOINT_TOPIC
        # envelope: debezium: Debezium's records instead of the tidegate envelope; the source's
        # catalog (column types) is asked for when the first event is encoded (use_run).
        self._source_info: Any = lambda: None
        self.encoder = self._encoder(pipeline, envelope)
        self._topic_of = TemplateNames(sink.topic, self.pipeline) if sink.topic else (
            lambda ev: self.encoder.topic(ev.schema, ev.table))
        self.reports = errors.Reports(self.sink_id, self.redact)
        self.settings = ClientSettings(base, self.transactional_id, self.exactly_once,
                                       self.reports.on_delivery, self.reports.on_error)
        hb_topic = self.encoder.heartbeat_topic if self.encoder is not None else None
        self.topics = Topics(self.settings, sink, self.pipeline, self.reports, self.error,
                             single=(self.control_name, hb_topic))
        self.last = LastRecord(self.settings, self.reports, self.error, self.sink_id)
        self.heartbeats = Heartbeats(self.encoder, sink.heartbeat_interval_ms, self.topics, self.last)
        self.writer = RecordWriter(self.settings, self.reports, self.error, self.topics,
                                   tombstones=sink.tombstones_on_delete, dlq_name=self.dlq_name,
                                   dlq_record=self.dlq_record, encoder=self.encoder, topic_of=self._topic_of)
        self._fatal: SinkError | None = None
        self._needs_abort = False  # an abort that timed out must be retried before anything else
        self._uncertain = False  # a failed transaction may have committed: check before resending
        self._tx_began: float | None = None  # time.monotonic() at begin_transaction, while one is open
        self._refused: dict[str, str] = {}  # idempotency key -> why the broker refused the event

    def _encoder(self, pipeline: PipelineSpec, envelope: EnvelopeFactory | None) -> Any:
        if envelope is None:
            if self.spec.envelope == "debezium":
                raise NonRetryableSinkError(
                    f"Kafka sink {self.sink_id!r} of pipeline {self.pipeline!r} has envelope: debezium but "
                    f"was built without its encoder; build it through tidegate.sinks.make_sink")
            return None
        return envelope(pipeline, self.spec, lambda: self._source_info())

    def target_of(self, table: Any) -> str:
        return self._topic_of(table)

    def use_run(self, *, column_types: Any, spark: Any) -> None:
        """``envelope: debezium`` reads the source's column types through ``column_types``, a
        callable returning a :class:`~tidegate.debezium.envelope.SourceInfo` (asked once, on the
        first event)."""
        self._source_info = column_types

    # ------------------------------------------------------------------ errors

    def classify_client_error(self, exc: BaseException) -> ErrorClass:
        err = errors.kafka_error_of(exc)
        if err is not None:
            return errors.classify_kafka_error(err)
        if isinstance(exc, BufferError):
            return ErrorClass.RETRYABLE
        return super().classify_client_error(exc)

    def describe_client_error(self, exc: BaseException) -> str:
        err = errors.kafka_error_of(exc)
        return f"{err.name()}: {err.str()}" if err is not None else super().describe_client_error(exc)

    def error(self, exc: BaseException, doing: str) -> SinkError:
        """As :meth:`Sink.error`; a producer fenced by its own timed-out transaction is a
        :class:`TimedOutTransactionError` (a new attempt of the run can deliver it)."""
        err = super().error(exc, doing)
        if (err.error_class is ErrorClass.FATAL and errors.kafka_error_of(exc) is not None
                and errors.open_past(self._tx_began, self.settings.transaction_timeout_ms) is not None):
            return TimedOutTransactionError(str(err))
        return err

    def explain(self, exc: BaseException, text: str, doing: str) -> str | None:
        if isinstance(exc, BufferError):
            return f"{self.where}: local producer queue full while {doing}"
        err = errors.kafka_error_of(exc)
        if err is None:
            return None
        conn = self.conn.conn_id if self.conn is not None else "?"
        # A transaction open past its timeout was aborted by the broker, which fenced the
        # producer; the client then says "fenced", INVALID_TXN_STATE or INVALID_PRODUCER_EPOCH
        # (after a broker restart) although no other run may exist.
        timeout_ms = self.settings.transaction_timeout_ms
        open_s = errors.open_past(self._tx_began, timeout_ms)
        if open_s is not None and errors.classify_kafka_error(err) is ErrorClass.FATAL:
            return errors.timed_out_message(self.where, open_s, timeout_ms, conn, text, doing)
        return errors.explain(err, text, doing, where=self.where, transactional_id=self.transactional_id,
                              conn_id=conn)

    def _delivery_failure(self) -> SinkError | None:
        """The worst delivery error reported (fatal > non-retryable > retryable), as a SinkError."""
        worst = self.reports.worst_delivery()
        if worst is None:
            return None
        err, topic, size, key = worst
        n = len(self.reports.delivery)
        what = f"{n} message{'s' if n != 1 else ''} failed"
        if err.code() in errors.TOO_LARGE:
            return NonRetryableSinkError(errors.too_large_message(self.sink_id, err, topic, size, key, what))
        if err.code() in errors.UNKNOWN_TOPIC:
            return self.topics.missing(topic)
        e = self.error(KafkaException(err), f"delivering to topic {topic!r}")
        return type(e)(f"{e} ({what})")

    # ------------------------------------------------------------------ life cycle

    def open(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        self.topics.open_admin()
        if self.exactly_once:
            self.topics.ensure_checkpoint(self.checkpoint_topic)
        template = self.spec.topic
        if template and "{" not in template.replace("{pipeline}", ""):
            self.topics.ensure([template.format(pipeline=self.pipeline)])
        if self.writer.producer is not None:
            return
        p = self.writer.start()
        if self.exactly_once:
            try:
                self.writer.connect(self.checkpoint_topic)  # which exists by now
                p.init_transactions(self.settings.op_timeout_s)  # fences older instances, aborts their tx
            except KafkaException as exc:
                self.writer.stop()
                err = self.error(exc, "initialising transactions")
                if err.error_class is ErrorClass.FATAL:
                    self._fatal = err
                raise err from None

    def _restart_producer(self) -> None:
        self._drop_producer()
        self.open()

    def _drop_producer(self) -> None:
        self.writer.drop()
        self._needs_abort = False
        self._tx_began = None

    def close(self) -> None:
        p = self.writer.stop()
        if p is not None:
            try:
                if self.exactly_once and self._needs_abort:
                    p.abort_transaction(5)
                else:
                    p.flush(5)
            except Exception:  # noqa: BLE001, S110 - close must not raise
                pass
        self.topics.close()

    # ------------------------------------------------------------------ delivery

    def deliver(self, batch: SubBatch, extends: int | None = None) -> Position:
        if self._fatal is not None:
            raise self._fatal
        if self.writer.producer is None:
            self.open()
        poison: dict = {}  # by idempotency key: (event, why)
        while True:
            try:
                self._deliver_frames(batch, extends, poison)
                break
            except SinkError:
                rejected = self.reports.new_refusals(batch.chunks(), self._topics_of, poison)
                if not rejected:
                    raise  # nothing (new) the broker refused on its own
            if self.exactly_once:
                # A transaction that lost a message leaves the producer's sequence numbers in need
                # of a new epoch. Kept, it fails the next transaction (OUT_OF_ORDER_SEQUENCE_NUMBER
                # for the refused transaction's later records); its abort waits until
                # transaction.timeout.ms (_fail_tx left it unended). A fresh producer (the same
                # transactional.id) starts clean, whether the sub-batch is sent again or the run halts.
                self._restart_producer()
            self.halt_on_poison(rejected.values())
            self._refused.update({k: why for k, (_, why) in rejected.items()})
            poison.update(rejected)
            if not self.exactly_once:  # the rest is delivered: only the dead letters now
                again = [ev for ev, _ in rejected.values()]
                self._deliver_idempotent(again, self._topics_of(again), poison)
                break
            # Exactly-once: the sub-batch again with its dead letters, in one transaction. A
            # transaction ends at its first refusal (RecordWriter.await_delivery), so a sub-batch with several
            # such messages takes a round for each one not yet known.
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
        self.halt_on_poison(poison.values())
        wanted = list(distinct) if not poison else [t for ev, t in zip(events, topics, strict=True)
                                                   if ev.idempotency_key not in poison]
        self.topics.ensure(wanted + ([self.dlq_name] if self.on_poison == "dlq" else []))
        if not self.writer.connected and wanted:  # idempotent: before the first record (exactly-once: open)
            try:
                self.writer.connect(wanted[0])
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
                self.writer.write(chunk, topics, poison, reset=i == 0)
            self.heartbeats.queue(batch.end_position, self.writer.put_record)

        self._deliver_transaction(batch, produce_all, self.sink_record(batch, extends))

    def _deliver_idempotent(self, events: list, topics: list[str], poison: dict | None = None,
                            heartbeat_at: Position | None = None, doing: str = "producing") -> bool:
        """``events`` (and a heartbeat at ``heartbeat_at``, when one is due), flushed; True when a
        heartbeat was written."""
        self.reports.clear()
        self.heartbeats.queued = None
        try:
            self.writer.write(events, topics, poison)
            if heartbeat_at is not None:
                self.heartbeats.queue(heartbeat_at, self.writer.put_record)
            self.writer.flush()
        except KafkaException as exc:
            raise self.error(exc, doing) from None
        failure = self._delivery_failure()
        if failure is not None:
            raise failure
        return self.heartbeats.written()

    def heartbeat(self, position: Position) -> bool:
        """An idle run's heartbeat at ``position`` (its own transaction when exactly-once), if
        ``heartbeat_interval_ms`` has passed since the last one in the heartbeat topic."""
        if not self.heartbeats.kept:
            return False
        if self._fatal is not None:
            raise self._fatal
        if self.writer.producer is None:
            self.open()
        if not self.exactly_once:
            return self._deliver_idempotent([], [], heartbeat_at=position, doing="writing a heartbeat")
        if self._needs_abort:
            self._abort("retrying an earlier abort")
        if self.heartbeats.due() is None:
            return False
        self._transaction(lambda: self.heartbeats.queue(position, self.writer.put_record),
                          "writing a heartbeat")
        return self.heartbeats.written()

    # ------------------------------------------------------------------ exactly once

    def _deliver_transaction(self, batch: SubBatch, produce: Callable[[], None], record: SinkCheckpoint
                             ) -> None:
        """One Kafka transaction: what ``produce`` queues, then the checkpoint record."""
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
        key = self.checkpoint_key.encode()

        def with_checkpoint() -> None:
            produce()
            part = murmur2_partition(key, self.topics.checkpoint_partitions or 1)
            self.writer.producer.produce(self.checkpoint_topic, record.dumps().encode(), key, partition=part)

        self._transaction(with_checkpoint, "delivering a transaction")
        self.heartbeats.written()

    def _transaction(self, produce: Callable[[], None], doing: str) -> None:
        """One Kafka transaction of what ``produce`` queues; any error aborts it."""
        p = self.writer.producer
        assert p is not None
        self.reports.clear()
        self.heartbeats.queued = None
        try:
            p.begin_transaction()
        except KafkaException as exc:
            raise self._fail_tx(self.error(exc, "beginning a transaction"), abort=False) from None
        self._tx_began = time.monotonic()
        try:
            produce()
            self._commit_transaction()
        except BaseException as exc:  # noqa: BLE001 - any error aborts the transaction
            if not isinstance(exc, Exception):  # KeyboardInterrupt & co: abort, then re-raise as is
                self.writer.abort_quietly()
                raise
            raise self._fail_tx(self.error(exc, doing), abort=True) from None

    def _commit_transaction(self) -> None:
        p = self.writer.producer
        assert p is not None
        timeout = self.settings.delivery_timeout_s
        deadline = time.monotonic() + timeout
        self.writer.await_delivery(deadline)
        if self.reports.too_large():
            raise self._delivery_failure()  # not committed: the caller leaves the transaction
        try:
            p.commit_transaction(max(1.0, deadline - time.monotonic()))  # one wait in all, not two
        except KafkaException as exc:
            err = exc.args[0]
            if err.retriable() and not err.txn_requires_abort() and not err.fatal():
                self._uncertain = True
                p.commit_transaction(timeout)  # librdkafka: retry the commit once
                self._uncertain = False
                self._tx_began = None
                return
            raise
        # Committed: every message of the transaction was delivered (a failed message fails the
        # commit). Reports still arriving belong to earlier, aborted transactions (purged).
        self.reports.delivery.clear()
        self.reports.refused_events.clear()
        self._tx_began = None

    def _fail_tx(self, failure: SinkError, *, abort: bool) -> SinkError:
        """Abort the failed transaction and pick the error to raise: the worst of the call's error
        and the delivery reports (which name the cause, e.g. the message that was too large)."""
        if failure.error_class is ErrorClass.FATAL:
            self._fatal = failure
            self.writer.abort_quietly()
            return failure
        abort_err: SinkError | None = None
        if abort and self.reports.too_large():
            self._drop_producer()  # its abort would wait out transaction.timeout.ms (await_delivery)
        elif abort:
            try:
                self._abort("after a failed transaction")  # also serves the remaining reports
            except SinkError as exc:
                abort_err = exc
        self.writer.serve()
        failure = errors.worst(failure, self._delivery_failure())
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
        p = self.writer.producer
        assert p is not None
        try:
            p.abort_transaction(self.settings.op_timeout_s)
            self._needs_abort = False
            self._tx_began = None
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError._STATE:  # no transaction in progress: nothing to abort
                self._needs_abort = False
                return
            raise self.error(exc, f"aborting a transaction {why}") from None

    def committed_checkpoint(self) -> SinkCheckpoint | None:
        """The last committed checkpoint record of this sink (exactly-once mode); None in
        idempotent mode or when there is none. Needs no producer, so reading it fences nobody."""
        if not self.exactly_once:
            return None
        if self._fatal is not None:
            raise self._fatal
        partitions = self.topics.ensure_checkpoint(self.checkpoint_topic)
        key = self.checkpoint_key.encode()
        raw = self.last.read(self.checkpoint_topic, murmur2_partition(key, partitions), key, "checkpoint")
        return SinkCheckpoint.loads(raw) if raw else None


__all__ = ["DEFAULT_CHECKPOINT_TOPIC", "KafkaSink"]
