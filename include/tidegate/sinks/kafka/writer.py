"""The producer's side of the Kafka sink: one producer, and the records of a frame of events
queued on it (headers, keys, tombstones, dead letters, Debezium's records), then flushed. The
loop in :meth:`RecordWriter.write` is the sink's hot path: it reads each event's ready bytes."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException, Producer

from ...errors import RetryableSinkError
from ..base import is_control
from .client import ClientSettings
from .errors import Fail, Reports
from .topics import Topics

POLL_EVERY = 2000  # serve callbacks every N produced messages
_OP_HEADERS = {op: ("op", op.encode()) for op in ("c", "u", "d", "r")}  # one tuple per op, not per message


@dataclasses.dataclass(eq=False, repr=False)  # repr: the default; the fields hold connection settings
class RecordWriter:
    """``dlq_record(event, why)`` is the dead letter's value; ``encoder`` Debezium's records
    (None: the tidegate envelope, the event's own bytes); ``topic_of`` an event's topic."""

    settings: ClientSettings
    reports: Reports
    fail: Fail
    topics: Topics
    _: dataclasses.KW_ONLY
    tombstones: bool
    dlq_name: str
    dlq_record: Callable[[Any, str], bytes]
    encoder: Any
    topic_of: Callable[[Any], str]
    producer: Producer | None = dataclasses.field(default=None, init=False)
    # the producer has a connection to a broker it learned (connect)
    connected: bool = dataclasses.field(default=False, init=False)

    def start(self) -> Producer:
        try:
            self.producer = Producer(self.settings.producer())
        except KafkaException as exc:
            raise self.fail(exc, "creating the producer") from None
        self.connected = False
        return self.producer

    def connect(self, topic: str) -> None:
        """Connect the producer to a broker it learned before it asks for its producer id (both
        modes have one). Asked while it has none (its bootstrap connection answered the first
        metadata request and was dropped, the learned broker not connected yet), a producer
        waits for its retry timer, 500 ms: an exactly-once producer's `init_transactions` in
        about one start in three, an idempotent producer's first delivery in every start
        (librdkafka 2.16, measured on a local broker). The first look-up of ``topic``, which
        exists, may be that bootstrap answer; the second goes to a learned broker, once
        connected (~15 ms for both)."""
        assert self.producer is not None
        for _ in range(2):
            self.producer.list_topics(topic, timeout=self.settings.op_timeout_s)
        self.connected = True

    def deadline(self) -> float:
        return time.monotonic() + self.settings.delivery_timeout_s

    def write(self, events: list, topics: list[str], poison: dict | None = None, reset: bool = True) -> None:
        """Queue the records of ``events``. ``reset=False``: a later frame of the same sub-batch
        (the Debezium envelope's transaction state carries on)."""
        p = self.producer
        assert p is not None
        produce, poll = p.produce, p.poll
        deadline = self.deadline()
        table_hdr: dict[tuple[str, str], tuple[str, bytes]] = {}
        op_hdr = _OP_HEADERS
        if self.encoder is not None and reset:
            self.encoder.reset()  # a retried sub-batch starts its transactions afresh
        for i, (ev, topic) in enumerate(zip(events, topics, strict=True)):
            if poison and ev.idempotency_key in poison:
                value = self.dlq_record(ev, poison[ev.idempotency_key][1])
                topic = self.dlq_name
                headers = [("idempotency_key", ev.idempotency_key.encode()), ("dlq", b"1")]
                if self.encoder is not None:  # and the END of the transaction it ends, if one is open
                    self.put(topic, value, ev.key_bytes, headers, deadline)
                    for r in self.encoder.dead_lettered(ev):
                        self.put(r.topic, r.value, r.key, r.headers, deadline)
                    continue
            elif self.encoder is not None:
                self._write_debezium(ev, topic, deadline)
                if i % POLL_EVERY == 0:
                    poll(0)
                    self.raise_lasting()
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
                self.put(topic, value, ev.key_bytes, headers, deadline)
            except KafkaException as exc:
                if not self.reports.refused_here(exc, topic, value, ev.key_bytes):
                    raise
            if self.tombstones and ev.op == "d" and not is_control(ev) and topic != self.dlq_name:
                # same key, null value, right after the delete: compaction may drop the key
                self.put(topic, None, ev.key_bytes,
                         [("idempotency_key", ev.idempotency_key.encode() + b"|tombstone")], deadline)
            if i % POLL_EVERY == 0:
                poll(0)
                self.raise_lasting()

    def _write_debezium(self, item: Any, topic: str, deadline: float) -> None:
        """Debezium's records for one item: a change (and its tombstone, its transaction's BEGIN or
        END), or beside a control message a TRUNCATE's ``op: "t"`` or a DDL's schema change topic
        record; in the same transaction."""
        enc = self.encoder
        # a record refused for its size names the item (the dead letter's), not its own bytes
        ident = item.idempotency_key
        if is_control(item):
            headers = [("idempotency_key", item.idempotency_key.encode()), ("type", item.type.encode())]
            self.put(topic, item.value, item.key_bytes, headers, deadline, ident)
            records = enc.truncate_records(item, self.topic_of)
            records += [r for r in [enc.schema_change_record(item)] if r is not None]
        else:
            records = enc.change_records(item, self.topic_of)
        self.topics.ensure([r.topic for r in records])
        for r in records:
            self.put(r.topic, r.value, r.key, r.headers, deadline, ident)

    def put_record(self, record: Any) -> None:
        """Queue one prepared record (topic, value, key, headers: Debezium's heartbeat)."""
        self.put(record.topic, record.value, record.key, record.headers, self.deadline())

    def put(self, topic: str, value: bytes | None, key: bytes | None, headers: list, deadline: float,
            ident: str | None = None) -> None:
        """Queue one record (``ident``: the event it is written for, when it is not the event's
        own bytes: its delivery callback names the event); while the local queue is full, serve
        delivery reports up to the deadline."""
        p = self.producer
        assert p is not None
        callback = {} if ident is None else {"on_delivery": self.reports.reporter(ident)}
        while True:
            try:
                p.produce(topic, value, key, headers=headers, **callback)
                return
            except KafkaException as exc:
                if not self.reports.refused_here(exc, topic, value, key, ident):
                    raise
                return
            except BufferError:
                p.poll(0.05)
                self.raise_lasting()
                if time.monotonic() > deadline:
                    raise RetryableSinkError(
                        f"Kafka sink {self.reports.sink_id!r}: the local producer queue stayed full for "
                        f"{self.settings.delivery_timeout_s:.0f}s (brokers slow or down)") from None

    def serve(self) -> None:
        """Serve the callbacks (delivery reports, client errors) waiting now."""
        try:
            if self.producer is not None:
                self.producer.poll(0)
        except Exception:  # noqa: BLE001, S110 - only collecting reports
            pass

    def raise_lasting(self) -> None:
        """Raise the client error that waiting does not heal, if one was reported."""
        err = self.reports.lasting_client_error()
        if err is not None:
            raise self.fail(KafkaException(err), "talking to the brokers")

    def flush(self) -> None:
        p = self.producer
        assert p is not None
        timeout = self.settings.delivery_timeout_s
        deadline = time.monotonic() + timeout
        while True:
            left = p.flush(0.5)
            self.raise_lasting()
            if left == 0:
                return
            if time.monotonic() > deadline:
                raise RetryableSinkError(f"Kafka sink {self.reports.sink_id!r}: {left} messages not "
                                         f"acknowledged within {timeout:.0f}s (brokers slow or down)")

    def await_delivery(self, deadline: float) -> None:
        """Wait for the transaction's messages before its commit, and stop at the first one the
        broker refused on its own (too large). The commit would wait for the messages queued
        after it on its partition, which fail on their sequence numbers and are retried until
        the broker aborts the transaction at transaction.timeout.ms and fences the producer:
        such a sub-batch timed out attempt after attempt (campaign POISON=dlq, seed 6101). Until
        ``deadline`` (time.monotonic()) at the most: the commit's own wait decides after it."""
        p = self.producer
        assert p is not None
        while not self.reports.too_large() and p.flush(0.1) and time.monotonic() < deadline:
            pass

    def stop(self) -> Producer | None:
        """Forget the producer (the caller ends it); the next delivery starts a new one."""
        p, self.producer = self.producer, None
        return p

    def drop(self) -> None:
        """Leave the producer without ending its transaction: its messages purged, the broker
        aborts the transaction when the next producer of the transactional.id starts (fencing
        this one). For a transaction the broker refused a message of, whose abort would wait
        as its commit would (:meth:`await_delivery`)."""
        p = self.stop()
        if p is not None:
            try:
                p.purge(in_queue=True, in_flight=True)
                p.poll(0)  # the purged messages' reports: consequences, never a cause
            except Exception:  # noqa: BLE001, S110 - a producer being left
                pass

    def abort_quietly(self) -> None:
        try:
            if self.producer is not None:
                self.producer.abort_transaction(5)
        except Exception:  # noqa: BLE001, S110 - the producer is unusable anyway
            pass


__all__ = ["POLL_EVERY", "RecordWriter"]
