"""The kind: delta sink entry: defaults, placeholders, modes, and the errors a wrong entry gets;
the column types the sink derives from JSON values; Delta's settings only for specs with a delta
sink."""

from __future__ import annotations

import re
import textwrap

import pytest
from tidegate.errors import NonRetryableSinkError, SpecError
from tidegate.kinds import spark_settings
from tidegate.sinks.delta.tables import json_type, learn_types, struct_ddl
from tidegate.spec import load_spec_text

SPEC = """
pipeline: lake
source: {{kind: mysql, conn_id: cdc_mysql, server_id: 4242}}
sinks:
{sink}
"""


def spec(sink: str):
    return load_spec_text(SPEC.format(sink=textwrap.indent(textwrap.dedent(sink), "  ")), "lake.yaml")


def problems(sink: str) -> str:
    with pytest.raises(SpecError) as e:
        spec(sink)
    return str(e.value)


def test_defaults_merge_mode_no_connection_and_a_path_under_the_data_dir(monkeypatch):
    monkeypatch.setenv("TIDEGATE_DATA_DIR", "/data/tg")
    s = spec("- {id: lake, kind: delta}").sinks[0]
    assert (s.mode, s.conn_id, s.path) == ("merge", "", "")
    assert s.table_path("lake") == "/data/tg/lake/lake/{schema}/{table}"
    assert s.checkpoint_table_path("lake") == "/data/tg/lake/lake/_tidegate/checkpoint_lake"
    assert "exactly-once" in s.guarantee


def test_path_template_and_changelog_mode():
    s = spec("- {id: cl, kind: delta, mode: changelog, path: 's3a://lake/{pipeline}/{db}/{table}'}").sinks[0]
    assert s.mode == "changelog"
    assert s.table_path("lake") == "s3a://lake/lake/{db}/{table}"
    assert s.checkpoint_table_path("lake") == "s3a://lake/lake/_tidegate/checkpoint_cl"


@pytest.mark.parametrize("entry, says", [
    ("- {id: d, kind: delta, mode: upsert}", "sinks[0].mode"),
    ("- {id: d, kind: delta, path: '/lake/{pipeline}'}", "has no {table}"),
    ("- {id: d, kind: delta, path: '/lake/{tabel}'}", "unknown placeholder {tabel}"),
    ("- {id: d, kind: delta, path: '/lake dir/{table}'}", "illegal characters"),
    ("- {id: d, kind: delta, checkpoint_path: '/lake/{table}'}", "names a table placeholder"),
    ("- {id: d, kind: delta, topic: x}", "topic"),
])
def test_wrong_entries_name_the_field_and_the_fix(entry, says):
    text = problems(entry)
    assert "lake.yaml" in text and says in text


def test_other_kinds_still_need_a_connection():
    assert "sinks[0].conn_id" in problems("- {id: k, kind: kafka, topic: t}")


def test_column_types_from_json_values():
    assert [json_type(v) for v in (None, True, 3, 2**64, 1.5, "1.50", [1], {"a": 1})] == [
        None, "boolean", "bigint", "decimal(38,0)", "double", "string", "string", "string"]
    types: dict = {}
    learn_types(types, {"id": 1, "note": None})
    learn_types(types, {"id": 2, "note": "x", "added": 1.0})  # a later row types what was null
    assert types == {"id": "bigint", "note": "string", "added": "double"}
    assert struct_ddl({"a`b": None, "n": "bigint"}) == "`a``b`: string, `n`: bigint"


def test_a_bigint_column_widens_for_an_integer_past_its_range():
    """A MariaDB BIGINT UNSIGNED first seen below 2^63 (campaign seed 7020 TYPES=edges): Spark
    would write 2^64-1 in a bigint column as null; the column widens instead."""
    types, widen = {"id": "bigint", "u": "bigint"}, set()
    learn_types(types, {"id": 1, "u": 2**63 - 1}, widen)
    assert widen == set() and types["u"] == "bigint"
    learn_types(types, {"id": 2, "u": 2**64 - 1}, widen)
    assert widen == {"u"} and types == {"id": "bigint", "u": "decimal(38,0)"}
    learn_types(types, {"id": 3, "u": 5}, widen)  # a wide column takes small values too
    assert types["u"] == "decimal(38,0)"


def test_a_value_spark_would_write_as_null_is_an_error_naming_the_column():
    for t, v in (("bigint", "abc"), ("bigint", 1.5), ("bigint", True), ("boolean", 1), ("double", "x"),
                 ("decimal(38,0)", "1.5")):
        with pytest.raises(NonRetryableSinkError, match=f"table t: column 'c' is {re.escape(t)} .*"
                                                        "ALTER TABLE .* nothing was written"):
            learn_types({"c": t}, {"c": v}, set(), "table t: ")
    types = {"s": "string", "d": "double", "b": "boolean", "n": "bigint"}
    learn_types(types, {"s": 5, "d": 3, "b": False, "n": None}, set())  # these Spark reads as they are
    learn_types(types, {"d": "NaN"}, set())
    assert types == {"s": "string", "d": "double", "b": "boolean", "n": "bigint"}


def test_spark_settings_only_for_a_spec_with_a_delta_sink(monkeypatch, tmp_path):
    (tmp_path / "delta-spark_4.2_2.13-4.4.0.jar").write_bytes(b"")
    (tmp_path / "delta-storage-4.4.0.jar").write_bytes(b"")
    monkeypatch.setenv("TIDEGATE_DELTA_JARS", str(tmp_path))
    with_delta = spark_settings(spec("- {id: lake, kind: delta}"))
    assert with_delta["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert with_delta["spark.jars"].split(",") == [str(tmp_path / "delta-spark_4.2_2.13-4.4.0.jar"),
                                                   str(tmp_path / "delta-storage-4.4.0.jar")]
    assert spark_settings(spec("- {id: c, kind: redis, conn_id: r, stream: s}")) == {}


def test_missing_jars_say_how_to_get_them(monkeypatch, tmp_path):
    monkeypatch.setenv("TIDEGATE_DELTA_JARS", str(tmp_path))
    with pytest.raises(SpecError, match="make install"):
        spark_settings(spec("- {id: lake, kind: delta}"))
