"""The Kafka sink's topics: each looked up once, created when missing and the sink may create
it (``create_topics``), through one admin client; the checkpoint topic compacted, with its
partition count known."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from ...errors import ErrorClass, NonRetryableSinkError, SinkError
from .client import ClientSettings
from .errors import UNKNOWN_TOPIC, Fail, Reports, classify_kafka_error, kafka_error_of, missing_topic_message
from .spec import KafkaSinkSpec

log = logging.getLogger("tidegate.sinks.kafka.sink")



class Topics:
    """``fail`` turns a client exception into the sink's SinkError (it names the sink and the
    fix); ``reports`` holds what the error callback said (a refused login shows there first);
    the topics in ``single`` get one partition (the control channel and the heartbeats, which
    must stay in order)."""

    def __init__(self, settings: ClientSettings, spec: KafkaSinkSpec, pipeline: str, reports: Reports,
                 fail: Fail, single: Iterable[str | None]):
        self.settings = settings
        self.spec = spec
        self.pipeline = pipeline
        self.reports = reports
        self.fail = fail
        self.single = {t for t in single if t}
        self.known: set[str] = set()
        self.admin: AdminClient | None = None
        self.checkpoint_partitions: int | None = None

    def open_admin(self) -> AdminClient:
        if self.admin is None:
            try:
                self.admin = AdminClient(self.settings.admin())
            except KafkaException as exc:
                raise self.fail(exc, "creating the admin client") from None
        return self.admin

    def close(self) -> None:
        self.admin = None

    def missing(self, topic: str) -> SinkError:
        return NonRetryableSinkError(missing_topic_message(self.spec.id, self.pipeline, topic))

    def ensure(self, topics: Iterable[str]) -> None:
        """Every topic of ``topics`` exists when this returns (created if the sink may)."""
        missing = [t for t in dict.fromkeys(topics) if t not in self.known]
        for t in missing:
            md = self.lookup(t, f"looking up topic {t!r}")
            tm = md.topics.get(t)
            if tm is not None and tm.error is None:
                self.known.add(t)
                continue
            if tm is not None and tm.error.code() not in UNKNOWN_TOPIC:
                raise self.fail(KafkaException(tm.error), f"looking up topic {t!r}")
            if not self.spec.create_topics:
                raise self.missing(t)
            partitions = 1 if t in self.single else self.spec.partitions
            self.create(t, partitions, self.spec.replication_factor, {})
            self.known.add(t)

    def ensure_checkpoint(self, topic: str) -> int:
        """The checkpoint topic exists (compacted, one partition when created); its partitions."""
        if topic in self.known and self.checkpoint_partitions:
            return self.checkpoint_partitions
        md = self.lookup(topic, f"looking up checkpoint topic {topic!r}")
        tm = md.topics.get(topic)
        if tm is None or tm.error is not None:
            if tm is not None and tm.error.code() not in UNKNOWN_TOPIC:
                raise self.fail(KafkaException(tm.error), f"looking up checkpoint topic {topic!r}")
            self.create(topic, 1, self.spec.replication_factor,
                        {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"})
            md = self.lookup(topic, f"looking up checkpoint topic {topic!r}")
            tm = md.topics.get(topic)
        self.checkpoint_partitions = max(1, len(tm.partitions) if tm is not None else 1)
        self.known.add(topic)
        return self.checkpoint_partitions

    def lookup(self, topic: str, doing: str) -> Any:
        """The metadata of one topic. A broker that refuses this client (its certificate failed
        verification, the SASL login was wrong) makes the metadata call fail only as a transport
        error, after the whole timeout; the error callback names the cause at once. So ask in
        short slices, and stop at a cause that waiting does not heal."""
        admin = self.open_admin()
        self.reports.client.clear()  # only what this call meets counts
        deadline = time.monotonic() + self.settings.op_timeout_s
        while True:
            try:
                return admin.list_topics(topic=topic, timeout=min(1.0, max(0.1, deadline - time.monotonic())))
            except KafkaException as exc:
                admin.poll(0)  # serves the error callback
                lasting = self.reports.lasting_client_error()
                if lasting is not None:
                    raise self.fail(KafkaException(lasting), "talking to the brokers") from None
                err = kafka_error_of(exc)
                if (err is not None and classify_kafka_error(err) is not ErrorClass.RETRYABLE) \
                        or time.monotonic() >= deadline:
                    raise self.fail(exc, doing) from None

    def create(self, topic: str, partitions: int, replication: int, config: dict[str, str]) -> None:
        t = self.settings.op_timeout_s
        fut = self.open_admin().create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=replication, config=config)],
            operation_timeout=t, request_timeout=t)[topic]
        try:
            fut.result(timeout=t + 5)
            log.info("Kafka sink %r: created topic %r (partitions=%d, replication=%d%s)", self.spec.id,
                     topic, partitions, replication, f", {config}" if config else "")
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return
            e = self.fail(exc, f"creating topic {topic!r} (partitions={partitions}, "
                               f"replication_factor={replication})")
            raise type(e)(f"{e}; check the sink's partitions / replication_factor settings") from None


__all__ = ["Topics"]
