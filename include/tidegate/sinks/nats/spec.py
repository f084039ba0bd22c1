"""The ``kind: nats`` sink entry of a spec (README.md, "Pipelines"): its fields and their
checks. Light: no client library (DAG parsing loads specs)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ...datasets import Dataset, host_port, on_server
from ...spec import Problems, SinkSpec, float_field, int_field, str_field, template_field

STREAM_RE = re.compile(r"^[A-Za-z0-9_-]+$")
SUBJECT_CHARS = re.compile(r"^[A-Za-z0-9._-]*$")
FIELDS = ("stream", "subject", "duplicate_window", "max_in_flight")


@dataclass(frozen=True)
class NatsSinkSpec(SinkSpec):
    stream: str = ""  # the JetStream stream name
    subject: str = ""
    duplicate_window_s: float = 120.0
    max_in_flight: int = 1000


def parse(d: dict, fp: str, probs: Problems) -> dict[str, Any]:
    return dict(
        stream=str_field(d, "stream", f"{fp}.stream", probs, required=True, pattern=STREAM_RE,
                         allowed="a JetStream stream name: letters, digits, '_', '-'"),
        subject=template_field(d, "subject", f"{fp}.subject", probs, SUBJECT_CHARS, "subject",
                               required=True),
        duplicate_window_s=float_field(d, "duplicate_window", f"{fp}.duplicate_window", probs,
                                       default=120.0),
        max_in_flight=int_field(d, "max_in_flight", f"{fp}.max_in_flight", probs, lo=1, default=1000),
    )


def dataset(conn: Any, subject: str) -> Dataset:
    """``nats://<host>:<port>/<subject>``: no Airflow or OpenLineage convention exists; the
    server's own URL scheme, then the subject."""
    return on_server(f"nats://{host_port(conn, 4222)}", subject)
