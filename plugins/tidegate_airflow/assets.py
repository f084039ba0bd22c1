"""Where a run's events went, as Airflow assets and OpenLineage datasets (docs/operations.md,
"Assets and lineage").

Every delivered target (a Kafka topic, a NATS subject, a Redis stream, a Delta table) is one
dataset, named by its server and its name on that server: an OpenLineage ``(namespace, name)``
and an Airflow asset URI built from the same two parts. Only hosts and ports go into them, never
a login, password or token. The deliver task declares one :func:`delivered_alias` per pipeline as
its outlet and, after a run that delivered, adds one asset event per target through it; a run that
delivered nothing adds none, so a DAG scheduled on a target's asset runs after delivering runs only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Target:
    """One dataset a sink wrote to: OpenLineage's namespace and name, and the asset URI."""

    namespace: str
    name: str
    uri: str


def delivered_alias(pipeline: str) -> Any:
    """The deliver task's outlet: the alias its per-target asset events go through (the
    targets are only known once the run has delivered: templates resolve per source table)."""
    from airflow.sdk import AssetAlias

    return AssetAlias(name=f"tidegate.{pipeline}.delivered")


def target(kind: str, conn: Any, name: str) -> Target:
    """The dataset of target ``name`` (as ``SinkReport.targets`` names it) of a sink of ``kind``
    whose server is connection ``conn`` (a ``tidegate.connections.Connection``)."""
    if kind == "kafka":  # the Kafka provider's scheme: kafka://<bootstrap server>/<topic>
        server = f"kafka://{_first_bootstrap_server(conn)}"
        return Target(server, name, f"{server}/{name}")
    if kind == "nats":  # no Airflow scheme: the server's URL, then the subject
        server = f"nats://{host_port(conn, 4222)}"
        return Target(server, name, f"{server}/{name}")
    if kind == "redis":  # no Airflow scheme: the server's URL with its database, then the key
        server = f"redis://{host_port(conn, 6379)}/{_redis_db(conn)}"
        return Target(server, name, f"{server}/{name}")
    if kind == "delta":
        return _table_path(name)
    raise ValueError(f"no dataset naming for sink kind {kind!r}")


def delivered_targets(report: Mapping[str, Any], spec: Any,
                      connection: Any) -> Iterator[tuple[Any, Target, dict]]:
    """(sink report, target, its ``{"events", "tables"}``) for every target that got events in
    the run; ``connection`` resolves a conn id (``Parts.connection``)."""
    for sink in report.get("sinks") or ():
        targets = sink.get("targets") or {}
        if not targets:
            continue
        conn = connection(spec.sink(sink["id"]).conn_id) if sink["kind"] != "delta" else None
        for name, got in targets.items():
            if got.get("events"):
                yield sink, target(sink["kind"], conn, name), got


def asset_extra(report: Mapping[str, Any], sink: Mapping[str, Any], got: Mapping[str, Any]) -> dict[str, Any]:
    """What an asset event says about the run: its range (the sink's start and end positions),
    the target's events and source tables, the sink's totals."""
    return {"pipeline": report.get("pipeline"), "run_id": report.get("run_id"), "sink": sink["id"],
            "kind": sink["kind"], "from": sink.get("start"), "to": sink.get("end"),
            "events": got["events"], "tables": list(got.get("tables") or ()),
            "sink_events": sink.get("events"), "sink_bytes": sink.get("bytes")}


def emit_asset_events(context: Mapping[str, Any], pipeline: str, report: Mapping[str, Any] | None,
                      spec: Any, connection: Any) -> list[str]:
    """Add one asset event per delivered target through the pipeline's alias; the URIs added
    (none for an idle run, or when the driver's report did not come back)."""
    from airflow.sdk import Asset

    delivered = list(delivered_targets(report, spec, connection)) if report else []
    if not delivered:
        return []
    events = context["outlet_events"][delivered_alias(pipeline)]
    for sink, where, got in delivered:
        events.add(Asset(uri=where.uri), extra=asset_extra(report, sink, got))
    return [where.uri for _, where, _ in delivered]


# ---------------------------------------------------------------------- naming the servers


def host_port(conn: Any, default_port: int) -> str:
    """``host:port`` of a connection (its login and password left out)."""
    host = conn.host or "127.0.0.1"
    if "://" in host:  # a connection host written as a URL: keep its host[:port] only
        host = urlsplit(host).netloc.rpartition("@")[2]
    return host if ":" in host else f"{host}:{conn.port or default_port}"


def _first_bootstrap_server(conn: Any) -> str:
    """The first of ``bootstrap.servers`` (the extra's, else the host[:port] the Kafka sink
    uses): the Kafka provider's asset URIs name one server."""
    servers = str(conn.extra.get("bootstrap.servers") or "")
    first = servers.split(",")[0].strip()
    if first:
        return first.rpartition("://")[2]
    return host_port(conn, 9092).split(",")[0]


def _redis_db(conn: Any) -> int:
    schema = str(conn.schema or "")
    return int(schema) if schema.isdigit() else int(conn.extra.get("db", 0))


def _table_path(path: str) -> Target:
    """A Delta table by its path: a local folder is a ``file://`` URI (Airflow's common.io scheme,
    OpenLineage's ``file`` namespace), ``s3a://``/``s3n://`` are the Amazon provider's
    ``s3://``; any other Hadoop URI (``abfss://``, ``hdfs://``, ``gs://``) stays as written."""
    parts = urlsplit(path)
    if not parts.scheme or parts.scheme == "file":
        local = os.path.abspath(parts.path if parts.scheme else path)
        return Target("file", local, f"file://{local}")
    scheme = "s3" if parts.scheme in ("s3a", "s3n") else parts.scheme
    return Target(f"{scheme}://{parts.netloc}", parts.path, f"{scheme}://{parts.netloc}{parts.path}")
