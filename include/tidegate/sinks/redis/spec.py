"""The ``kind: redis`` sink entry of a spec (README.md, "Pipelines"): its fields and their
checks. Light: no client library (DAG parsing loads specs)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ...datasets import Dataset, host_port, on_server
from ...spec import Problems, SinkSpec, int_field, template_field

STREAM_KEY_CHARS = re.compile(r"^[^\s{}]*$")
FIELDS = ("stream", "maxlen")


@dataclass(frozen=True)
class RedisSinkSpec(SinkSpec):
    stream: str = ""  # the stream key template
    maxlen: int | None = None  # never trim unless set


def parse(d: dict, fp: str, probs: Problems) -> dict[str, Any]:
    return dict(
        stream=template_field(d, "stream", f"{fp}.stream", probs, STREAM_KEY_CHARS, "stream key",
                              required=True),
        maxlen=int_field(d, "maxlen", f"{fp}.maxlen", probs, lo=1),
    )


def dataset(conn: Any, stream: str) -> Dataset:
    """``redis://<host>:<port>/<db>/<stream>``: no Airflow or OpenLineage convention exists; the
    Redis URL of the database (the connection's schema, or extra ``db``, else 0), then the key."""
    schema = str(conn.schema or "")
    db = int(schema) if schema.isdigit() else int(conn.extra.get("db", 0))
    return on_server(f"redis://{host_port(conn, 6379)}/{db}", stream)
