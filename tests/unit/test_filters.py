"""Table and column filters (filters.py): patterns, transforms, the spec's messages, and what
leaves a source (events, key-change headers, schema_change messages)."""

import hashlib
import json
import pickle
import textwrap

import pytest
from tidegate.errors import ConnectionConfigError, SourceSettingError
from tidegate.events import ChangeEvent, ControlMessage, PositionMark, split_key_change
from tidegate.filters import (
    ColumnFilters,
    ColumnRules,
    TableFilter,
    captured,
    catalog_problems,
    filter_items,
    hash_value,
    snapshot_candidates,
    table_list,
)
from tidegate.parts import Parts, fixed_connection
from tidegate.spec import load_spec_text

SPEC = """\
pipeline: pii
source:
  kind: postgres
  conn_id: db
{source}
sinks:
  - id: events
    kind: kafka
    conn_id: kafka_default
    topic: "{{pipeline}}.{{schema}}.{{table}}"
"""


def spec(source: str):
    return load_spec_text(SPEC.format(source=textwrap.indent(textwrap.dedent(source), "  ")), "pii.yaml")


def problems(source: str) -> list[str]:
    try:
        spec(source)
    except Exception as exc:  # noqa: BLE001 - SpecError lists the lines
        return str(exc).splitlines()
    return []


# --------------------------------------------------------------------------- tables


def test_patterns_include_and_exclude():
    f = TableFilter(["shop.*", "!shop.audit_*", "crm.customers"])
    assert ("shop", "orders") in f
    assert ("shop", "audit_log") not in f
    assert ("crm", "customers") in f and ("crm", "leads") not in f
    assert ("Shop", "orders") not in f  # case-sensitive, as the catalog spells names
    assert f.literal is None and f.schemas == {"shop", "crm"}
    assert f.may_hold("shop") and not f.may_hold("other")


def test_only_excludes_capture_every_other_table():
    f = TableFilter(["!shop.audit_*"])
    assert ("x", "y") in f and ("shop", "audit_1") not in f
    assert f.schemas == frozenset()


def test_a_list_of_names_stays_a_set():
    assert captured(["shop.a", "shop.b"]) == frozenset({("shop", "a"), ("shop", "b")})
    assert captured([]) == frozenset()
    assert isinstance(captured(["shop.*"]), TableFilter)


def test_wal2json_options_where_the_plugin_can_say_it():
    assert table_list(captured(["shop.a"])) == {"add-tables": "shop.a"}
    assert table_list(captured(["shop.*", "!shop.audit"])) == \
        {"add-tables": "shop.*", "filter-tables": "shop.audit"}
    # a partial wildcard is filtered by the reader only (wal2json knows a whole '*' part)
    assert table_list(captured(["shop.*", "!shop.audit_*"])) == {"add-tables": "shop.*"}
    assert table_list(captured([])) == {}


def test_snapshot_candidates():
    existing = ["shop.b", "shop.a", "shop.audit_1", "x.y"]
    assert snapshot_candidates([], existing) is None
    assert snapshot_candidates(["shop.b", "shop.a"], existing) == ["shop.b", "shop.a"]  # spec order
    assert snapshot_candidates(["shop.*", "!shop.audit_*"], existing) == ["shop.a", "shop.b"]
    assert snapshot_candidates(["nothere.*"], existing) == []  # not "all"


# --------------------------------------------------------------------------- transforms

RULES = ColumnRules("shop.customers", exclude=("ssn",), mask=(("email", "***"),), hash=("phone",),
                    truncate=(("name", 3),))


def test_transforms_and_null():
    tr = ColumnFilters((RULES,), b"salt").for_table("shop", "customers")
    row = {"id": 7, "ssn": "123-45", "email": "a@b.c", "phone": "555", "name": "Alexandra", "n": 1}
    assert tr.row(row) == {"id": 7, "email": "***", "phone": hashlib.sha256(b"salt555").hexdigest(),
                           "name": "Ale", "n": 1}
    assert tr.row({"id": 1, "ssn": None, "email": None, "phone": None, "name": None}) == \
        {"id": 1, "email": None, "phone": None, "name": None}
    assert tr.row(None) is None
    assert ColumnFilters((RULES,), b"salt").for_table("shop", "orders") is None


def test_hash_is_over_the_envelope_value():
    assert hash_value(b"s", "x") == hashlib.sha256(b"sx").hexdigest()
    assert hash_value(b"s", 42) == hashlib.sha256(b"s42").hexdigest()  # a number becomes a string
    assert hash_value(b"s", ["a", "b"]) == hashlib.sha256(b's["a","b"]').hexdigest()
    assert hash_value(b"s", "12.50") != hash_value(b"t", "12.50")


def test_key_columns_may_be_hashed_only():
    tr = ColumnFilters((ColumnRules("s.t", hash=("id",)),), b"k").for_table("s", "t")
    assert tr.key({"id": 1}) == {"id": hash_value(b"k", 1)}
    for rule in ({"exclude": ("id",)}, {"mask": (("id", "x"),)}, {"truncate": (("id", 2),)}):
        tr = ColumnFilters((ColumnRules("s.t", **rule),), b"k").for_table("s", "t")
        with pytest.raises(SourceSettingError, match="primary key"):
            tr.key({"id": 1})


def test_two_patterns_giving_a_column_two_rules():
    f = ColumnFilters((ColumnRules("s.*", exclude=("a",)), ColumnRules("*.t", mask=(("a", "x"),))), b"")
    with pytest.raises(SourceSettingError, match="one rule"):
        f.for_table("s", "t")


def test_hash_without_salt_is_refused_and_the_salt_never_shows():
    with pytest.raises(ConnectionConfigError, match="salt"):
        ColumnFilters((RULES,), None).for_table("shop", "customers")
    f = ColumnFilters((RULES,), b"very-secret")
    assert "very-secret" not in repr(f)


def event(op="u", before=None, after=None, key=None, table="customers"):
    return ChangeEvent.native("t", "pii", "mysql", "shop", "shop", table, op, before, after, key, "tx",
                              "f:1:0", {"file": "f", "pos": 1}, 1000, 1, 1, "false", True, None, True)


def test_filter_items_events_headers_and_control():
    f = ColumnFilters((ColumnRules("shop.customers", exclude=("ssn",), hash=("id",)),), b"k")
    before = {"id": 1, "ssn": "111", "email": "e"}
    after = {"id": 2, "ssn": "222", "email": "e"}
    gone, made = split_key_change(event(before=before, after=after, key={"id": 2}), {"id": 1})
    ddl = ControlMessage("t", "pii", "schema_change", "x", None, 0,
                         {"change": "ALTER", "ddl": "ALTER TABLE customers ADD COLUMN SSN int", "db": "shop",
                          "schema": "shop", "table": "customers",
                          "columns": [{"name": "id", "type": "int"}, {"name": "ssn", "type": "int"}]},
                         tx_end=True)
    other = event(table="orders", after={"id": 5, "ssn": "keep"}, key={"id": 5})
    mark = PositionMark(None)
    out = list(filter_items([gone, made, ddl, other, mark], f))
    h1, h2 = hash_value(b"k", 1), hash_value(b"k", 2)
    assert out[0].before == {"id": h1, "email": "e"} and out[0].key == {"id": h1}
    assert out[1].after == {"id": h2, "email": "e"} and out[1].key == {"id": h2}
    assert json.loads(out[0].headers["__debezium.newkey"]) == {"id": h2}
    assert json.loads(out[1].headers["__debezium.oldkey"]) == {"id": h1}
    for ev in out[:2]:
        raw = ev.value + ev.key_bytes + b"".join(ev.headers.values())
        assert b"111" not in raw and b"222" not in raw and b"ssn" not in raw
    assert out[2].fields["columns"] == [{"name": "id", "type": "int"}]
    assert out[2].fields["ddl"] is None and out[2].fields["ddl_redacted"] is True and out[2].tx_end
    assert out[3] is other and out[4] is mark


def test_events_stay_the_transaction_ends_they_were():
    f = ColumnFilters((ColumnRules("shop.customers", mask=(("email", "*"),)),), b"")
    (out,) = filter_items([event(op="c", after={"id": 1, "email": "x"}, key={"id": 1})], f)
    assert out.tx_end and out.after == {"id": 1, "email": "*"}


# --------------------------------------------------------------------------- spec


def test_spec_example_is_valid():
    s = spec("""
        tables: ["shop.*", "!shop.audit_*"]
        columns:
          shop.customers: {exclude: [ssn], mask: {email: "***"}, hash: [phone], truncate: {name: 3}}
          "shop.*": {exclude: [ssn]}
        hash_salt: {variable: pii_salt}
        """)
    assert s.source.tables == ("shop.*", "!shop.audit_*")
    assert s.source.hash_salt == ("variable", "pii_salt")
    assert s.source.columns[0] == RULES
    assert "pii_salt" in s.text  # the salt's name, never its value, is in the spec


@pytest.mark.parametrize("source, field, words", [
    ('tables: ["shop.orders; drop"]', "source.tables[0]", "malformed table name or pattern"),
    ('tables: ["shop.*", "shop.*"]', "source.tables[1]", "duplicate entry"),
    ("columns: {shop.c: {exclude: [a, a]}}", "source.columns.shop.c.exclude[1]", "listed twice"),
    ("columns: {shop.c: {exclude: [a], mask: {a: x}}}", "source.columns.shop.c.mask.a",
     "both exclude and mask"),
    ("columns: {shop.c: {hide: [a]}}", "source.columns.shop.c.hide", "unknown field"),
    ("columns: {shop.c: {truncate: {a: 0}}}", "source.columns.shop.c.truncate.a", "an integer >= 1"),
    ("columns: {shop.c: {mask: {a: 3}}}", "source.columns.shop.c.mask.a", "must be a string"),
    ("columns: {shop.c: {hash: [a]}}", "source.hash_salt", "missing"),
    ("columns: {shop.c: {hash: [a], exclude: [a]}}", "source.hash_salt", "missing"),
    ("hash_salt: {conn_id: s}", "source.hash_salt", "no column is hashed"),
    ("columns: {shop.c: {hash: [a]}}\nhash_salt: {file: x}", "source.hash_salt", "bad value"),
    ('tables: [shop.a]\ncolumns: {shop.c: {exclude: [a]}}', "source.columns.shop.c", "not captured"),
    ('columns: {shop.c: {exclude: [a]}, "shop.*": {mask: {a: x}}}', "source.columns.shop.c",
     "matches this table too"),
])
def test_spec_problems_name_the_field_and_the_fix(source, field, words):
    lines = problems(source)
    assert any(f"pii.yaml: {field}: " in line and words in line for line in lines), lines


def test_existing_table_lists_keep_working():
    assert spec("tables: [shop.orders, shop.items]").source.tables == ("shop.orders", "shop.items")


# --------------------------------------------------------------------------- the salt's way


def test_salt_from_a_connection_password_or_a_variable():
    s = spec("columns: {shop.c: {hash: [a]}}\nhash_salt: {conn_id: salt}")
    from tidegate.connections import Connection

    parts = Parts(lambda cid: Connection(cid, "generic", password="pw" if cid == "salt" else None),
                  lambda name: "var")
    assert parts.hash_salt(s) == b"pw"
    s2 = spec("columns: {shop.c: {hash: [a]}}\nhash_salt: {variable: v}")
    assert parts.hash_salt(s2) == b"var"
    assert Parts(lambda cid: Connection(cid, "x")).hash_salt(spec("tables: [a.b]")) is None
    with pytest.raises(ConnectionConfigError, match="has no password") as exc:
        Parts(lambda cid: Connection(cid, "x")).hash_salt(s)
    assert "pw" not in str(exc.value)
    shipped = pickle.loads(pickle.dumps((Connection("db", "postgres"), b"pw")))
    assert fixed_connection(*shipped).hash_salt(s) == b"pw"


def test_salt_variable_from_the_environment(monkeypatch):
    from tidegate.connections import get_variable

    monkeypatch.setenv("AIRFLOW_VAR_PII_SALT", "s3")
    assert get_variable("pii_salt") == "s3"
    with pytest.raises(ConnectionConfigError, match="AIRFLOW_VAR_NOPE"):
        get_variable("nope")


# --------------------------------------------------------------------------- preflight


def test_catalog_problems():
    catalog = {"shop.customers": (["id", "email"], ["id"]), "shop.Orders": (["id"], ["id"])}
    rules = (ColumnRules("shop.customers", exclude=("id",), mask=(("mail", "x"),)),
             ColumnRules("crm.*", exclude=("a",)))
    out = catalog_problems(["shop.*", "shop.orders*", "!shop.tmp_*"], rules, catalog)
    text = "\n".join(m for _, m, _ in out)
    assert "'shop.orders*' matches no table" in text and "case-insensitively: shop.Orders" in text
    assert "'!shop.tmp_*' matches no table" in text
    assert "'crm.*' matches no captured table" in text
    assert "has no column 'mail'" in text
    assert "part of its primary key" in text
    assert all(error for _, _, error in out)
