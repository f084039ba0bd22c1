"""The comparison harness's own logic (tests/compat/harness.py): the join by source position,
the ignored fields and the report of every differing field."""

from __future__ import annotations

from tests.compat import harness


def change(pos: int, row: int, op: str, after: dict | None, **source) -> dict:
    value = {"before": None, "after": after, "op": op, "ts_ms": 1, "transaction": None,
             "source": {"version": "3.5.0.Final", "file": "mysql-bin.000001", "pos": pos, "row": row,
                        "db": "d", "table": "t", **source}}
    return {"topic": "p.d.t", "key": {"id": (after or {}).get("id", 1)}, "value": value, "headers": []}


def test_equal_outputs_report_nothing_and_ignored_fields_may_differ():
    d = [change(4, 0, "c", {"id": 1, "v": "a"})]
    t = [change(4, 0, "c", {"id": 1, "v": "a"}, version="tidegate-9")]
    t[0]["value"]["ts_ms"] = 999
    t[0]["topic"] = "other_prefix.d.t"
    t[0]["headers"] = [{"key": "idempotency_key", "text": "abc"}]
    assert harness.compare("mariadb", d, t) == []


def test_every_differing_field_is_named_with_both_values():
    d = [change(4, 0, "c", {"id": 1, "v": "a", "n": 5})]
    t = [change(4, 0, "c", {"id": 1, "v": "b", "extra": True})]
    t[0]["headers"] = [{"key": "op", "text": "c"}]
    (report,) = harness.compare("mariadb", d, t)
    assert report.startswith("('d.t', 'mysql-bin.000001', 4, 0, 'c'): 4 differing field(s)")
    assert 'value.after.v: debezium "a", tidegate "b"' in report
    assert "value.after.n: debezium 5, tidegate has no such field" in report
    assert "value.after.extra: debezium has no such field, tidegate true" in report
    assert 'headers.op: debezium has no such field, tidegate "c"' in report


def test_events_one_side_lacks_are_listed_and_tombstones_join_after_their_delete():
    d = [change(4, 0, "d", None), {"topic": "p.d.t", "key": {"id": 1}, "value": None, "headers": []},
         change(9, 1, "c", {"id": 2})]
    t = [change(4, 0, "d", None), change(9, 2, "c", {"id": 2})]
    report = harness.compare("mariadb", d, t)
    assert len(report) == 3
    assert "('d.t', 'mysql-bin.000001', 4, 0, 'tombstone'): debezium's event is missing" in report[0]
    assert "('d.t', 'mysql-bin.000001', 9, 1, 'c'): debezium's event is missing" in report[1]
    assert "('d.t', 'mysql-bin.000001', 9, 2, 'c'): tidegate's event has no Debezium counterpart" in report[2]


def test_schemas_on_form_compares_the_payload_and_the_schema():
    d = change(4, 0, "c", {"id": 1})
    t = change(4, 0, "c", {"id": 1})
    d["value"] = {"schema": {"type": "struct", "name": "p.d.t.Envelope"}, "payload": d["value"]}
    t["value"] = {"schema": {"type": "struct", "name": "x.Envelope"}, "payload": t["value"]}
    t["value"]["payload"]["ts_ms"] = 7
    (report,) = harness.compare("mariadb", [d], [t])
    assert 'value.schema.name: debezium "p.d.t.Envelope", tidegate "x.Envelope"' in report
    assert "ts_ms" not in report


def test_postgres_joins_by_lsn_and_sequence():
    def pg(lsn: int, seq: str) -> dict:
        r = change(0, 0, "u", {"id": 1})
        r["value"]["source"] = {"lsn": lsn, "sequence": seq, "schema": "s", "table": "t"}
        return r
    assert harness.compare("postgres", [pg(10, '["5","10"]')], [pg(10, '["5","10"]')]) == []
    assert len(harness.compare("postgres", [pg(10, '["5","10"]')], [pg(10, '[null,"10"]')])) == 2


def test_the_sign_of_a_zero_is_compared():
    d, t = [change(4, 0, "c", {"id": 1, "x": -0.0})], [change(4, 0, "c", {"id": 1, "x": 0.0})]
    (report,) = harness.compare("mariadb", d, t)
    assert "value.after.x: debezium -0.0, tidegate 0.0" in report


def test_only_the_declared_pair_of_a_declared_column_is_forgiven():
    def pg(after: dict) -> dict:
        value = {"before": None, "after": after, "op": "c",
                 "source": {"lsn": 10, "sequence": "[null,\"10\"]"}}
        return {"topic": "p.tidegate_compat.t_floats", "key": {"id": 1}, "value": value, "headers": []}
    assert harness.compare("postgres", [pg({"id": 1, "r": "NaN", "dp": -0.0})],
                           [pg({"id": 1, "r": None, "dp": 0.0})]) == []
    (report,) = harness.compare("postgres", [pg({"id": 1, "r": "NaN", "dp": 1.5, "v": "NaN"})],
                                [pg({"id": 1, "r": 0.0, "dp": None, "v": None})])
    assert "value.after.r:" in report and "value.after.dp:" in report and "value.after.v:" in report
    (report,) = harness.compare("mariadb", [change(4, 0, "c", {"id": 1, "r": "NaN"})],
                                [change(4, 0, "c", {"id": 1, "r": None})])  # another source, table
    assert "value.after.r:" in report
    rows = [("tidegate_compat.t_floats", '{"id": 1}', '{"dp": 0.0, "id": 1, "r": 0.0}')]
    tidegate = [(*rows[0][:2], '{"dp": null, "id": 1, "r": null}')]
    assert harness.forgive_declared_rows("postgres", rows, tidegate) == (rows, rows)


def test_rows_before_an_alter_are_compared_without_the_columns_it_names():
    """The generated backlog's ALTERs: a row written before one is compared without the columns
    it names (tidegate types a run's rows by the catalog at the run, declared); after it, in full."""
    history = harness.SchemaHistory("mariadb", [("t", frozenset({"c"}), ("mysql-bin.000001", 500),
                                                 "ALTER TABLE db.t DROP COLUMN c")])
    assert history.touched("d.t", ("mysql-bin.000001", 400, 0)) == {"c"}
    assert history.touched("d.t", ("mysql-bin.000001", 600, 0)) == set()
    assert history.touched("d.u", ("mysql-bin.000001", 400, 0)) == set()
    before = change(400, 0, "c", {"id": 1, "c": "2001-01-01T00:00:00+00:00"})
    after = change(400, 0, "c", {"id": 1, "c": "2001-01-01T00:00:00Z"})
    assert harness.compare("mariadb", [before], [after]) != []
    assert harness.compare("mariadb", [before], [after], history) == []
    late_d, late_t = change(600, 0, "c", {"id": 2, "c": 1}), change(600, 0, "c", {"id": 2, "c": 2})
    assert harness.compare("mariadb", [late_d], [late_t], history) != []
