"""Change-log sources: MySQL/MariaDB binlog and PostgreSQL logical decoding (wal2json).

``make_source(spec, conn)`` returns the source for ``spec.source.kind``. Source modules are
imported lazily so that a deployment needs only the client library of the sources it uses.
"""

from __future__ import annotations

from ..connections import Connection
from ..spec import PipelineSpec
from .base import Source, SourceItem

__all__ = ["Source", "SourceItem", "make_source"]


def make_source(spec: PipelineSpec, conn: Connection) -> Source:
    """The :class:`Source` for the spec's ``source.kind`` reading through ``conn``."""
    kind = spec.source.kind
    if kind == "mysql":
        from .mysql import MySqlSource

        return MySqlSource(spec, conn)
    if kind == "postgres":
        from .postgres import PostgresSource

        return PostgresSource(spec, conn)
    raise ValueError(f"unknown source kind {kind!r}; allowed: mysql, postgres")
