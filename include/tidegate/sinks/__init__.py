"""Sinks (docs/architecture.md, "Guarantees and what they rest on"): ``base.py`` is the interface
the coordinator drives; each kind is a package (``kafka/``, ``nats/``, ``redis/``) registered in
:mod:`tidegate.kinds`.

``make_sink(pipeline_spec, sink_spec, conn)`` builds the sink for one spec entry. A kind's client
library is imported only when a sink of that kind is made, so an installation that uses only
Kafka does not need nats-py or redis-py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..kinds import sink_kind

if TYPE_CHECKING:
    from ..connections import Connection
    from ..spec import PipelineSpec, SinkSpec  # the kind's own subclass
    from .base import Sink


def make_sink(pipeline_spec: PipelineSpec, sink_spec: SinkSpec, conn: Connection) -> Sink:
    """The sink for ``sink_spec`` of ``pipeline_spec``, talking through ``conn``."""
    try:
        kind = sink_kind(sink_spec.kind)
    except ValueError as exc:
        raise ValueError(f"sink {sink_spec.id!r}: {exc}") from None
    return kind.make(pipeline_spec, sink_spec, conn)


__all__ = ["make_sink"]
