"""The ``kind: kafka`` sink entry of a spec (README.md, "Pipelines"): its fields and their
checks. Light: no client library (DAG parsing loads specs)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ...datasets import Dataset, host_port, on_server
from ...spec import Problems, SinkSpec, bool_field, int_field, str_field, template_field

TOPIC_CHARS = re.compile(r"^[A-Za-z0-9._-]*$")
FIELDS = ("topic", "exactly_once", "partitions", "replication_factor", "create_topics",
          "checkpoint_topic", "tombstones_on_delete", "envelope", "debezium")


@dataclass(frozen=True)
class KafkaSinkSpec(SinkSpec):
    topic: str = ""
    exactly_once: bool = False
    partitions: int = 1
    replication_factor: int = 1
    create_topics: bool = True
    checkpoint_topic: str = "_tidegate_checkpoints"
    tombstones_on_delete: bool = False  # a null-valued record after each delete (log compaction)
    envelope: str = "tidegate"  # tidegate | debezium (docs/operations.md, "Debezium envelope")
    # with envelope: debezium, its debezium.envelope.DebeziumOptions (the envelope's owner parses
    # them: the kind's envelope_fields)
    debezium: Any = None

    @property
    def guarantee(self) -> str:
        return "exactly-once" if self.exactly_once else super().guarantee

    @property
    def heartbeat_interval_ms(self) -> int:
        return self.debezium.heartbeat_interval_ms if self.debezium is not None else 0


def parse(d: dict, fp: str, probs: Problems, envelope: dict[str, Any]) -> dict[str, Any]:
    """The entry's fields; ``envelope``: its envelope fields, parsed by the envelope's owner (the
    kind's ``envelope_fields``)."""
    dflt = KafkaSinkSpec("x", "kafka", "x")
    # With Debezium's envelope the topic defaults to Debezium's name: <prefix>.<db or schema>.<table>.
    debezium = envelope["envelope"] == "debezium"
    return dict(
        **envelope,
        topic=template_field(d, "topic", f"{fp}.topic", probs, TOPIC_CHARS, "topic", required=not debezium)
        or "",
        exactly_once=bool_field(d, "exactly_once", f"{fp}.exactly_once", probs, default=False),
        partitions=int_field(d, "partitions", f"{fp}.partitions", probs, lo=1, default=dflt.partitions),
        replication_factor=int_field(d, "replication_factor", f"{fp}.replication_factor", probs, lo=1,
                                     hi=32767, default=dflt.replication_factor),
        create_topics=bool_field(d, "create_topics", f"{fp}.create_topics", probs, default=True),
        checkpoint_topic=str_field(d, "checkpoint_topic", f"{fp}.checkpoint_topic", probs,
                                   pattern=re.compile(r"^[A-Za-z0-9._-]+$"),
                                   allowed="letters, digits, '.', '_', '-'") or dflt.checkpoint_topic,
        tombstones_on_delete=bool_field(d, "tombstones_on_delete", f"{fp}.tombstones_on_delete", probs,
                                        default=False),
    )


def dataset(conn: Any, topic: str) -> Dataset:
    """``kafka://<server>/<topic>``: the Kafka provider's asset scheme and OpenLineage's Kafka
    namespace, both naming one bootstrap server (the first of the connection's
    ``bootstrap.servers``, else its host[:port], as the sink connects)."""
    servers = str(conn.extra.get("bootstrap.servers") or "")
    first = servers.split(",")[0].strip().rpartition("://")[2]  # a listener prefix (SASL_SSL://) aside
    return on_server(f"kafka://{first or host_port(conn, 9092).split(',')[0]}", topic)
