"""OpenLineage datasets of a run, for apache-airflow-providers-openlineage (docs/operations.md,
"Assets and lineage"): the source tables it read (inputs, with their columns as a schema facet)
and the targets it delivered to (outputs, with the events each got), named as
:mod:`tidegate.datasets` names them (OpenLineage's naming for MySQL and PostgreSQL tables:
``mysql://host:port`` + ``database.table``, ``postgres://host:port`` + ``database.schema.table``).

Only called by the provider's listener, which is off when no transport is configured: a
deployment without OpenLineage never gets here (no catalog query, no import of the client).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .assets import delivered_targets


def delivered_tables(report: Mapping[str, Any]) -> list[str]:
    """The source tables (``schema.table``) any sink got events of in the run."""
    return sorted({t for s in report.get("sinks") or () for got in (s.get("targets") or {}).values()
                   if got.get("events") for t in got.get("tables") or ()})


def input_datasets(run: Any, tables: list[str]) -> list[Any]:
    """The source tables as OpenLineage input datasets with a schema facet (one catalog query)."""
    from airflow.providers.common.compat.openlineage.facet import (
        InputDataset,
        SchemaDatasetFacet,
        SchemaDatasetFacetFields,
    )
    from tidegate.datasets import table_dataset
    from tidegate.lineage import source_tables

    if not tables:
        return []
    spec = run.spec
    conn = run.parts.connection(spec.source.conn_id)
    source = run.parts.source(spec, reads_rows=False)
    try:
        found = source_tables(spec, source, tables)
    finally:
        source.close()
    out = []
    for table in found:
        where = table_dataset(spec.source.kind, conn, table)
        schema = SchemaDatasetFacet(fields=[SchemaDatasetFacetFields(name=c, type=t)
                                            for c, t in table.columns])
        out.append(InputDataset(namespace=where.namespace, name=where.name,
                                facets={"schema": schema} if table.columns else {}))
    return out


def output_datasets(run: Any, report: Mapping[str, Any]) -> list[Any]:
    """Every target the run delivered to, with its event count (``outputStatistics.rowCount``)."""
    from airflow.providers.common.compat.openlineage.facet import (
        OutputDataset,
        OutputStatisticsOutputDatasetFacet,
    )

    return [OutputDataset(namespace=where.namespace, name=where.name,
                          outputFacets={"outputStatistics": OutputStatisticsOutputDatasetFacet(
                              rowCount=got["events"])})
            for _, where, got in delivered_targets(report, run.spec, run.parts.connection)]


def deliver_lineage(run: Any, report: Mapping[str, Any] | None) -> Any:
    """The deliver task's ``OperatorLineage``: empty for a run that delivered nothing."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    if not report:
        return OperatorLineage()
    return OperatorLineage(inputs=input_datasets(run, delivered_tables(report)),
                           outputs=output_datasets(run, report))
