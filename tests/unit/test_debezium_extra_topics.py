"""``envelope: debezium``: the schema change topic and heartbeats (pure: the encoder with a fixed
clock and a catalog given by the test). The expected shapes are Debezium's own output for the
same statements (the MariaDB connector 3.5.0.Final, captured by the compat harness)."""

from __future__ import annotations

import json

from tidegate.debezium.envelope import DebeziumEncoder, DebeziumOptions, SourceInfo, TableInfo
from tidegate.debezium.schema_changes import column_entry
from tidegate.events import ControlMessage
from tidegate.sources.mysql.position import BinlogPosition
from tidegate.spec import load_spec_text

NOW_NS = 1_764_000_000_123_456_789
# t_alter after ALTER TABLE ... ADD COLUMN extra INT NULL DEFAULT 7, as information_schema says
ALTERED = TableInfo({"id": "int(11)", "v": "varchar(20)", "extra": "int(11)"},
                    {"id": False, "v": True, "extra": True}, primary_key=("id",),
                    charsets={"v": "utf8mb4"}, default_charset="utf8mb4")
MARIADB = SourceInfo("mariadb", "", {"shop.t_alter": ALTERED}, server_id=1)
POSTGRES = SourceInfo("postgresql", "appdb", {})


def encoder(info: SourceInfo, **options) -> DebeziumEncoder:
    return DebeziumEncoder(DebeziumOptions(**options), "orders", lambda: info, clock=lambda: NOW_NS)


def ddl(change: str, query: str, columns, table: str = "t_alter") -> ControlMessage:
    """A schema_change message as the MySQL source makes it (sources/mysql/source.py)."""
    return ControlMessage("default", "orders", "schema_change", f"mysql-bin.000158:72880563:shop.{table}",
                          {"file": "mysql-bin.000158", "pos": 72880563, "gtid": "0-1-503364"},
                          1_795_777_391_000,
                          {"change": change, "ddl": query, "db": "shop", "schema": "shop", "table": table,
                           "columns": columns}, tx_id="0-1-503364")


ADD_COLUMN = ddl("alter", "ALTER TABLE shop.t_alter ADD COLUMN extra INT NULL DEFAULT 7",
                 [{"name": "id", "type": "int"}, {"name": "v", "type": "varchar"},
                  {"name": "extra", "type": "int"}])


def test_an_add_column_as_the_mariadb_connector_writes_it():
    rec = encoder(MARIADB, schema_change_topic=True).schema_change_record(ADD_COLUMN)
    assert rec.topic == "orders" and json.loads(rec.key) == {"databaseName": "shop"}
    assert dict(rec.headers)["__debezium.context.connectorLogicalName"] == b"orders"
    value = json.loads(rec.value)
    assert list(value) == ["source", "ts_ms", "databaseName", "schemaName", "ddl", "tableChanges"]
    assert value["ts_ms"] == NOW_NS // 10**6 and value["databaseName"] == "shop"
    assert value["schemaName"] is None and value["ddl"] == ADD_COLUMN.fields["ddl"]
    assert value["source"] == {
        "version": "3.5.0.Final", "connector": "mariadb", "name": "orders", "ts_ms": 1_795_777_391_000,
        "snapshot": "false", "db": "shop", "sequence": None, "ts_us": 1_795_777_391_000_000,
        "ts_ns": 1_795_777_391_000_000_000, "table": "t_alter", "server_id": 1, "gtid": "0-1-503364",
        "file": "mysql-bin.000158", "pos": 72880563, "row": 0, "thread": None, "query": None}
    [change] = value["tableChanges"]
    assert (change["type"], change["id"]) == ("ALTER", '"shop"."t_alter"')
    table = change["table"]
    assert (table["defaultCharsetName"], table["primaryKeyColumnNames"]) == ("utf8mb4", ["id"])
    assert table["comment"] is None
    common = {"nativeType": None, "scale": None, "autoIncremented": False, "generated": False,
              "comment": None, "defaultValueExpression": None, "enumValues": None}
    assert table["columns"] == [
        {"name": "id", "jdbcType": 4, "typeName": "INT", "typeExpression": "INT", "charsetName": None,
         "length": 11, "position": 1, "optional": False, **common},
        {"name": "v", "jdbcType": 12, "typeName": "VARCHAR", "typeExpression": "VARCHAR",
         "charsetName": "utf8mb4", "length": 20, "position": 2, "optional": True, **common},
        {"name": "extra", "jdbcType": 4, "typeName": "INT", "typeExpression": "INT", "charsetName": None,
         "length": 11, "position": 3, "optional": True, **common}]
    for entry in table["columns"]:  # the key order of Debezium's Column struct
        assert list(entry) == ["name", "jdbcType", "nativeType", "typeName", "typeExpression", "charsetName",
                               "length", "scale", "position", "optional", "autoIncremented", "generated",
                               "comment", "defaultValueExpression", "enumValues"]


def test_drops_truncates_postgres_and_the_default_write_no_schema_change_record():
    drop = ddl("drop", "DROP TABLE shop.t_alter", [])
    [change] = json.loads(encoder(MARIADB, schema_change_topic=True).schema_change_record(drop).value)[
        "tableChanges"]
    assert change == {"type": "DROP", "id": '"shop"."t_alter"', "table": None}
    assert encoder(MARIADB).schema_change_record(ADD_COLUMN) is None  # off by default
    truncate = ddl("truncate", "TRUNCATE TABLE shop.t_alter", None)
    assert encoder(MARIADB, schema_change_topic=True).schema_change_record(truncate) is None
    pg = ControlMessage("default", "orders", "schema_change", "0/16B3800:columns:public.items",
                        {"lsn": "0/16B3800"}, 1, {"change": "columns", "db": "public", "schema": "public",
                                                  "table": "items", "columns": []})
    assert encoder(POSTGRES, schema_change_topic=True).schema_change_record(pg) is None


def test_columns_the_binlog_does_not_tell_come_from_the_catalog():
    rec = encoder(MARIADB, schema_change_topic=True).schema_change_record(
        ddl("create_index", "CREATE INDEX iv ON shop.t_alter (v)", None))
    [change] = json.loads(rec.value)["tableChanges"]
    assert change["type"] == "ALTER"
    assert [(c["name"], c["typeName"], c["length"]) for c in change["table"]["columns"]] == [
        ("id", "INT", 11), ("v", "VARCHAR", 20), ("extra", "INT", 11)]
    # a column source.columns excludes is not named by the catalog's definition either
    hiding = DebeziumEncoder(DebeziumOptions(schema_change_topic=True), "orders", lambda: MARIADB,
                             clock=lambda: NOW_NS, excluded=lambda db, t: frozenset({"v"}))
    rec = hiding.schema_change_record(ddl("create_index", "CREATE INDEX ie ON shop.t_alter (extra)", None))
    columns = json.loads(rec.value)["tableChanges"][0]["table"]["columns"]
    assert [c["name"] for c in columns] == ["id", "extra"]


def test_column_types_as_debeziums_ddl_parser_names_them():
    def entry(sql_type: str, connector: str = "mariadb"):
        e = column_entry("c", sql_type, 1, optional=True, charset="utf8mb4", connector=connector)
        return e["jdbcType"], e["typeName"], e["charsetName"], e["length"], e["scale"], e["enumValues"]
    assert entry("tinyint(3) unsigned") == (5, "TINYINT UNSIGNED", None, 3, None, None)
    assert entry("bigint(20) unsigned") == (-5, "BIGINT UNSIGNED", None, 20, None, None)
    assert entry("decimal(38,10)") == (3, "DECIMAL", None, 38, 10, None)
    assert entry("bit(12)") == (-7, "BIT", None, 12, None, None)
    assert entry("timestamp(3)") == (2014, "TIMESTAMP", None, 3, None, None)
    assert entry("datetime") == (93, "DATETIME", None, None, None, None)
    assert entry("char(10)") == (1, "CHAR", "utf8mb4", 10, None, None)
    assert entry("mediumtext") == (12, "MEDIUMTEXT", "utf8mb4", None, None, None)
    assert entry("varbinary(16)") == (-3, "VARBINARY", None, 16, None, None)
    assert entry("blob") == (2004, "BLOB", None, None, None, None)
    assert entry("enum('red','green','blue')") == (1, "ENUM", "utf8mb4", 1, None,
                                                   ["'red'", "'green'", "'blue'"])
    assert entry("set('a','b','c')") == (1, "SET", "utf8mb4", 5, None, ["'a'", "'b'", "'c'"])
    assert entry("json") == (12, "LONGTEXT", "utf8mb4", None, None, None)  # MariaDB's JSON
    assert entry("geometry")[:2] == (1111, "GEOMETRY")


def test_schemas_true_gives_the_schema_change_key_and_value_schemas():
    rec = encoder(MARIADB, schema_change_topic=True, schemas=True).schema_change_record(ADD_COLUMN)
    key, value = json.loads(rec.key), json.loads(rec.value)
    assert key == {"schema": {"type": "struct", "fields": [{"type": "string", "optional": False,
                                                            "field": "databaseName"}],
                              "optional": False, "name": "io.debezium.connector.mariadb.SchemaChangeKey",
                              "version": 1},
                   "payload": {"databaseName": "shop"}}
    schema = value["schema"]
    assert schema["name"] == "io.debezium.connector.mariadb.SchemaChangeValue"
    assert [f["field"] for f in schema["fields"]] == ["source", "ts_ms", "databaseName", "schemaName", "ddl",
                                                     "tableChanges"]
    assert schema["fields"][0]["name"] == "io.debezium.connector.mariadb.Source"
    column = schema["fields"][5]["items"]["fields"][2]["fields"][2]["items"]
    assert column["name"] == "io.debezium.connector.schema.Column"
    assert [f["field"] for f in column["fields"]] == list(json.loads(
        encoder(MARIADB, schema_change_topic=True).schema_change_record(ADD_COLUMN).value
    )["tableChanges"][0]["table"]["columns"][0])
    assert value["payload"]["tableChanges"][0]["type"] == "ALTER"


def test_a_heartbeat_as_debezium_writes_it_with_the_position_it_carries():
    enc = encoder(MARIADB, heartbeat_interval_ms=1000)
    where = BinlogPosition("mysql-bin.000158", 72881200)
    rec = enc.heartbeat_record(where)
    assert rec.topic == "__debezium-heartbeat.orders"
    assert json.loads(rec.key) == {"serverName": "orders"}
    assert json.loads(rec.value) == {"ts_ms": NOW_NS // 10**6}
    # the position alone: Debezium's heartbeats carry no context headers (generated comparison)
    assert [k for k, _ in rec.headers] == ["tidegate.position"]
    assert json.loads(dict(rec.headers)["tidegate.position"]) == where.to_json()
    wrapped = encoder(MARIADB, heartbeat_interval_ms=1000, schemas=True).heartbeat_record(where)
    assert json.loads(wrapped.value) == {
        "schema": {"type": "struct", "fields": [{"type": "int64", "optional": False, "field": "ts_ms"}],
                   "optional": False, "name": "io.debezium.connector.common.Heartbeat", "version": 1},
        "payload": {"ts_ms": NOW_NS // 10**6}}
    assert json.loads(wrapped.key)["schema"]["version"] == 1
    assert json.loads(wrapped.key)["payload"] == {"serverName": "orders"}


def test_the_options_in_a_spec_and_their_errors():
    spec = load_spec_text("""
pipeline: p
source: {kind: mysql, conn_id: db}
sinks:
  - {id: k, kind: kafka, conn_id: c, envelope: debezium,
     debezium: {schema_change_topic: true, heartbeat_interval_ms: 5000}}
  - {id: j, kind: kafka, conn_id: c, envelope: debezium}
  - {id: t, kind: kafka, conn_id: c, topic: x}
""")
    k, j, t = spec.sinks
    assert (k.debezium.schema_change_topic, k.debezium.heartbeat_interval_ms, k.heartbeat_interval_ms) == (
        True, 5000, 5000)
    assert (j.debezium.schema_change_topic, j.heartbeat_interval_ms, t.heartbeat_interval_ms) == (False, 0, 0)
    from tidegate.spec import Problems, _check_text  # noqa: PLC0415 - the validation's own messages

    _, problems = _check_text("""
pipeline: p
source: {kind: mysql, conn_id: db}
sinks:
  - {id: k, kind: kafka, conn_id: c, envelope: debezium,
     debezium: {schema_change_topic: maybe, heartbeat_interval_ms: -1}}
""", "<t>", None, Problems("<t>"))
    text = "\n".join(problems)
    assert "sinks[0].debezium.schema_change_topic" in text
    assert "sinks[0].debezium.heartbeat_interval_ms" in text
