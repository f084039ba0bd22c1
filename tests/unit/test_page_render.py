"""The tidegate page's pure parts: positions as people read them, the run history and its SVG
charts, the page's HTML (forms, raw JSON a click away) and the resolution form's validation.
The page in a real Airflow, per-user rights and the actions are in
tests/integration/test_airflow_scheduler.py ("the page")."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from tidegate.positions import position_from_json, position_text
from tidegate.status import run_history
from tidegate.store.records import JournalEntry, JournalSink

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins"))  # as Airflow puts it

from tidegate_airflow.charts import bar_chart, history_charts, human  # noqa: E402
from tidegate_airflow.page_actions import FormError, resolution_conf, resolutions_for  # noqa: E402
from tidegate_airflow.ui import render  # noqa: E402

MARIADB = {"kind": "mysql", "file": "mysql-bin.000007", "pos": 1234, "gtid_set": "0-1-42",
           "server_id": 1, "server_uuid": None}


def test_positions_read_as_file_pos_with_gtid_and_lsn_as_x_slash_y():
    assert position_text(MARIADB) == "mysql-bin.000007:1234 [0-1-42]"
    assert position_text({"kind": "mysql", "file": "b.000001", "pos": 4}) == "b.000001:4"
    assert position_text({"kind": "postgres", "lsn": "16/B374D848"}) == "16/B374D848"
    assert position_text({"snapshot": "s1", "chunk": 3, "handoff": MARIADB}) == (
        "snapshot s1 chunk 3 (handoff mysql-bin.000007:1234 [0-1-42])")
    assert position_text(None) is None
    assert position_text({"not": "a position"}) == '{"not": "a position"}'  # shown, never raised


def _entry(i: int, start_pos: int | None, end_pos: int | None, events: int, started: str, finished: str):
    def pos(p):
        return None if p is None else position_from_json({**MARIADB, "pos": p})
    sinks = {"cache": JournalSink("cache", pos(start_pos), pos(end_pos), events, events * 10, "success")}
    return JournalEntry(i, "p", f"run{i}", "incremental", None, None, "success", started, finished, sinks)


def test_run_history_is_events_and_lag_per_run_oldest_first():
    journal = [_entry(1, None, 500, 0, "2026-01-01T00:00:00+00:00", "2026-01-01T00:00:10+00:00"),
               _entry(2, 500, 800, 3, "2026-01-01T00:01:00+00:00", "2026-01-01T00:01:12+00:00"),
               _entry(3, 800, 800, 0, "2026-01-01T00:02:00+00:00", "2026-01-01T00:02:05+00:00")]
    history = run_history(journal)
    assert [h["run_id"] for h in history] == ["run1", "run2", "run3"]
    assert [h["events"] for h in history] == [0, 3, 0]
    assert [h["lag_bytes"] for h in history] == [None, 300, 0]  # no checkpoint before run1
    assert [h["lag_seconds"] for h in history] == [None, 72.0, 65.0]  # previous start .. this end
    assert run_history([]) == []
    # A window of the last two runs still measures its first run from the one before it.
    assert [(h["run_id"], h["lag_seconds"]) for h in run_history(journal, limit=2)] == [
        ("run2", 72.0), ("run3", 65.0)]


def test_a_chart_has_one_bar_per_run_with_its_value_and_a_stub_when_unknown():
    runs = [{"run_id": "a", "lag_bytes": None}, {"run_id": "b", "lag_bytes": 300},
            {"run_id": "c", "lag_bytes": 150}]
    svg = bar_chart("lag_bytes", "lag", runs, "B", "#000")
    bar = r"<rect class='(bar[^']*)' data-run='(\w)' data-value='(\d*)'[^>]*height='([\d.]+)'"
    bars = re.findall(bar, svg)
    assert [(k, r, v) for k, r, v, _ in bars] == [
        ("bar unknown", "a", ""), ("bar", "b", "300"), ("bar", "c", "150")]
    heights = [float(h) for *_, h in bars]
    assert heights[1] == pytest.approx(2 * heights[2])  # to scale
    assert "<title>b: 300B</title>" in svg
    assert history_charts([]) == "<p class=muted>no journaled run yet</p>"
    assert history_charts(runs).count("<svg") == 3  # lag seconds, lag bytes, events
    assert (human(1500, "B"), human(12.5, "s"), human(3, "")) == ("1.5kB", "12.5 s", "3")


def _doc(**pipeline):
    p = {"pipeline": "orders", "dag_id": "cdc_orders", "halted": True, "paused": False, "tenant": None,
         "source_kind": "mysql", "schedule": None, "head": MARIADB, "head_text": "mysql-bin.000007:1234",
         "head_error": None, "sinks": [], "runs": [], "history": [],
         "may": {"resolve": True, "pause": True},
         "incidents": [{"id": 4, "kind": "binlog_purged", "resolved": False, "from": MARIADB,
                        "from_text": "mysql-bin.000007:1234 [0-1-42]", "to": None, "to_text": None,
                        "detected_at": "t", "detail": "gone",
                        "resolve_with": [{"resolve": "accept_gap", "reason": "<why>"}]}]}
    p.update(pipeline)
    return {"generated_at": "now", "store": "sqlite:///x", "spec_errors": [], "pipelines": [p]}


def test_the_page_shows_readable_positions_the_raw_json_in_details_and_the_forms():
    page = render(_doc(), "ops", csrf="tok123", done="run r1 triggered")
    assert "<code class=pos>mysql-bin.000007:1234 [0-1-42]</code><details><summary>JSON</summary>" in page
    assert "&quot;file&quot;: &quot;mysql-bin.000007&quot;" in page  # the raw JSON, escaped
    assert "action='pipelines/orders/resolve'" in page and "action='pipelines/orders/pause'" in page
    assert page.count("name=csrf_token value='tok123'") == 2
    assert "<option value='accept_gap'>" in page and "<option value='resnapshot'>" in page
    assert "textarea name=reason rows=2 required" in page and "<p class=note id=done>run r1" in page


def test_the_page_offers_no_action_the_user_may_not_take():
    page = render(_doc(may={"resolve": False, "pause": False}, paused=True), "viewer")
    assert "<form" not in page and "PAUSED" in page and "you may not trigger runs" in page


def test_a_resolution_needs_a_reason_and_a_way_that_fits_the_open_incidents():
    with pytest.raises(FormError, match=r"^reason: required"):
        resolution_conf({"resolve": "accept_gap", "reason": "  "}, ["binlog_purged"], "ops")
    with pytest.raises(FormError, match=r"resolve: choose one of continue"):
        resolution_conf({"resolve": "accept_gap", "reason": "x"}, ["schema_change"], "ops")
    with pytest.raises(FormError, match=r"^tables: only with resolve=resnapshot"):
        resolution_conf({"resolve": "accept_gap", "reason": "x", "tables": "a.b"}, ["slot_dropped"], "ops")
    with pytest.raises(FormError, match="no open incident"):
        resolution_conf({"resolve": "accept_gap", "reason": "x"}, [], "ops")
    assert resolution_conf({"resolve": "resnapshot", "reason": " lost ", "tables": "s.a, s.b"},
                           ["binlog_purged"], "ops") == {"resolve": "resnapshot", "reason": "lost",
                                                         "tables": ["s.a", "s.b"]}
    assert resolutions_for(["binlog_purged", "failover"]) == ["accept_gap", "resnapshot"]
    assert resolutions_for(["binlog_purged", "schema_change"]) == []


def test_the_resolve_form_says_when_the_run_would_wait_or_cannot_fit_every_open_incident():
    assert "the DAG is paused: the run waits until it is resumed" in render(_doc(paused=True), "ops")
    mixed = _doc()
    mixed["pipelines"][0]["incidents"].append({**mixed["pipelines"][0]["incidents"][0], "id": 5,
                                               "kind": "schema_change"})
    page = render(mixed, "ops")
    assert "form class=resolve" not in page and "need different resolutions" in page
