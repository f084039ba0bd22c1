"""Helpers shared by the sinks: topic/subject/stream naming and keeping secrets out of text."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..connections import Connection
from ..events import ChangeEvent
from ..spec import render_template

# Connection extras whose values are secrets (never echoed in logs or exceptions).
SECRET_HINTS = ("password", "secret", "token", "credential", "key.pem", "seed", "private")


def secrets_of(conn: Connection, extra: Mapping[str, Any] | None = None) -> list[str]:
    """Every secret value a connection holds (password and secret-looking extras)."""
    out = [conn.password] if conn.password else []
    for k, v in (conn.extra if extra is None else extra).items():
        if isinstance(v, str) and v and any(h in k.lower() for h in SECRET_HINTS):
            out.append(v)
    return [s for s in out if len(s) >= 3]


def redact(text: str, secrets: Iterable[str]) -> str:
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    return text


class TemplateNames:
    """Renders a topic/subject/stream template once per (db, schema, table)."""

    def __init__(self, template: str, pipeline: str):
        self.template = template
        self.pipeline = pipeline
        self._cache: dict[tuple[str, str, str], str] = {}

    def __call__(self, ev: ChangeEvent) -> str:
        k = (ev.db, ev.schema, ev.table)
        name = self._cache.get(k)
        if name is None:
            name = self._cache[k] = render_template(self.template, pipeline=self.pipeline, db=ev.db,
                                                    schema=ev.schema, table=ev.table)
        return name
