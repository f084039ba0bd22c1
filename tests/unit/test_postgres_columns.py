"""Column sets of PostgreSQL tables told from rows (sources/postgres/columns.py): which rows
show a change, what an UPDATE that leaves TOAST values out does not show, and what is
remembered between reads."""

from __future__ import annotations

import pytest
from tidegate.sources.postgres.columns import ColumnTracker, LocalMemory, StoreMemory, known_at
from tidegate.sources.postgres.position import Lsn, PgPosition
from tidegate.store import open_store

ID, A, BIG, B = ("id", "integer"), ("a", "text"), ("big", "text"), ("b", "integer")


def at(n: int, system: str = "7") -> PgPosition:
    return PgPosition(Lsn(n), system, 1)


def tracker(memory=None, start: int = 0) -> ColumnTracker:
    return ColumnTracker(memory or LocalMemory(), at(start), "t", "p")


def test_an_insert_sets_the_first_set_and_the_next_different_one_is_a_change():
    t = tracker()
    assert t.observe("s", "x", "c", (ID, A), None, at(10)) is None
    assert t.observe("s", "x", "c", (ID, A), None, at(11)) is None
    assert t.observe("s", "x", "c", (ID, A, B), None, at(12)) == ((ID, A), (ID, A, B))
    assert t.observe("s", "x", "c", (ID, ("a", "varchar(5)"), B), None, at(13)) == \
        ((ID, A, B), (ID, ("a", "varchar(5)"), B))  # a type change
    assert t.observe("s", "x", "c", (ID, B), None, at(14)) == ((ID, ("a", "varchar(5)"), B), (ID, B))


def test_an_update_leaving_out_toast_values_is_not_a_change():
    t = tracker()
    t.observe("s", "x", "c", (ID, A, BIG), None, at(10))
    assert t.observe("s", "x", "u", (ID, A), (ID,), at(11)) is None  # big unchanged, left out
    assert t.observe("s", "x", "u", (ID, A), (ID, A, BIG), at(12)) is None  # the whole old row has it
    assert t.names("s", "x") == ["id", "a", "big"]


def test_an_update_shows_a_new_column_and_keeps_the_toast_values_it_left_out_in_place():
    t = tracker()
    t.observe("s", "x", "c", (ID, A, BIG), None, at(10))
    assert t.observe("s", "x", "u", (ID, A, B), (ID,), at(11)) == ((ID, A, BIG), (ID, A, BIG, B))


def test_a_missing_fixed_length_column_or_one_a_whole_old_row_lacks_is_dropped():
    t = tracker()
    t.observe("s", "x", "c", (ID, A, B), None, at(10))
    assert t.observe("s", "x", "u", (ID, A), (ID,), at(11)) == ((ID, A, B), (ID, A))  # an integer
    t2 = tracker()
    t2.observe("s", "x", "c", (ID, A, BIG), None, at(10))
    assert t2.observe("s", "x", "u", (ID, A), (ID, A), at(11)) == ((ID, A, BIG), (ID, A))


def test_a_first_update_sets_nothing_unless_its_old_tuple_is_the_whole_row():
    t = tracker()
    assert t.observe("s", "x", "u", (ID, A), (ID,), at(10)) is None
    assert t.names("s", "x") is None
    assert t.observe("s", "x", "u", (ID, A), (ID, A, BIG), at(11)) is None
    assert t.names("s", "x") == ["id", "a", "big"]


def test_sets_are_remembered_by_position_and_a_read_starts_from_the_last_one_at_its_start():
    memory = LocalMemory()
    first = tracker(memory, start=0)
    first.observe("s", "x", "c", (ID, A), None, at(10))
    first.observe("s", "x", "c", (ID, A, B), None, at(20))
    assert tracker(memory, start=15).known("s", "x") == (ID, A)  # a replay of (15, ...]
    assert tracker(memory, start=25).known("s", "x") == (ID, A, B)
    assert tracker(memory, start=5).known("s", "x") is None
    # a later read sees the change again only when it reads it again (same row, same message)
    again = tracker(memory, start=15)
    assert again.observe("s", "x", "c", (ID, A, B), None, at(20)) == ((ID, A), (ID, A, B))
    # another cluster's positions say nothing about this one
    assert known_at([(at(10, "other"), (ID,))], at(30)) is None


@pytest.fixture()
def store(tmp_path):
    s = open_store(f"sqlite:///{tmp_path / 'ckpt.sqlite'}")
    yield s
    s.close()


def test_the_store_keeps_column_sets_between_sources(store):
    one = tracker(StoreMemory(store, "p"), start=0)
    one.observe("s", "x", "c", (ID, A), None, at(10))
    one.observe("s", "x", "c", (ID, A), None, at(11))  # nothing new: nothing written
    recs = store.columns.all("p")
    assert [(r.schema, r.table, r.position, r.columns) for r in recs] == [
        ("s", "x", at(10), [{"name": "id", "type": "integer"}, {"name": "a", "type": "text"}])]
    two = tracker(StoreMemory(store, "p"), start=12)  # the next run: the ALTER came before it
    assert two.observe("s", "x", "c", (ID, A, B), None, at(13)) == ((ID, A), (ID, A, B))
    store.columns.record("p", "s", "x", at(13), [{"name": "id", "type": "integer"}])  # again: kept once
    assert len(store.columns.all("p")) == 2 and store.columns.all("other") == []


def test_messages_carry_the_change_and_sit_in_the_row_transaction():
    t = tracker()
    t.observe("s", "x", "c", (ID, A), None, at(10))
    change = t.observe("s", "x", "c", (ID, A, B), None, at(12))
    m = t.columns_message("s", "x", change, event_id="0/C:0:columns", position={"lsn": "0/C"}, ts_ms=5,
                          tx_id="9:0/D")
    assert (m.type, m.tx_id) == ("schema_change", "9:0/D")
    assert m.idempotency_key == f"t|{m.pipeline}|__control|schema_change|0/C:0:columns"
    id_a = [{"name": "id", "type": "integer"}, {"name": "a", "type": "text"}]
    assert m.fields == {"change": "columns", "db": "s", "schema": "s", "table": "x",
                        "columns": id_a + [{"name": "b", "type": "integer"}], "previous_columns": id_a}
    tr = t.truncate_message("s", "x", lsn="0/E", position={"lsn": "0/E"}, ts_ms=6, tx_id="10:0/F")
    assert tr.event_id == "0/E:truncate:s.x" and tr.fields["change"] == "truncate"
    assert tr.fields["columns"][-1] == {"name": "b", "type": "integer"}
