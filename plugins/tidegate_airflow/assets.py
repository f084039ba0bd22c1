"""Where a run's events went, as Airflow assets and OpenLineage datasets (docs/operations.md,
"Assets and lineage").

Every delivered target (a Kafka topic, a NATS subject, a Redis stream, a Delta table) is one
dataset (:mod:`tidegate.datasets`; each sink kind names its own): its URI is the asset's, its
namespace and name OpenLineage's. Only hosts and ports go into them, never a login, password or
token. The deliver task declares one :func:`delivered_alias` per pipeline as
its outlet and, after a run that delivered, adds one asset event per target through it; a run that
delivered nothing adds none, so a DAG scheduled on a target's asset runs after delivering runs only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


def delivered_alias(pipeline: str) -> Any:
    """The deliver task's outlet: the alias its per-target asset events go through (the
    targets are only known once the run has delivered: templates resolve per source table)."""
    from airflow.sdk import AssetAlias

    return AssetAlias(name=f"tidegate.{pipeline}.delivered")


def delivered_targets(report: Mapping[str, Any], spec: Any,
                      connection: Any) -> Iterator[tuple[Any, Any, dict]]:
    """(sink report, the target's ``tidegate.datasets.Dataset``, its ``{"events", "tables"}``) for
    every target that got events in the run; ``connection`` resolves a conn id (``Parts.connection``)."""
    from tidegate.datasets import target_dataset

    for sink in report.get("sinks") or ():
        targets = {name: got for name, got in (sink.get("targets") or {}).items() if got.get("events")}
        if not targets:
            continue
        conn_id = spec.sink(sink["id"]).conn_id
        conn = connection(conn_id) if conn_id else None
        for name, got in targets.items():
            yield sink, target_dataset(sink["kind"], conn, name), got


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
