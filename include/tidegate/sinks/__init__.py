"""Sinks: Kafka, NATS JetStream, Redis Streams (docs/architecture.md, "Guarantees and what they rest on").

``make_sink(pipeline_spec, sink_spec, conn)`` builds the sink for one spec entry. The client
libraries are imported only when a sink of that kind is made, so an installation that uses
only Kafka does not need nats-py or redis-py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import RetryPolicy, Sink

if TYPE_CHECKING:
    from ..connections import Connection
    from ..spec import PipelineSpec, SinkSpec  # the kind's own subclass


def make_sink(pipeline_spec: PipelineSpec, sink_spec: SinkSpec, conn: Connection) -> Sink:
    """The sink for ``sink_spec`` of ``pipeline_spec``, talking through ``conn``."""
    kind = sink_spec.kind
    if kind == "kafka":
        from .kafka import KafkaSink

        return KafkaSink(pipeline_spec, sink_spec, conn)
    if kind == "nats":
        from .nats import NatsSink

        return NatsSink(pipeline_spec, sink_spec, conn)
    if kind == "redis":
        from .redis import RedisSink

        return RedisSink(pipeline_spec, sink_spec, conn)
    raise ValueError(f"sink {sink_spec.id!r}: unknown kind {kind!r}; allowed: kafka, nats, redis")


__all__ = ["RetryPolicy", "Sink", "make_sink"]
