"""What lineage reports of a run's source tables: their columns as the source's catalog has them,
less the columns ``source.columns`` excludes (an excluded column leaves the source in nothing
tidegate writes, lineage included). Airflow's OpenLineage reporting (tidegate_airflow/lineage.py)
builds its input datasets from this; nothing here knows Airflow or OpenLineage."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .filters import ColumnFilters
from .spec import PipelineSpec


@dataclass(frozen=True)
class SourceTable:
    """A captured table: ``name`` as the spec spells it (``schema.table``), the database the source
    reads (as its catalog says) and the table's columns (name, SQL type as the catalog spells
    it), in table order."""

    name: str
    database: str
    columns: tuple[tuple[str, str], ...]


def source_tables(spec: PipelineSpec, source: object, tables: Iterable[str]) -> list[SourceTable]:
    """``tables`` (``schema.table``) with their columns, asked of ``source`` once (its
    ``column_types``); a table the catalog does not list (dropped since) has no columns."""
    info = source.column_types()  # type: ignore[attr-defined]
    catalog = info.tables if info is not None else {}
    filters = ColumnFilters.of(spec.source.columns, None)
    out = []
    for name in sorted(set(tables)):
        schema, _, table = name.partition(".")
        rules = filters.for_table(schema, table) if filters is not None else None
        excluded = rules.excluded if rules is not None else frozenset()
        found = catalog.get(name)
        columns = tuple((c, t) for c, t in found.columns.items() if c not in excluded) if found else ()
        out.append(SourceTable(name, info.database if info is not None else "", columns))
    return out


__all__ = ["SourceTable", "source_tables"]
