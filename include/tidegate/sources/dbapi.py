"""What both sources do the same way on a DB-API connection (PyMySQL's and psycopg2's)."""

from __future__ import annotations

import contextlib
from typing import Any


def fetch_all(conn: Any, sql: str, args: Any = None) -> list[tuple]:
    """Every row ``sql`` returns on ``conn``."""
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


def close_quietly(conn: Any) -> None:
    """Close ``conn`` if there is one, never raising: the connection may be broken already,
    which is often why it is closed."""
    with contextlib.suppress(Exception):
        if conn is not None:
            conn.close()


def catalog_of(rows: list[tuple]) -> dict[str, tuple[list[str], list[str]]]:
    """:meth:`Source.table_catalog`'s answer from catalog rows (schema, table, column, is key),
    in the tables' column order."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    for schema, table, column, is_key in rows:
        cols, key = out.setdefault(f"{schema}.{table}", ([], []))
        cols.append(column)
        if is_key:
            key.append(column)
    return out


class SqlCatalog:
    """The part of a source's catalog both sources read the same way: :meth:`table_catalog`
    runs the source's ``catalog_sql`` (schema, table, column, is key per row, in column order)
    on a connection of the snapshot reads' kind (:meth:`snapshot_connection`)."""

    connector: str  # the source kind, as Debezium's ``source.connector`` names it
    catalog_sql: str
    catalog_args: Any = None
    spec: Any
    conn: Any
    server: Any  # the source's server: every connection's settings, TLS included

    def snapshot_connection(self) -> Any:
        raise NotImplementedError

    def table_catalog(self) -> dict[str, tuple[list[str], list[str]]]:
        """Every table's columns and primary key (for the filters' preflight)."""
        with contextlib.closing(self.snapshot_connection()) as conn:
            return catalog_of(fetch_all(conn, self.catalog_sql, self.catalog_args))
