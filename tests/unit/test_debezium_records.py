"""``envelope: debezium``: the records one sink writes for tidegate's items (pure: the encoder
with a fixed clock and a catalog given by the test)."""

from __future__ import annotations

import base64
import json

from tidegate.debezium.envelope import DebeziumEncoder, DebeziumOptions, SourceInfo, TableInfo
from tidegate.events import ChangeEvent, ControlMessage, split_key_change
from tidegate.spec import load_spec_text

NOW_NS = 1_764_000_000_123_456_789
MARIADB = SourceInfo("mariadb", "", {"shop.orders": TableInfo(
    {"id": "int(11)", "total": "decimal(10,2)", "at": "datetime(6)", "tags": "set('a','b')"},
    {"id": False, "total": True, "at": True, "tags": True})})
POSTGRES = SourceInfo("postgresql", "appdb", {"public.items": TableInfo(
    {"id": "bigint", "price": "numeric(6,2)", "seen": "timestamp with time zone"},
    {"id": False, "price": True, "seen": True})})
# Debezium's context headers on every change record (its runId has no counterpart)
CONTEXT_HEADERS = [("__debezium.context.connectorLogicalName", b"orders"),
                   ("__debezium.context.taskId", b"0"), ("__debezium.context.connectorName", b"mariadb")]


def encoder(info: SourceInfo, **options) -> DebeziumEncoder:
    return DebeziumEncoder(DebeziumOptions(**options), "orders", lambda: info, clock=lambda: NOW_NS)


def mysql_event(op: str, before, after, key, *, tx="0-1-42", event_id="mysql-bin.000003:1234:1", order=1,
                tx_end=False, end=None) -> ChangeEvent:
    position = {"kind": "mysql", "file": "mysql-bin.000003", "pos": 1234, "server_id": 7}
    return ChangeEvent.native("default", "orders", "mysql", "shop", "shop", "orders", op, before, after, key,
                              tx, event_id, position, 1_700_000_000_000, order, order, "false", tx_end, end)


def pg_event(op: str, before, after, key, *, tx="771:0/16B3748", lsn="0/16B3700", end=None) -> ChangeEvent:
    return ChangeEvent.native("default", "orders", "postgresql", "public", "public", "items", op, before,
                              after, key, tx, f"{lsn}:0", {"lsn": lsn}, 1_700_000_000_000, 1, 1, "false",
                              end is not None, end)


def test_a_mariadb_insert_as_the_mariadb_connector_writes_it():
    row = {"id": 7, "total": "12.34", "at": "2024-01-02T03:04:05.000001", "tags": ["b", "a"]}
    [rec] = encoder(MARIADB).change_records(mysql_event("c", None, row, {"id": 7}))
    assert rec.topic == "orders.shop.orders"
    assert json.loads(rec.key) == {"id": 7} and rec.headers == CONTEXT_HEADERS
    value = json.loads(rec.value)
    assert list(value) == ["before", "after", "source", "transaction", "op", "ts_ms", "ts_us", "ts_ns"]
    assert value["before"] is None and value["op"] == "c" and value["transaction"] is None
    assert value["after"] == {"id": 7, "total": base64.b64encode(bytes([0x04, 0xD2])).decode(),
                              "at": 1704164645000001, "tags": "a,b"}
    assert (value["ts_ms"], value["ts_us"], value["ts_ns"]) == (NOW_NS // 10**6, NOW_NS // 1000, NOW_NS)
    assert value["source"] == {
        "version": "3.5.0.Final", "connector": "mariadb", "name": "orders", "ts_ms": 1_700_000_000_000,
        "snapshot": "false", "db": "shop", "sequence": None, "ts_us": 1_700_000_000_000_000,
        "ts_ns": 1_700_000_000_000_000_000, "table": "orders", "server_id": 7, "gtid": "0-1-42",
        "file": "mysql-bin.000003", "pos": 1234, "row": 1, "thread": None, "query": None}


def test_a_delete_is_followed_by_its_tombstone_unless_turned_off():
    ev = mysql_event("d", {"id": 7, "total": None, "at": None, "tags": []}, None, {"id": 7})
    delete, tombstone = encoder(MARIADB).change_records(ev)
    assert json.loads(delete.value)["op"] == "d" and json.loads(delete.value)["after"] is None
    assert tombstone.value is None and tombstone.key == delete.key and tombstone.topic == delete.topic
    assert len(encoder(MARIADB, tombstones_on_delete=False).change_records(ev)) == 1


def test_a_primary_key_change_is_a_delete_tombstone_and_create_naming_each_others_key():
    update = mysql_event("u", {"id": 1, "total": "1.00", "at": None, "tags": []},
                         {"id": 2, "total": "1.00", "at": None, "tags": []}, {"id": 2})
    delete, create = split_key_change(update, {"id": 1})
    enc = encoder(MARIADB)
    d, t = enc.change_records(delete)
    [c] = enc.change_records(create)
    assert json.loads(d.key) == {"id": 1} and json.loads(c.key) == {"id": 2}
    # the other key as Connect's header converter writes a struct: plain JSON, also with schemas on
    assert d.headers == [("__debezium.newkey", b'{"id":2}'), *CONTEXT_HEADERS]
    assert t.value is None and t.headers == d.headers
    assert c.headers == [("__debezium.oldkey", b'{"id":1}'), *CONTEXT_HEADERS]
    schemas = encoder(MARIADB, schemas=True)
    assert schemas.change_records(delete)[0].headers == d.headers
    assert json.loads(c.value)["op"] == "c" and json.loads(c.value)["before"] is None


def test_a_postgres_update_with_the_postgres_source_block():
    ev = pg_event("u", {"id": 1, "price": "1.50", "seen": None},
                  {"id": 1, "price": "2.50", "seen": "2024-01-02T03:04:05.100000+00:00"}, {"id": 1})
    [rec] = encoder(POSTGRES, topic_prefix="srv").change_records(ev)
    assert rec.topic == "srv.public.items"
    value = json.loads(rec.value)
    assert value["after"] == {"id": 1, "price": base64.b64encode((250).to_bytes(2, "big")).decode(),
                              "seen": "2024-01-02T03:04:05.100000Z"}
    lsn = (0x0 << 32) | 0x16B3700
    assert value["source"] == {
        "version": "3.6.1.Final", "connector": "postgresql", "name": "srv", "ts_ms": 1_700_000_000_000,
        "snapshot": "false", "db": "appdb",
        "sequence": json.dumps([None, str(lsn)]).replace(" ", ""),  # no commit seen before it yet
        "ts_us": 1_700_000_000_000_000, "ts_ns": 1_700_000_000_000_000_000, "schema": "public",
        "table": "items", "txId": 771, "lsn": lsn, "xmin": None, "origin": None, "origin_lsn": None}


def test_a_postgres_commit_time_in_microseconds_reaches_source_ts_us_but_not_tidegates_envelope():
    """PostgreSQL logs the commit time to the µs: Debezium writes it whole as source.ts_us/ts_ns
    and truncates it for ts_ms; tidegate's own envelope keeps its ms and its bytes, and the µs
    survive the trip from a reader process or a Spark task (a flat row) and a TRUNCATE."""
    from tidegate.shipped import item_to_row, row_to_item

    row = {"id": 1, "price": None, "seen": None}
    plain = pg_event("c", None, row, {"id": 1})
    ev = ChangeEvent.native(*(plain.__dict__[f] for f in (
        "tenant", "pipeline", "connector", "db", "schema", "table", "op", "before", "after", "key",
        "tx_id", "event_id", "position")), 1_700_000_000_000, 1, 1, commit_us=1_700_000_000_000_999)
    assert ev.value == plain.value and ev.key_bytes == plain.key_bytes  # tidegate's bytes: unchanged
    for item in (ev, row_to_item(item_to_row(ev))):
        src = json.loads(encoder(POSTGRES).change_records(item)[0].value)["source"]
        assert (src["ts_ms"], src["ts_us"], src["ts_ns"]) == (
            1_700_000_000_000, 1_700_000_000_000_999, 1_700_000_000_000_999_000)
    gone, made = split_key_change(pg_event("u", {"id": 1}, {"id": 2}, {"id": 2}), {"id": 1})
    assert gone.commit_us is None and made.commit_us is None
    gone, made = split_key_change(ChangeEvent.native(*(plain.__dict__[f] for f in (
        "tenant", "pipeline", "connector", "db", "schema", "table")), "u", {"id": 1}, {"id": 2}, {"id": 2},
        "771:0/16B3748", "0/16B3700:0", {"lsn": "0/16B3700"}, 1_700_000_000_001, 1, 1,
        commit_us=1_700_000_000_001_500), {"id": 1})
    assert gone.commit_us == made.commit_us == 1_700_000_000_001_500
    msg = ControlMessage("default", "orders", "schema_change", "0/16B3800:truncate:public.items",
                         {"lsn": "0/16B3800"}, 1_700_000_000_002,
                         {"change": "truncate", "db": "public", "schema": "public", "table": "items"},
                         tx_id="772:0/16B3900", commit_us=1_700_000_000_002_345)
    assert b"commit_us" not in msg.value
    for item in (msg, row_to_item(item_to_row(msg))):
        src = json.loads(encoder(POSTGRES, skipped_operations=()).truncate_records(item)[0].value)["source"]
        assert (src["ts_ms"], src["ts_us"], src["ts_ns"]) == (
            1_700_000_000_002, 1_700_000_000_002_345, 1_700_000_000_002_345_000)


def test_postgres_sequence_starts_with_where_the_previous_commit_ended():
    from tidegate.sources.postgres.position import Lsn, PgPosition

    enc = encoder(POSTGRES)
    row = {"id": 1, "price": None, "seen": None}
    first = pg_event("c", None, row, {"id": 1}, end=PgPosition(Lsn(0x16B3790)))
    second = pg_event("c", None, row, {"id": 1}, tx="772:0/16B3900", lsn="0/16B3800")

    def sequence(ev):
        return json.loads(json.loads(enc.change_records(ev)[0].value)["source"]["sequence"])
    assert sequence(first) == [None, str(0x16B3700)]
    assert sequence(second) == [str(0x16B3790), str(0x16B3800)]
    assert sequence(second) == [str(0x16B3790), str(0x16B3800)]  # a retry: the same bytes


def test_transaction_metadata_begin_and_end_around_a_transaction():
    enc = encoder(MARIADB, transaction_metadata=True)
    rows = [({"id": i, "total": None, "at": None, "tags": []}) for i in (1, 2)]
    recs = enc.change_records(mysql_event("c", None, rows[0], {"id": 1}, order=1))
    recs += enc.change_records(mysql_event("c", None, rows[1], {"id": 2}, event_id="mysql-bin.000003:1300:0",
                                           order=2, tx_end=True, end=object()))
    assert [r.topic for r in recs] == ["orders.transaction", "orders.shop.orders", "orders.shop.orders",
                                       "orders.transaction"]
    begin, end = json.loads(recs[0].value), json.loads(recs[3].value)
    assert begin == {"status": "BEGIN", "id": "0-1-42", "event_count": None, "data_collections": None,
                     "ts_ms": 1_700_000_000_000}
    assert end == {"status": "END", "id": "0-1-42", "event_count": 2,
                   "data_collections": [{"data_collection": "shop.orders", "event_count": 2}],
                   "ts_ms": 1_700_000_000_000}
    assert json.loads(recs[0].key) == {"id": "0-1-42"}
    assert [json.loads(r.value)["transaction"] for r in recs[1:3]] == [
        {"id": "0-1-42", "total_order": 1, "data_collection_order": 1},
        {"id": "0-1-42", "total_order": 2, "data_collection_order": 2}]


def test_truncate_is_op_t_when_not_skipped():
    msg = ControlMessage("default", "orders", "schema_change", "0/16B3800:truncate:public.items",
                         {"lsn": "0/16B3800"}, 1_700_000_000_000,
                         {"change": "truncate", "db": "public", "schema": "public", "table": "items"},
                         tx_id="772:0/16B3900")
    assert encoder(POSTGRES).truncate_records(msg) == []  # Debezium's default skips TRUNCATE
    [rec] = encoder(POSTGRES, skipped_operations=()).truncate_records(msg)
    value = json.loads(rec.value)
    assert rec.topic == "orders.public.items" and rec.key is None
    assert (value["op"], value["before"], value["after"]) == ("t", None, None)
    assert value["source"]["txId"] == 772 and value["source"]["lsn"] == 0x16B3800
    mysql_msg = ControlMessage("default", "orders", "schema_change", "mysql-bin.000003:900:shop.orders",
                               {"file": "mysql-bin.000003", "pos": 900}, 1_700_000_000_000,
                               {"change": "truncate", "db": "shop", "schema": "shop", "table": "orders"},
                               tx_id="0-1-43")
    [rec] = encoder(MARIADB, skipped_operations=()).truncate_records(mysql_msg)
    src = json.loads(rec.value)["source"]
    # a run's first TRUNCATE, before any change: row 0, as Debezium's binlog connectors after a start
    assert (src["file"], src["pos"], src["row"], src["gtid"]) == ("mysql-bin.000003", 900, 0, "0-1-43")
    assert rec.headers == CONTEXT_HEADERS
    [rec] = encoder(MARIADB, skipped_operations=(), schemas=True).truncate_records(mysql_msg)
    after = json.loads(rec.value)["schema"]["fields"][1]
    assert [f["field"] for f in after["fields"]] == ["id", "total", "at", "tags"]  # the table's columns


def test_a_binlog_truncate_repeats_the_previous_changes_row_and_opens_a_transaction_without_end():
    """Found by the generated comparison: Debezium's binlog connectors leave source.row of a
    TRUNCATE as the previous change's, and with transaction metadata write its BEGIN and a
    transaction block but no END (a TRUNCATE has no XID event)."""
    msg = ControlMessage("default", "orders", "schema_change", "mysql-bin.000003:900:shop.orders",
                         {"file": "mysql-bin.000003", "pos": 900}, 1_700_000_000_000,
                         {"change": "truncate", "db": "shop", "schema": "shop", "table": "orders"},
                         tx_id="0-1-43")
    enc = encoder(MARIADB, skipped_operations=(), transaction_metadata=True)
    enc.change_records(mysql_event("c", None, {"id": 7}, {"id": 7}, event_id="mysql-bin.000003:800:2",
                                   tx_end=True))
    begin, rec = enc.truncate_records(msg)
    value = json.loads(rec.value)
    assert value["source"]["row"] == 2
    assert value["transaction"] == {"id": "0-1-43", "total_order": 1, "data_collection_order": 1}
    assert begin.topic == "orders.transaction" and json.loads(begin.value)["status"] == "BEGIN"
    assert json.loads(begin.value)["id"] == "0-1-43"
    # a retried sub-batch gives the same bytes, whatever was written since
    enc.change_records(mysql_event("c", None, {"id": 8}, {"id": 8}, event_id="mysql-bin.000003:950:0"))
    assert json.loads(enc.truncate_records(msg)[1].value)["source"]["row"] == 2


def test_schemas_true_wraps_key_and_value_with_the_connect_schema():
    row = {"id": 7, "total": "12.34", "at": None, "tags": ["a"]}
    [rec] = encoder(MARIADB, schemas=True).change_records(mysql_event("c", None, row, {"id": 7}))
    key, value = json.loads(rec.key), json.loads(rec.value)
    assert key == {"schema": {"type": "struct", "optional": False, "name": "orders.shop.orders.Key",
                              "fields": [{"type": "int32", "optional": False, "field": "id"}]},
                   "payload": {"id": 7}}
    schema = value["schema"]
    assert schema["name"] == "orders.shop.orders.Envelope"
    assert [f["field"] for f in schema["fields"]] == ["before", "after", "source", "transaction", "op",
                                                     "ts_ms", "ts_us", "ts_ns"]
    after = schema["fields"][1]
    assert after["name"] == "orders.shop.orders.Value" and after["optional"] is True
    assert after["fields"][1] == {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                                  "version": 1,
                                  "parameters": {"scale": "2", "connect.decimal.precision": "10"},
                                  "optional": True, "field": "total"}
    assert schema["fields"][2]["name"] == "io.debezium.connector.mariadb.Source"
    assert value["payload"]["after"]["total"] == base64.b64encode(bytes([0x04, 0xD2])).decode()


def test_a_column_default_is_in_its_field_schema_converted_as_its_values():
    info = SourceInfo("mariadb", "", {"shop.orders": TableInfo(
        {"id": "int(11)", "total": "decimal(10,2)", "n": "int(11)", "note": "varchar(9)", "pt": "point"},
        {"id": False, "total": True, "n": True, "note": True, "pt": True},
        {"total": "1.50", "n": "7", "note": "it's", "pt": "POINT(0 0)"})})
    row = {"id": 1, "total": None, "n": None, "note": None, "pt": None}
    [rec] = encoder(info, schemas=True).change_records(mysql_event("c", None, row, {"id": 1}))
    fields = {f["field"]: f for f in json.loads(rec.value)["schema"]["fields"][1]["fields"]}
    assert fields["n"]["default"] == 7 and fields["note"]["default"] == "it's"
    assert fields["total"]["default"] == base64.b64encode(b"\x00\x96").decode()  # 150, sign byte
    assert "default" not in fields["id"] and "default" not in fields["pt"]  # none; a composite


def test_options_from_the_spec_and_their_errors():
    spec = load_spec_text("""
pipeline: p
source: {kind: postgres, conn_id: pg}
sinks:
  - {id: k, kind: kafka, conn_id: c, envelope: debezium,
     debezium: {topic_prefix: srv, schemas: true, decimal_handling_mode: string, time_precision_mode: connect,
                binary_handling_mode: hex, bigint_unsigned_handling_mode: precise, skipped_operations: [],
                transaction_metadata: true}}
""")
    opts = spec.sinks[0].debezium
    assert spec.sinks[0].envelope == "debezium" and spec.sinks[0].topic == ""
    assert opts.modes_for("postgresql").time == "connect" and opts.skipped_operations == ()
    assert DebeziumOptions().modes_for("postgresql").time == "adaptive"
    assert DebeziumOptions().modes_for("mariadb").time == "adaptive_time_microseconds"
    from tidegate.spec import Problems, _check_text  # noqa: PLC0415 - the validation's own messages

    _, problems = _check_text("""
pipeline: p
source: {kind: postgres, conn_id: pg}
sinks:
  - {id: k, kind: kafka, conn_id: c, topic: t, debezium: {schemas: true}}
  - {id: j, kind: kafka, conn_id: c, envelope: debezium, debezium: {decimal_handling_mode: exact, nope: 1}}
""", "<t>", None, Problems("<t>"))
    text = "\n".join(problems)
    assert "sinks[0].debezium" in text and "envelope: debezium" in text
    assert "sinks[1].debezium.decimal_handling_mode" in text and "precise | string | double" in text
    assert "sinks[1].debezium.nope" in text


def test_catalog_defaults_as_the_sources_read_them():
    from tidegate.sources.mysql.snapshot import _default_literal as mysql_default
    from tidegate.sources.postgres.snapshot import _default_literal as postgres_default

    # MariaDB: SQL text (strings quoted, NULL a word), the quotes' content kept as written, as
    # Debezium's parser of SHOW CREATE TABLE keeps it; MySQL: the bare value, expressions flagged
    assert [mysql_default(d, "", True) for d in ("7", "'it''s'", "'a\\\\b'", "NULL", "current_timestamp()",
                                                  None)] == ["7", "it''s", "a\\\\b", None, None, None]
    assert mysql_default("abc", "", False) == "abc"
    assert mysql_default("b'101'", "", True) == "b'101'"  # a BIT default: the envelope reads its bits
    assert mysql_default("CURRENT_TIMESTAMP", "DEFAULT_GENERATED", False) is None
    # PostgreSQL: a quoted default up to its first quote, as Debezium's '(.*?)' reads it: an
    # escaped quote ends it (the generated comparison, seeds 31-40: 'it''s' is "it")
    assert [postgres_default(d) for d in ("7", "'-1'::integer", "'a''b'::character varying", "true",
                                          "nextval('t_id_seq'::regclass)", "now()", None)] == [
        "7", "-1", "a", "true", "0", None, None]


def test_defaults_as_debeziums_default_parsers_read_them():
    """Where Debezium reads a default otherwise than the column's values (the generated
    comparison's seeds 14, 15, 25, 28): a MariaDB BIGINT default through a double (rounded beyond
    2^53, saturated beyond a long), a FLOAT(7,3) default not widened from a float; PostgreSQL's
    time 24:00:00 default is 23:59:59.999999999, an empty BIT VARYING(1) default none."""
    info = SourceInfo("mariadb", "shop", {"shop.orders": TableInfo(
        {"id": "int(11)", "b": "bigint(20)", "u": "bigint(20) unsigned", "f": "float(7,3)"},
        {"id": False, "b": True, "u": True, "f": True},
        {"b": "5836695642711428122", "u": "18446744073709551615", "f": "-0.001"})})
    ev = mysql_event("c", None, {"id": 1, "b": None, "u": None, "f": None}, {"id": 1})
    [rec] = encoder(info).change_records(ev)
    assert json.loads(rec.value)["after"] == {"id": 1, "b": 5836695642711428096, "u": 9223372036854775807,
                                              "f": -0.001}
    pg = SourceInfo("postgresql", "appdb", {"public.items": TableInfo(
        {"id": "integer", "t": "time without time zone", "vb": "bit varying(1)"},
        {"id": False, "t": True, "vb": True}, {"t": "24:00:00", "vb": ""},
        type_names={"id": "int4", "t": "time", "vb": "varbit"})})
    after, fields = _after_and_fields(pg, pg_event("c", None, {"id": 1, "t": None, "vb": ""}, {"id": 1}))
    assert (fields["t"].get("default"), fields["vb"].get("default")) == (86399999999, None)
    assert after == {"id": 1, "t": 86399999999, "vb": None}


def _after_and_fields(info: SourceInfo, ev) -> tuple[dict, dict]:
    [rec] = encoder(info, schemas=True).change_records(ev)[:1]
    value = json.loads(rec.value)
    fields = {f["field"]: f for f in value["schema"]["fields"][1]["fields"]}
    return value["payload"]["after"], fields


def test_defaults_of_every_logical_type_and_null_written_as_the_default():
    """Debezium's output for tests/compat's t_defaults: the default in the field schema as the
    column's values are converted, and a NULL in such a column written as the default (Kafka
    Connect's Struct and JSON converter replace null with the schema's default)."""
    types = {"id": "int(11)", "i": "int(11)", "dt": "date", "dtm": "datetime", "tm3": "time(3)",
             "b12": "bit(12)", "biu": "bigint(20) unsigned", "d": "decimal(6,2)"}
    info = SourceInfo("mariadb", "", {"shop.orders": TableInfo(
        types, dict.fromkeys(types, True) | {"id": False},
        {"i": "5", "dt": "2020-01-02", "dtm": "2020-01-02 03:04:05", "tm3": "12:34:56.789",
         "b12": "b'101'", "biu": "18446744073709551615", "d": "1.50"})})
    nulls = dict.fromkeys(types) | {"id": 1}
    after, fields = _after_and_fields(info, mysql_event("c", None, nulls, {"id": 1}))
    want = {"i": 5, "dt": 18263, "dtm": 1577934245000, "tm3": 45296789000, "b12": "BQA=",
            "biu": 9223372036854775807, "d": "AJY="}
    assert {c: fields[c].get("default") for c in want} == want
    assert after == {"id": 1, **want}
    # a value is itself, the unsigned maximum wrapped as the connector does
    after, _ = _after_and_fields(info, mysql_event("c", None, dict.fromkeys(types) | {
        "id": 2, "i": 1, "biu": 18446744073709551615}, {"id": 2}))
    assert (after["i"], after["biu"]) == (1, -1)


def test_postgres_date_and_timestamp_defaults_and_no_bytea_default():
    info = SourceInfo("postgresql", "appdb", {"public.items": TableInfo(
        {"id": "integer", "dt": "date", "ts": "timestamp without time zone",
         "ts3": "timestamp(3) without time zone", "by": "bytea"},
        {"id": False, "dt": True, "ts": True, "ts3": True, "by": True},
        {"dt": "2020-01-02", "ts": "2020-01-02 03:04:05", "ts3": "2020-01-02 03:04:05.678",
         "by": "\\x00ff"},
        type_names={"id": "int4", "dt": "date", "ts": "timestamp", "ts3": "timestamp", "by": "bytea"})})
    after, fields = _after_and_fields(info, pg_event("c", None, {"id": 1, "dt": None, "ts": None, "ts3": None,
                                                                  "by": None}, {"id": 1}))
    assert [fields[c].get("default") for c in ("dt", "ts", "ts3", "by")] == [
        18263, 1577934245000000, 1577934245678, None]
    assert after == {"id": 1, "dt": 18263, "ts": 1577934245000000, "ts3": 1577934245678, "by": None}


def test_postgres_defaults_only_of_the_types_debezium_parses():
    """Debezium's PostgreSQL connector parses the defaults of some types only: inet, macaddr,
    timetz, money and any domain (named by its own type name) have none, so a NULL written there
    stays null; bit and varbit defaults are bytes (the generated comparison's seeds 2, 4, 7, 8)."""
    cols = {"id": "integer", "ip": "inet", "mac": "macaddr", "tz": "time with time zone", "m": "money",
            "pos": "integer", "b9": "bit(9)", "vb": "bit varying(17)"}
    info = SourceInfo("postgresql", "appdb", {"public.items": TableInfo(
        cols, {c: c != "id" for c in cols},
        {"ip": "10.1.2.3", "mac": "00:00:00:00:00:00", "tz": "23:59:59+05:30", "m": "12.5", "pos": "7",
         "b9": "111111111", "vb": ""},
        type_names={"id": "int4", "ip": "inet", "mac": "macaddr", "tz": "timetz", "m": "money",
                    "pos": "posint", "b9": "bit", "vb": "varbit"})})
    after, fields = _after_and_fields(info, pg_event("c", None, dict.fromkeys(cols) | {"id": 1}, {"id": 1}))
    assert {c: fields[c].get("default") for c in cols if c != "id"} == {
        "ip": None, "mac": None, "tz": None, "m": None, "pos": None, "b9": "/wE=", "vb": ""}
    assert after == {"id": 1, "ip": None, "mac": None, "tz": None, "m": None, "pos": None, "b9": "/wE=",
                     "vb": ""}


def test_a_decimal_key_in_the_key_change_headers_is_its_number():
    """SimpleHeaderConverter writes a Decimal field of the key struct as its number at the
    column's scale, not as the bytes the record's JSON converter writes (seed 10)."""
    info = SourceInfo("postgresql", "appdb", {"public.items": TableInfo(
        {"id": "numeric(22,2)", "v": "text"}, {"id": False, "v": True},
        type_names={"id": "numeric", "v": "text"})})
    update = pg_event("u", {"id": "1.5", "v": "a"}, {"id": "82363007491812695921", "v": "a"},
                      {"id": "82363007491812695921"})
    delete, create = split_key_change(update, {"id": "1.5"})
    d, _ = encoder(info).change_records(delete)
    [c] = encoder(info).change_records(create)
    assert dict(d.headers)["__debezium.newkey"] == b'{"id":82363007491812695921.00}'
    assert dict(c.headers)["__debezium.oldkey"] == b'{"id":1.50}'


def test_postgres_replica_identity_default_old_rows_as_debezium_writes_them():
    """Under REPLICA IDENTITY DEFAULT the log holds only the key of the old row: Debezium's
    UPDATE that kept the key has before null, its DELETE every column (null where unknown),
    and the Value schema lists every column (tests/compat, t_ident)."""
    info = SourceInfo("postgresql", "appdb", {"public.items": TableInfo(
        {"id": "integer", "v": "text", "n": "integer"}, {"id": False, "v": True, "n": True})})
    enc = encoder(info, schemas=True)
    [upd] = enc.change_records(pg_event("u", {"id": 1}, {"id": 1, "v": "x", "n": 2}, {"id": 1}))
    value = json.loads(upd.value)
    assert value["payload"]["before"] is None and value["payload"]["after"] == {"id": 1, "v": "x", "n": 2}
    assert [f["field"] for f in value["schema"]["fields"][0]["fields"]] == ["id", "v", "n"]
    dele = enc.change_records(pg_event("d", {"id": 3}, None, {"id": 3}))[0]
    value = json.loads(dele.value)
    assert value["payload"]["before"] == {"id": 3, "v": None, "n": None}
    assert [f["field"] for f in value["schema"]["fields"][0]["fields"]] == ["id", "v", "n"]
    # REPLICA IDENTITY FULL: the whole old row, kept
    [full] = enc.change_records(pg_event("u", {"id": 1, "v": "a", "n": 1}, {"id": 1, "v": "b", "n": 1},
                                         {"id": 1}))
    assert json.loads(full.value)["payload"]["before"] == {"id": 1, "v": "a", "n": 1}


def test_a_skipped_truncate_still_moves_the_next_sequence():
    from tidegate.sources.postgres.position import Lsn, PgPosition

    enc = encoder(POSTGRES)  # TRUNCATE skipped, as by default
    msg = ControlMessage("default", "orders", "schema_change", "0/16B3800:truncate:public.items",
                         {"lsn": "0/16B3800"}, 1_700_000_000_000,
                         {"change": "truncate", "db": "public", "schema": "public", "table": "items"},
                         tx_id="772:0/16B3900", tx_end=True, end_position=PgPosition(Lsn(0x16B3900)))
    assert enc.records([msg]) == []
    row = {"id": 1, "price": None, "seen": None}
    [rec] = enc.change_records(pg_event("c", None, row, {"id": 1}, tx="773:0/16B3A00", lsn="0/16B3980"))
    assert json.loads(json.loads(rec.value)["source"]["sequence"]) == [str(0x16B3900), str(0x16B3980)]
