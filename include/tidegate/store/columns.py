"""Column memory: what a source remembers of its log between runs, a table's column set as of a
log position (PostgreSQL's wal2json carries no DDL; a column change is noticed by comparing a
row's columns with the last set seen, also when that set was seen by an earlier run)."""

from __future__ import annotations

import json

from ..positions import Position
from .records import TableColumns, now_iso, pos_text, pos_value, ts_text
from .tx import Role


class Columns(Role):
    def record(self, pipeline: str, schema: str, table: str, position: Position,
               columns: list[dict[str, str]]) -> None:
        """Remember that the table had ``columns`` as of ``position``. A fact about the source
        log, not progress: not fenced, and recording the same fact again changes nothing."""
        with self._tx(write=True) as tx:
            tx.exec("INSERT INTO tidegate_table_columns (pipeline, schema_name, table_name, position, "
                    "columns, seen_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (pipeline, schema, table, pos_text(position), json.dumps(columns), now_iso()))

    def all(self, pipeline: str) -> list[TableColumns]:
        """Every column set remembered for the pipeline's tables, oldest record first."""
        with self._tx() as tx:
            rows = tx.all("SELECT pipeline, schema_name, table_name, position, columns, seen_at FROM "
                          "tidegate_table_columns WHERE pipeline = ? ORDER BY seen_at", (pipeline,))
        return [TableColumns(r[0], r[1], r[2], pos_value(r[3]), json.loads(r[4]), ts_text(r[5]))
                for r in rows]
