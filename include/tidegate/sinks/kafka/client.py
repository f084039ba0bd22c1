"""The Kafka clients' settings: from a connection (its ``extra`` holds librdkafka properties
verbatim; the sink module's docstring tells the mapping), for the producer, the admin client
and the read_committed reader of the sink's own topics. All three get the same security
settings."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from ...connections import Connection
from ...errors import NonRetryableSinkError

OP_TIMEOUT_S = 30.0  # default for admin calls, init/abort of transactions, checkpoint reads
TRANSACTION_TIMEOUT_MS = 120_000  # the producer's transaction.timeout.ms unless the connection sets it
# Every client (producer, admin, checkpoint reader), under the connection's own settings. A new
# librdkafka client learns the brokers from its bootstrap connection, drops it, and waits
# reconnect.backoff.ms / 2 before connecting to a learned broker: 50 ms per client with the
# default 100 ms, 11 ms with 20 ms (later reconnects still back off up to
# reconnect.backoff.max.ms).
_CLIENT_DEFAULTS = {"reconnect.backoff.ms": 20}

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
_LIBRDKAFKA_LOG = logging.getLogger("tidegate.sinks.kafka.sink.librdkafka")


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


class ClientSettings:
    """One sink's client configurations. ``base`` is :func:`client_config` of its connection;
    ``on_delivery`` and ``on_error`` are the callbacks every client reports through."""

    def __init__(self, base: dict[str, Any], transactional_id: str, exactly_once: bool,
                 on_delivery: Callable[[Any, Any], None], on_error: Callable[[Any], None]):
        self.base = base
        self.transactional_id = transactional_id
        self.exactly_once = exactly_once
        self._on_delivery = on_delivery
        self._on_error = on_error
        self.op_timeout_s = OP_TIMEOUT_S  # admin calls, init/abort of transactions, read-backs

    def producer(self) -> dict[str, Any]:
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
        cfg.update(self.base)
        cfg["on_delivery"] = self._on_delivery
        cfg["error_cb"] = self._on_error
        cfg["logger"] = _LIBRDKAFKA_LOG
        return cfg

    def _not_producing(self) -> dict[str, Any]:
        """The connection's settings that are not the producer's, over :data:`_CLIENT_DEFAULTS`:
        the start of the admin client's and the reader's configurations."""
        cfg = {**_CLIENT_DEFAULTS, **{k: v for k, v in self.base.items() if k not in _PRODUCER_ONLY}}
        cfg["logger"] = _LIBRDKAFKA_LOG
        cfg["error_cb"] = self._on_error  # a refused certificate or login shows here first
        return cfg

    def admin(self) -> dict[str, Any]:
        return self._not_producing()

    def reader(self) -> dict[str, Any]:
        """The consumer that reads the sink's own topics back (checkpoints, heartbeats):
        read_committed, from the earliest offset, reporting the partition's end."""
        cfg = self._not_producing()
        cfg.update({"group.id": f"tidegate-ckpt-{uuid.uuid4().hex}", "enable.auto.commit": False,
                    "isolation.level": "read_committed", "enable.partition.eof": True,
                    "auto.offset.reset": "earliest",
                    # The end of the partition shows as an empty fetch, which the broker holds
                    # for fetch.wait.max.ms (500 ms by default) per window read.
                    "fetch.wait.max.ms": 10})
        return cfg

    @property
    def transaction_timeout_ms(self) -> int:
        """The producer's transaction.timeout.ms (the connection's extra, else the default)."""
        return int(self.base.get("transaction.timeout.ms") or TRANSACTION_TIMEOUT_MS)

    @property
    def delivery_timeout_s(self) -> float:
        """How long a queue full or a flush may wait: the producer's own timeout, and 10 s."""
        key = "transaction.timeout.ms" if self.exactly_once else "message.timeout.ms"
        return float(self.base.get(key) or 120_000) / 1000.0 + 10.0


__all__ = ["OP_TIMEOUT_S", "TRANSACTION_TIMEOUT_MS", "ClientSettings", "client_config"]
