"""``envelope: debezium`` values: every column type of MySQL/MariaDB and PostgreSQL in each of
Debezium's value modes, from tidegate's JSON-native value to Debezium's, with the field schema."""

from __future__ import annotations

import base64
import struct

import pytest
from tidegate.debezium.values import (
    Modes,
    column_mapping,
    interval_micros,
    mysql_mapping,
    postgres_mapping,
    unscaled_bytes,
    zoned_timestamp,
)

MY = Modes()  # the MySQL/MariaDB connector's defaults
PG = Modes(time="adaptive")  # the PostgreSQL connector's defaults


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def my(sql: str, value, modes: Modes = MY):
    m = mysql_mapping(sql, modes)
    return m.convert(value), m.schema


def pg(sql: str, value, modes: Modes = PG):
    m = postgres_mapping(sql, modes)
    return m.convert(value), m.schema


@pytest.mark.parametrize("sql,value,expected,schema_type", [
    ("tinyint(4)", -128, -128, "int16"),
    ("tinyint(3) unsigned", 255, 255, "int16"),
    ("tinyint(1)", 1, 1, "int16"),  # Debezium maps TINYINT(1) to INT16 by default
    ("smallint(6)", -32768, -32768, "int16"),
    ("smallint(5) unsigned", 65535, 65535, "int32"),
    ("mediumint(9)", -8388608, -8388608, "int32"),
    ("mediumint(8) unsigned", 16777215, 16777215, "int32"),
    ("int(11)", -2147483648, -2147483648, "int32"),
    ("int(10) unsigned", 4294967295, 4294967295, "int64"),
    ("bigint(20)", -9223372036854775808, -9223372036854775808, "int64"),
    ("float", 1.5, 1.5, "float"),
    ("double", 2.25, 2.25, "double"),
    ("char(3)", "abc", "abc", "string"),
    ("varchar(10)", "żółw 🐢", "żółw 🐢", "string"),
    ("longtext", "t", "t", "string"),
])
def test_mysql_plain_types(sql, value, expected, schema_type):
    assert my(sql, value) == (expected, {"type": schema_type})


def test_mysql_bigint_unsigned_long_wraps_and_precise_is_a_decimal():
    assert my("bigint(20) unsigned", 18446744073709551615) == (-1, {"type": "int64"})
    assert my("bigint(20) unsigned", 5)[0] == 5
    value, schema = my("bigint(20) unsigned", 18446744073709551615, Modes(bigint_unsigned="precise"))
    assert base64.b64decode(value) == (18446744073709551615).to_bytes(9, "big", signed=True)
    assert schema["name"] == "org.apache.kafka.connect.data.Decimal" and schema["parameters"]["scale"] == "0"


def test_decimal_modes():
    value, schema = my("decimal(10,2)", "12.34")
    assert value == b64(bytes([0x04, 0xD2]))  # 1234, big-endian two's complement
    assert schema == {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
                      "parameters": {"scale": "2", "connect.decimal.precision": "10"}}
    assert my("decimal(10,2)", "-0.01")[0] == b64(b"\xff")
    assert my("decimal(5,0)", "128")[0] == b64(b"\x00\x80")  # the sign bit needs a leading byte
    assert my("decimal(10,2)", "12.34", Modes(decimal="string")) == ("12.34", {"type": "string"})
    assert my("decimal(10,2)", "12.34", Modes(decimal="double")) == (12.34, {"type": "double"})
    assert pg("numeric(8,3)", "1.500")[0] == b64((1500).to_bytes(2, "big"))
    # 38 digits: beyond Python's default 28-digit decimal context, still exact
    unscaled = 12345678901234567890123456780123456789
    assert my("decimal(38,10)", "1234567890123456789012345678.0123456789")[0] == b64(
        unscaled.to_bytes(16, "big", signed=True))


def test_unscaled_bytes_is_the_shortest_twos_complement():
    from decimal import Decimal
    assert unscaled_bytes(Decimal("0"), 0) == b"\x00"
    assert unscaled_bytes(Decimal("127"), 0) == b"\x7f"
    assert unscaled_bytes(Decimal("-128"), 0) == b"\x80"
    assert unscaled_bytes(Decimal("-129"), 0) == b"\xff\x7f"
    assert unscaled_bytes(Decimal("1.5"), 3) == (1500).to_bytes(2, "big")


def test_postgres_numeric_without_scale_is_a_variable_scale_decimal():
    value, schema = pg("numeric", "-1.250")
    # trailing fraction zeros stripped, as Debezium does (tests/compat: 1.50 is 15 at scale 1)
    assert value == {"scale": 2, "value": b64((-125).to_bytes(1, "big", signed=True))}
    assert schema["name"] == "io.debezium.data.VariableScaleDecimal"
    assert [f["field"] for f in schema["fields"]] == ["scale", "value"]
    assert pg("numeric", None)[0] is None  # numeric NaN arrives as null
    assert pg("numeric", "7", Modes(decimal="string"))[0] == "7"


def test_bits():
    assert my("bit(1)", "1") == (True, {"type": "boolean"})
    assert my("bit(1)", "0")[0] is False
    value, schema = my("bit(10)", "1000000001")
    assert base64.b64decode(value) == bytes([0x01, 0x02])  # 513 little-endian, 2 bytes
    assert schema == {"type": "bytes", "name": "io.debezium.data.Bits", "version": 1,
                      "parameters": {"length": "10"}}
    assert base64.b64decode(my("bit(64)", "1" + "0" * 63)[0]) == (1 << 63).to_bytes(8, "little")
    assert pg("bit(1)", "1")[0] is True
    assert base64.b64decode(pg("bit(3)", "101")[0]) == b"\x05"
    # PostgreSQL's bits are Java's BitSet bytes: high zero bytes dropped, none for all zeros
    assert base64.b64decode(pg("bit(12)", "101010101010")[0]) == b"\xaa\x0a"
    assert pg("bit(12)", "000000000000")[0] == ""
    assert pg("bit varying(16)", "")[0] == ""
    assert base64.b64decode(pg("bit varying(16)", "1011")[0]) == b"\x0b"
    assert base64.b64decode(my("bit(12)", "000000000000")[0]) == b"\x00\x00"  # MySQL: n/8 bytes


def test_binary_modes():
    raw = b"\x00\xfe\xff"
    assert my("varbinary(8)", b64(raw)) == (b64(raw), {"type": "bytes"})
    assert my("blob", b64(raw), Modes(binary="base64")) == (b64(raw), {"type": "string"})
    assert my("binary(3)", b64(raw), Modes(binary="hex")) == ("00feff", {"type": "string"})
    url_safe = base64.urlsafe_b64encode(raw).decode()
    assert my("longblob", b64(raw), Modes(binary="base64-url-safe"))[0] == url_safe
    assert pg("bytea", b64(raw), Modes(time="adaptive", binary="hex"))[0] == "00feff"


def test_mysql_temporal_types_in_each_time_mode():
    assert my("date", "1970-01-02") == (1, {"type": "int32", "name": "io.debezium.time.Date", "version": 1})
    assert my("date", "1969-12-31")[0] == -1
    # TIME: microseconds in the MySQL default mode whatever the precision
    assert my("time", "01:00:00") == (3_600_000_000, {"type": "int64", "name": "io.debezium.time.MicroTime",
                                                      "version": 1})
    assert my("time(3)", "-838:59:59.5")[0] == -(838 * 3600 + 59 * 60 + 59) * 1_000_000 - 500_000
    assert my("time(3)", "00:00:01.5", Modes(time="adaptive")) == (
        1500, {"type": "int32", "name": "io.debezium.time.Time", "version": 1})
    assert my("time(6)", "00:00:01.5", Modes(time="adaptive"))[1]["name"] == "io.debezium.time.MicroTime"
    assert my("time(6)", "00:00:01.5", Modes(time="connect")) == (
        1500, {"type": "int32", "name": "org.apache.kafka.connect.data.Time", "version": 1})
    # DATETIME: milliseconds up to precision 3, microseconds above
    assert my("datetime", "2024-01-02T03:04:05") == (
        1704164645000, {"type": "int64", "name": "io.debezium.time.Timestamp", "version": 1})
    assert my("datetime(3)", "2024-01-02T03:04:05.123")[0] == 1704164645123
    assert my("datetime(6)", "2024-01-02T03:04:05.123456") == (
        1704164645123456, {"type": "int64", "name": "io.debezium.time.MicroTimestamp", "version": 1})
    assert my("datetime(6)", "1969-12-31T23:59:59.999999")[0] == -1
    assert my("datetime(6)", "2024-01-02T03:04:05.123456", Modes(time="connect")) == (
        1704164645123, {"type": "int64", "name": "org.apache.kafka.connect.data.Timestamp", "version": 1})
    assert my("date", "2024-01-02", Modes(time="connect"))[1]["name"] == "org.apache.kafka.connect.data.Date"
    # TIMESTAMP: a UTC string, the fraction as wide as the column's precision
    assert my("timestamp", "2024-01-02T03:04:05+00:00") == (
        "2024-01-02T03:04:05Z", {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "version": 1})
    assert my("timestamp(3)", "2024-01-02T03:04:05.100000+00:00")[0] == "2024-01-02T03:04:05.100Z"
    assert my("timestamp(6)", "2024-01-02T03:04:05.000001+00:00")[0] == "2024-01-02T03:04:05.000001Z"
    assert my("year(4)", 2024) == (2024, {"type": "int32", "name": "io.debezium.time.Year", "version": 1})


def test_mysql_enum_set_json_geometry():
    assert my("enum('x','it''s')", "it's") == (
        "it's", {"type": "string", "name": "io.debezium.data.Enum", "version": 1,
                 "parameters": {"allowed": "x,it's"}})
    value, schema = my("set('b','a','c')", ["a", "b"])
    assert value == "b,a"  # the column's order, as the server writes a SET's text
    assert schema["name"] == "io.debezium.data.EnumSet" and schema["parameters"] == {"allowed": "b,a,c"}
    assert my("set('b','a')", [])[0] == ""
    assert my("json", '{"a": [1, 2]}') == (
        '{"a": [1, 2]}', {"type": "string", "name": "io.debezium.data.Json", "version": 1})
    # MariaDB's JSON is a LONGTEXT to its connector: a string schema without a name
    m = mysql_mapping("json", MY, mariadb=True)
    assert (m.convert('{"a": 1}'), m.schema) == ('{"a": 1}', {"type": "string"})
    wkb = bytes.fromhex("0101000000000000000000f03f0000000000000040")  # POINT(1 2)
    value, schema = my("point", b64((4326).to_bytes(4, "little") + wkb))
    assert value == {"x": 1.0, "y": 2.0, "wkb": b64(wkb), "srid": 4326}
    assert schema["name"] == "io.debezium.data.geometry.Point"
    assert [f["field"] for f in schema["fields"]] == ["x", "y", "wkb", "srid"]
    value, schema = my("geometry", b64((0).to_bytes(4, "little") + wkb))
    assert value == {"wkb": b64(wkb), "srid": None}  # SRID 0: none given, null as Debezium writes it
    assert schema["name"] == "io.debezium.data.geometry.Geometry"


def test_postgres_types():
    assert pg("smallint", 1) == (1, {"type": "int16"})
    assert pg("integer", 1) == (1, {"type": "int32"})
    assert pg("bigint", 1) == (1, {"type": "int64"})
    assert pg("real", 1.5) == (1.5, {"type": "float"})
    assert pg("double precision", 1.5) == (1.5, {"type": "double"})
    assert pg("boolean", True) == (True, {"type": "boolean"})
    assert pg("character varying(20)", "x") == ("x", {"type": "string"})
    assert pg("text", "x") == ("x", {"type": "string"})
    assert pg("uuid", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")[1]["name"] == "io.debezium.data.Uuid"
    assert pg("jsonb", '{"a": 1}') == ('{"a": 1}', {"type": "string", "name": "io.debezium.data.Json",
                                                     "version": 1})
    assert pg("xml", "<a/>")[1]["name"] == "io.debezium.data.Xml"
    assert pg("inet", "10.0.0.1/32") == ("10.0.0.1/32", {"type": "string"})
    assert pg("date", "2024-01-02")[0] == 19724
    # timestamp without precision is precision 6: microseconds; (3) is milliseconds
    assert pg("timestamp without time zone", "2024-01-02T03:04:05.5") == (
        1704164645500000, {"type": "int64", "name": "io.debezium.time.MicroTimestamp", "version": 1})
    assert pg("timestamp(3) without time zone", "2024-01-02T03:04:05.5")[0] == 1704164645500
    # the fraction padded to the column's precision (6 without one), as the connector writes it
    assert pg("timestamp with time zone", "2024-01-02T03:04:05.120000+00:00") == (
        "2024-01-02T03:04:05.120000Z",
        {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "version": 1})
    assert pg("timestamp(3) with time zone", "2038-01-19 03:14:07.999+05:30") == (
        "2038-01-18T21:44:07.999Z",
        {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "version": 1})
    assert pg("enum('sad','ok','it''s')", "ok") == (  # the catalog's labels of an enum type
        "ok", {"type": "string", "name": "io.debezium.data.Enum", "version": 1,
               "parameters": {"allowed": "sad,ok,it's"}})
    value, schema = pg("point", "(1.5,-2.25)")
    wkb = bytes.fromhex("0101000000") + struct.pack("<dd", 1.5, -2.25)  # little-endian WKB POINT
    assert value == {"x": 1.5, "y": -2.25, "wkb": b64(wkb), "srid": None}
    assert schema["name"] == "io.debezium.data.geometry.Point"
    assert pg("time without time zone", "12:00:00.25")[0] == 43_200_250_000
    assert pg("time(3) without time zone", "12:00:00.25") == (
        43_200_250, {"type": "int32", "name": "io.debezium.time.Time", "version": 1})
    assert pg("time with time zone", "12:00:00.5+02") == (
        "10:00:00.5Z", {"type": "string", "name": "io.debezium.time.ZonedTime", "version": 1})
    assert pg("money", "-$1,234.56")[0] == b64((-123456).to_bytes(3, "big", signed=True))
    assert pg("interval", "1 year 2 mons 3 days 04:05:06.5") == (
        interval_micros("1 year 2 mons 3 days 04:05:06.5"),
        {"type": "int64", "name": "io.debezium.time.MicroDuration", "version": 1})


def test_interval_counts_the_average_month():
    assert interval_micros("00:00:01") == 1_000_000
    assert interval_micros("1 mon") == int(30.4375 * 86_400_000_000)
    assert interval_micros("1 year 2 mons 3 days 04:05:06.5") == \
        int(14 * 30.4375 * 86_400_000_000) + 3 * 86_400_000_000 + 14_706_500_000
    assert interval_micros("-1 days -00:00:01") == -86_400_000_000 - 1_000_000


def test_postgres_arrays_convert_each_element():
    value, schema = pg("integer[]", [1, None, 3])
    assert value == [1, None, 3] and schema == {"type": "array", "items": {"type": "int32", "optional": True}}
    value, schema = pg("numeric(4,1)[]", ["1.5", "-2.0"])
    assert value == [b64((15).to_bytes(1, "big")), b64((-20).to_bytes(1, "big", signed=True))]
    assert schema["items"]["name"] == "org.apache.kafka.connect.data.Decimal"


def test_zoned_timestamp_fraction_widths():
    assert zoned_timestamp("2024-01-02T03:04:05.120000+00:00", None) == "2024-01-02T03:04:05.12Z"
    assert zoned_timestamp("2024-01-02T03:04:05+00:00", None) == "2024-01-02T03:04:05Z"
    assert zoned_timestamp("2024-01-02T05:04:05+02:00", 0) == "2024-01-02T03:04:05Z"


def test_a_column_the_catalog_does_not_know_maps_by_its_value():
    assert column_mapping("mysql", None, MY, 3).schema == {"type": "int64"}
    assert column_mapping("postgresql", None, PG, "x").schema == {"type": "string"}
    assert column_mapping("mysql", None, MY, {"a": 1}).convert({"a": 1}) == '{"a":1}'


def test_variable_scale_strips_fraction_zeros_only():
    # Debezium's output for NUMERIC without scale (tests/compat, t_floats.dn)
    assert pg("numeric", "1.50")[0] == {"scale": 1, "value": b64(bytes([15]))}
    assert pg("numeric", "10.0")[0] == {"scale": 0, "value": b64(bytes([10]))}
    assert pg("numeric", "100")[0] == {"scale": 0, "value": b64(bytes([100]))}
    assert pg("numeric", "0.000000000000000000000000000010")[0] == {"scale": 29, "value": b64(bytes([1]))}
    assert pg("numeric", "0.000")[0] == {"scale": 0, "value": b64(bytes([0]))}
    big = "12345678901234567890.123456789012345678901234567890"
    assert pg("numeric", big)[0]["scale"] == 29  # exact beyond 28 digits: no context rounding


def test_decimal_string_mode_is_plain_notation_and_double_mode_writes_nan_as_jackson_does():
    string = Modes(decimal="string")
    assert my("decimal(65,30)", "-0.000000000000000000000000000001", string)[0] == \
        "-0.000000000000000000000000000001"
    assert my("decimal(65,30)", "0E-30", string)[0] == "0.000000000000000000000000000000"
    assert my("decimal(65,30)", "12345.5", string)[0] == "12345.5"
    assert pg("numeric", "NaN", string)[0] == "NaN"
    double = Modes(decimal="double")
    assert [pg("numeric", v, double)[0] for v in ("NaN", "Infinity", "-Infinity", "1.5")] == [
        "NaN", "Infinity", "-Infinity", 1.5]


def test_time_connect_mode_is_null_outside_a_day():
    connect = Modes(time="connect")
    assert [my("time", v, connect)[0] for v in ("-838:59:59", "100:00:00.000001", "-00:00:01")] == [None] * 3
    assert [my("time(6)", v, connect)[0] for v in ("00:00:00", "23:59:59.999999", "24:00:00")] == [
        0, 86_399_999, 86_400_000]
    assert my("time", "-838:59:59")[0] == -3_020_399_000_000  # MicroTime keeps it


def test_mysql_float_m_d_is_the_float32_widened_to_a_double():
    assert my("float(7,3)", 1234.567) == (1234.5670166015625, {"type": "double"})
    assert my("float(7,3)", -0.001)[0] == -0.0010000000474974513
    assert my("float", 1234.567) == (1234.567, {"type": "float"})  # a float32: its shortest text
    assert my("float(30)", 0.1) == (0.1, {"type": "double"})  # MySQL made it a DOUBLE


def test_unchanged_toast_placeholder_in_a_binary_column_is_its_bytes():
    placeholder = "__debezium_unavailable_value"
    as_bytes = b64(placeholder.encode())
    assert as_bytes == "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="  # Debezium's (tests/compat, t_toast)
    assert pg("bytea", placeholder)[0] == as_bytes
    # the other binary modes as Debezium writes them (the generated comparison, seeds 11-20):
    # the placeholder's text in hex mode, null in the base64 modes
    assert pg("bytea", placeholder, Modes(time="adaptive", binary="hex"))[0] == placeholder
    assert pg("bytea", placeholder, Modes(time="adaptive", binary="base64"))[0] is None
    assert pg("bytea", placeholder, Modes(time="adaptive", binary="base64-url-safe"))[0] is None
    assert pg("bytea", b64(b"\x00\xff"), Modes(time="adaptive", binary="hex"))[0] == "00ff"
    assert pg("text", placeholder)[0] == placeholder
    assert pg("bytea", b64(b"\x00\xff"))[0] == b64(b"\x00\xff")


def test_postgres_domain_values_come_as_text_and_map_by_their_base_type():
    # the catalog names a domain's base type (sources/postgres/snapshot.py column_types)
    assert pg("integer", "1") == (1, {"type": "int32"})
    assert pg("bigint", 7) == (7, {"type": "int64"})
    assert pg("numeric(12,2)", "12.50")[0] == b64((1250).to_bytes(2, "big", signed=True))
    assert pg("double precision", "2.5")[0] == 2.5
    assert pg("double precision", float("nan"))[0] == "NaN"
