"""Helpers shared by the sinks: topic/subject/stream naming, keeping secrets out of text, and
telling a refused server certificate from a network fault."""

from __future__ import annotations

import ssl
from collections.abc import Iterable, Mapping
from typing import Any

from ..connections import Connection, is_secret_key
from ..events import ChangeEvent
from ..spec import render_template


def secrets_of(conn: Connection, extra: Mapping[str, Any] | None = None) -> list[str]:
    """Every secret value a connection holds (password and secret-looking extras)."""
    out = [conn.password] if conn.password else []
    for k, v in (conn.extra if extra is None else extra).items():
        if v not in (None, "") and not isinstance(v, (bool, dict, list)) and is_secret_key(k):
            out.append(str(v))  # a number too: a URI's query value that is JSON is read as one
    return [s for s in out if len(s) >= 3]


def redact(text: str, secrets: Iterable[str]) -> str:
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    return text


def tls_verification_failed(exc: BaseException) -> bool:
    """Did the client refuse the server's certificate (signed by a CA the connection does not
    trust, or not naming the host it connected to)? Python clients raise (or wrap)
    ``ssl.SSLCertVerificationError``; librdkafka says "certificate verify failed" in its
    error string. Waiting does not heal it, so it is never retried."""
    seen: BaseException | None = exc
    for _ in range(10):  # the cause chain, bounded (chains can loop)
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLCertVerificationError) or "certificate verify failed" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False


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
