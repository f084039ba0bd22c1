"""The ``source:`` section of a spec with ``kind: mysql`` (README.md, "Pipelines"): the fields
only this kind reads and their checks, and the replication client id. Light: no client library
(DAG parsing loads specs)."""

from __future__ import annotations

import zlib
from typing import Any

from ...datasets import Dataset, host_port, on_server
from ...spec import PipelineSpec, Problems, int_field

UINT32_MAX = 2**32 - 1
# replay_retention is read only to refuse it with the reason (the server keeps the binlogs)
FIELDS = ("server_id", "replay_retention")


def parse(d: dict, probs: Problems) -> dict[str, Any]:
    v = d.get("replay_retention")
    if v is not None and not (v == 0 and not isinstance(v, bool)):
        probs.add("source.replay_retention",
                  "only for postgres sources: a MySQL/MariaDB server keeps its binlogs for "
                  "binlog_expire_logs_seconds (expire_logs_days), whatever tidegate releases",
                  "omit it, and raise the server's binlog expiry to replay further back")
    return {"server_id": int_field(d, "server_id", "source.server_id", probs, lo=1, hi=UINT32_MAX)}


def replication_client(spec: PipelineSpec) -> tuple[str, int]:
    """The replication client id (``server_id``), derived from the pipeline name when unset."""
    derived = 40000 + zlib.crc32(spec.pipeline.encode()) % 1_000_000
    return "server_id", spec.source.server_id or derived


def dataset(conn: Any, table: Any) -> Dataset:
    """OpenLineage's MySQL naming: ``mysql://<host>:<port>``, ``<database>.<table>`` (a MySQL
    database is the table's schema: the name as the spec spells it)."""
    return on_server(f"mysql://{host_port(conn, 3306)}", table.name)
