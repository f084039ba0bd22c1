"""Pipeline specs (``include/pipelines/<pipeline>.yaml``) as typed, validated objects.

The YAML format is fixed by DESIGN.md ("Pipeline spec"). Unknown fields are errors. Loading
and validation live in this module; every problem is reported as one line naming the file,
the field path and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SOURCE_KINDS = ("mysql", "postgres")
SINK_KINDS = ("kafka", "nats", "redis")
COMMIT_POLICIES = ("required", "all", "quorum")
START_MODES = ("head", "earliest")
PLACEHOLDERS = ("pipeline", "db", "schema", "table")


@dataclass(frozen=True)
class SourceSpec:
    kind: str
    conn_id: str
    tables: tuple[str, ...] = ()  # "db.table" (MySQL) or "schema.table" (Postgres); () = all
    server_id: int | None = None  # mysql: replication client id
    slot: str | None = None  # postgres: logical replication slot (wal2json)
    start: str = "head"


@dataclass(frozen=True)
class BatchSpec:
    max_events: int = 50_000
    max_bytes: int = 64 * 1024 * 1024
    respect_source_tx: bool = True
    commit_policy: str = "required"
    quorum: int | None = None


@dataclass(frozen=True)
class SinkSpec:
    id: str
    kind: str
    conn_id: str
    required: bool = True
    # kafka
    topic: str | None = None
    exactly_once: bool = False
    partitions: int = 1
    replication_factor: int = 1
    create_topics: bool = True
    checkpoint_topic: str = "_tidegate_checkpoints"
    # nats
    stream: str | None = None  # nats: JetStream stream name; redis: stream key template
    subject: str | None = None
    duplicate_window_s: float = 120.0
    max_in_flight: int = 1000
    # redis
    maxlen: int | None = None  # never trim unless set


@dataclass(frozen=True)
class SparkSpec:
    conn_id: str = "spark_default"
    conf: dict[str, str] = field(default_factory=dict)
    packages: tuple[str, ...] = ()


@dataclass(frozen=True)
class PipelineSpec:
    pipeline: str
    source: SourceSpec
    sinks: tuple[SinkSpec, ...]
    batch: BatchSpec = BatchSpec()
    tenant: str = "default"
    schedule: str | None = None
    spark: SparkSpec = SparkSpec()
    path: str | None = None  # the file it came from
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def dag_id(self) -> str:
        return f"cdc_{self.pipeline}"

    def sink(self, sink_id: str) -> SinkSpec:
        for s in self.sinks:
            if s.id == sink_id:
                return s
        raise KeyError(f"pipeline {self.pipeline!r} has no sink {sink_id!r}")


def render_template(template: str, *, pipeline: str, db: str, schema: str, table: str) -> str:
    """Fill a topic/subject/stream template ({pipeline}, {db}, {schema}, {table})."""
    return template.format(pipeline=pipeline, db=db, schema=schema, table=table)
