"""The key-change headers as Kafka Connect's SimpleHeaderConverter writes them: Java's renderings
of each value (include/tidegate/debezium/headers.py), each case one the generated comparison with
Debezium found (tests/compat/test_generated.py)."""

from __future__ import annotations

from datetime import date

import orjson
from tidegate.debezium.headers import DATE, TIME, TIMESTAMP, header_value, java_double


def _day(text: str) -> int:
    return (date.fromisoformat(text) - date(1970, 1, 1)).days


def test_doubles_as_java_writes_them():
    assert [java_double(x) for x in (448490633.3172532, -6.998578699579559e29, 100.0, 0.001, 0.0001,
                                     1e7, 9999999.0, -0.0, float("nan"))] == [
        "4.484906333172532E8", "-6.998578699579559E29", "100.0", "0.001", "1.0E-4", "1.0E7", "9999999.0",
        "-0.0", "NaN"]


def test_connect_dates_times_and_timestamps_by_their_value():
    def text(name: str, value: int) -> str:
        return header_value({"type": "int32", "name": name}, None, value, orjson.dumps)

    assert text(DATE, _day("6319-12-27")) == "6319-12-27"
    # before 1970-01-02 the value is written as a time of day, whatever its schema
    assert text(DATE, _day("1970-01-01")) == "00:00:00.000Z"
    assert text(DATE, _day("0001-01-01")) == "00:00:00.000Z"
    assert text(TIME, 86_399_999) == "23:59:59.999Z"
    assert text(TIMESTAMP, _day("2024-02-29") * 86_400_000 + 1_500) == "2024-02-29T00:00:01.500Z"
    assert text(TIMESTAMP, _day("1715-06-11") * 86_400_000 + 25_516_769) == "07:05:16.769Z"


def test_a_decimal_at_its_scale_and_plain_values_as_json():
    decimal = {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "2"}}
    assert header_value(decimal, "82363007491812695921", "ignored", orjson.dumps) == "82363007491812695921.00"
    assert header_value({"type": "string"}, "a", "a", orjson.dumps) == '"a"'
    assert header_value({"type": "int64"}, 7, 7, orjson.dumps) == "7"
    assert header_value({"type": "int64"}, None, None, orjson.dumps) == "null"
