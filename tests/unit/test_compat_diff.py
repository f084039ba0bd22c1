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
