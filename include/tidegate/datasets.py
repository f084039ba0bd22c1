"""Where a pipeline's data lives, named as datasets: a source table, a sink's target (a topic,
subject, stream or table). Each is a namespace (the server, as a URL) and a name on it, and a URI
of the two; each kind names its own (``SourceKind.dataset``, ``SinkKind.dataset``). Only hosts,
ports and names go into them, never a login, password or token. Airflow's assets and OpenLineage's
datasets are made from these (tidegate_airflow/assets.py, lineage.py); nothing here knows either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from . import kinds


@dataclass(frozen=True)
class Dataset:
    namespace: str  # the server, e.g. kafka://broker1:9092
    name: str  # what it is on that server, e.g. the topic
    uri: str  # both in one URI, e.g. kafka://broker1:9092/orders


def target_dataset(kind: str, conn: Any, target: str) -> Dataset:
    """The target ``target`` (as ``Sink.target_of`` names it) of a sink of ``kind`` whose server is
    the connection ``conn`` (None for a kind that needs none)."""
    return kinds.sink_kind(kind).dataset(conn, target)


def table_dataset(kind: str, conn: Any, table: Any) -> Dataset:
    """The source table ``table`` (a ``lineage.SourceTable``) of a source of ``kind`` read through
    the connection ``conn``."""
    return kinds.source_kind(kind).dataset(conn, table)


def host_port(conn: Any, default_port: int) -> str:
    """``host:port`` of a connection (its login and password left out); a host written as a URL
    gives its host[:port]."""
    host = conn.host or "127.0.0.1"
    if "://" in host:
        host = urlsplit(host).netloc.rpartition("@")[2]
    return host if ":" in host else f"{host}:{conn.port or default_port}"


def on_server(namespace: str, name: str) -> Dataset:
    """A dataset whose URI is its server's URL, then its name as the path."""
    return Dataset(namespace, name, f"{namespace}/{name}")


__all__ = ["Dataset", "host_port", "on_server", "table_dataset", "target_dataset"]
