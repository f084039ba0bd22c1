"""The ``kind: redis`` sink entry of a spec (README.md, "Pipelines"): its fields and their
checks. Light: no client library (DAG parsing loads specs)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

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
