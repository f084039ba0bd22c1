"""The schema change topic of Debezium's MySQL and MariaDB connectors (``schema_change_topic``).

Debezium writes a record to the topic named by ``topic.prefix`` for every DDL statement it
reads: key ``{databaseName}``, value ``{source, ts_ms, databaseName, schemaName, ddl,
tableChanges}``, each table change ``{type: CREATE | ALTER | DROP, id: '"db"."table"', table}``
with the table's definition after the statement (``null`` for a DROP).

tidegate's MySQL source turns a DDL on a captured table into a ``schema_change`` control
message per table (``sources/mysql/source.py``): the statement, its kind, its binlog position
and the columns the binlog shows right after it (names and types from the next table map; None
when the binlog does not tell). :func:`table_change` maps that message to Debezium's table
change; lengths, character sets, nullability and the primary key come from the source's
catalog (:class:`~.envelope.TableInfo`, read once per run) where it knows the column.

What cannot match Debezium (docs/operations.md, "Debezium envelope"): one record per captured
table a statement changes (Debezium: one per statement, of every table of the server); default
values, comments and auto-increment are not known (``defaultValueExpression``, ``comment``
null, ``autoIncremented`` false); an integer's display width is the catalog's at the run, not
the statement's. The PostgreSQL connector has no schema change topic: for it, none is written.
"""

from __future__ import annotations

import re
from typing import Any

# tidegate's statement kinds (sources/mysql/ddl.py) as Debezium's change types; TRUNCATE is
# no schema change to Debezium (it is op "t" on the table's topic).
CHANGE_TYPES = {"create": "CREATE", "alter": "ALTER", "rename": "ALTER", "create_index": "ALTER",
                "drop_index": "ALTER", "drop": "DROP", "drop_database": "DROP"}

# java.sql.Types as Debezium's MySQL DDL parser gives them (checked against its own output).
JDBC_TYPES = {"tinyint": 5, "smallint": 5, "mediumint": 4, "int": 4, "integer": 4, "bigint": -5,
              "decimal": 3, "numeric": 3, "float": 6, "double": 8, "real": 8, "bit": -7, "bool": 16,
              "boolean": 16, "date": 91, "time": 92, "datetime": 93, "timestamp": 2014, "year": 4,
              "char": 1, "varchar": 12, "tinytext": 12, "text": 12, "mediumtext": 12, "longtext": 12,
              "binary": -2, "varbinary": -3, "tinyblob": 2004, "blob": 2004, "mediumblob": 2004,
              "longblob": 2004, "enum": 1, "set": 1, "json": 1111}
_TEXT = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"}
_SQL_TYPE = re.compile(r"^\s*([a-z]+)\s*(?:\((.*)\))?\s*(unsigned)?", re.IGNORECASE | re.DOTALL)


def _quoted_values(args: str) -> list[str]:
    """ENUM/SET values as Debezium lists them: each still in its single quotes."""
    return [m.group(0) for m in re.finditer(r"'(?:[^']|'')*'", args)]


def column_entry(name: str, sql_type: str, position: int, *, optional: bool, charset: str | None,
                 connector: str) -> dict[str, Any]:
    """One column of a table change (``io.debezium.connector.schema.Column``) from its SQL type
    as the catalog (``int(11) unsigned``) or the binlog (``int unsigned``) spells it."""
    m = _SQL_TYPE.match(sql_type or "")
    base, args, unsigned = (m.group(1).lower(), m.group(2), bool(m.group(3))) if m else ("", None, False)
    if base == "json" and connector == "mariadb":  # MariaDB's JSON is LONGTEXT with a check
        base = "longtext"
    length: int | None = None
    scale: int | None = None
    enum_values = None
    if base in ("enum", "set"):
        enum_values = _quoted_values(args or "")
        # Debezium's lengths: 1 for an ENUM, the joined values' length for a SET
        length = 1 if base == "enum" else len(",".join(v[1:-1] for v in enum_values))
    elif args:
        nums = [int(a) for a in args.split(",") if a.strip().isdigit()]
        length = nums[0] if nums else None
        scale = nums[1] if len(nums) > 1 else None
    type_name = base.upper() + (" UNSIGNED" if unsigned else "")
    return {"name": name, "jdbcType": JDBC_TYPES.get(base, 1111), "nativeType": None, "typeName": type_name,
            "typeExpression": type_name, "charsetName": charset if base in _TEXT else None,
            "length": length, "scale": scale, "position": position, "optional": optional,
            "autoIncremented": False, "generated": False, "comment": None, "defaultValueExpression": None,
            "enumValues": enum_values}


def table_change(fields: dict[str, Any], info: Any, connector: str, excluded: frozenset[str] = frozenset()
                 ) -> dict[str, Any] | None:
    """Debezium's table change for one ``schema_change`` message's fields (None for a TRUNCATE
    or a statement kind Debezium does not report); ``info`` is the catalog's
    :class:`~.envelope.TableInfo` of the table, or None; ``excluded``: the columns
    ``source.columns`` keeps inside the source (the message's own list is filtered already)."""
    kind = CHANGE_TYPES.get(str(fields.get("change")))
    db, table = fields.get("db") or fields.get("schema"), fields.get("table")
    if kind is None or table is None:
        return None
    columns = fields.get("columns")
    gone = columns == []  # the source's mark: the table no longer exists after the statement
    if gone:
        kind = "DROP"
    change = {"type": kind, "id": f'"{db}"."{table}"', "table": None}
    if kind == "DROP":
        return change
    catalog = dict(info.columns) if info is not None else {}
    nullable = info.nullable if info is not None else {}
    charsets = getattr(info, "charsets", None) or {}
    default_charset = getattr(info, "default_charset", None)
    if columns is None:  # the binlog did not tell: the catalog's definition at the run
        columns = [{"name": n, "type": t} for n, t in catalog.items() if n not in excluded]
    entries = []
    for i, col in enumerate(columns, 1):
        name, sql_type = col["name"], col["type"]
        known = catalog.get(name)
        # the catalog's spelling carries lengths the table map does not, when it is the same type
        if known is not None and _base(known) == _base(sql_type):
            sql_type = known
        entries.append(column_entry(name, sql_type, i, optional=nullable.get(name, True),
                                    charset=charsets.get(name) or default_charset, connector=connector))
    change["table"] = {"defaultCharsetName": default_charset,
                       "primaryKeyColumnNames": list(getattr(info, "primary_key", ()) or ()),
                       "columns": entries, "comment": None}
    return change


def _base(sql_type: str) -> str:
    m = _SQL_TYPE.match(sql_type or "")
    return (m.group(1).lower() + (" unsigned" if m.group(3) else "")) if m else ""


def key_schema(connector: str) -> dict[str, Any]:
    return {"type": "struct", "fields": [{"type": "string", "optional": False, "field": "databaseName"}],
            "optional": False, "name": f"io.debezium.connector.{connector}.SchemaChangeKey", "version": 1}


def value_schema(connector: str, source_schema: dict[str, Any]) -> dict[str, Any]:
    def f(t: str, name: str, optional: bool = True, **extra: Any) -> dict[str, Any]:
        return {"type": t, "optional": optional, **extra, "field": name}

    strings = {"type": "array", "items": {"type": "string", "optional": False}}
    column = {"type": "struct", "fields": [
        f("string", "name", False), f("int32", "jdbcType", False), f("int32", "nativeType"),
        f("string", "typeName", False), f("string", "typeExpression"), f("string", "charsetName"),
        f("int32", "length"), f("int32", "scale"), f("int32", "position", False), f("boolean", "optional"),
        f("boolean", "autoIncremented"), f("boolean", "generated"), f("string", "comment"),
        f("string", "defaultValueExpression"), {**strings, "optional": True, "field": "enumValues"}],
        "optional": False, "name": "io.debezium.connector.schema.Column", "version": 1}
    table = {"type": "struct", "fields": [
        f("string", "defaultCharsetName"), {**strings, "optional": True, "field": "primaryKeyColumnNames"},
        {"type": "array", "items": column, "optional": False, "field": "columns"}, f("string", "comment")],
        "optional": True, "name": "io.debezium.connector.schema.Table", "version": 1, "field": "table"}
    change = {"type": "struct", "fields": [f("string", "type", False), f("string", "id", False), table],
              "optional": False, "name": "io.debezium.connector.schema.Change", "version": 1}
    return {"type": "struct", "fields": [
        {**source_schema, "version": 1, "field": "source"}, f("int64", "ts_ms", False),
        f("string", "databaseName"), f("string", "schemaName"), f("string", "ddl"),
        {"type": "array", "items": change, "optional": False, "field": "tableChanges"}],
        "optional": False, "name": f"io.debezium.connector.{connector}.SchemaChangeValue", "version": 1}
