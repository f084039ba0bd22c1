"""The engine's status document (tidegate.status) and the metrics built on it, over a real
SQLite checkpoint store; the source head is handed in (no server)."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import pytest
from tidegate.positions import position_from_json
from tidegate.sources.mysql.position import BinlogPosition
from tidegate.status import log_bytes_between, pipeline_status, pipelines_status
from tidegate.store import open_store

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "plugins"))

SPEC = """\
pipeline: orders
source: {kind: mysql, conn_id: nowhere, tables: [shop.orders], server_id: 7}
sinks:
  - {id: events, kind: kafka, conn_id: k, topic: "t"}
  - {id: cache, kind: redis, conn_id: r, stream: "s", required: false}
"""


def mpos(file: str, pos: int) -> BinlogPosition:
    return position_from_json({"file": file, "pos": pos, "server_id": 1})


@pytest.fixture()
def store(tmp_path, monkeypatch):
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "orders.yaml").write_text(SPEC)
    (tmp_path / "pipelines" / "broken.yaml").write_text("pipeline: Bad Name\n")
    monkeypatch.setenv("TIDEGATE_PIPELINES_DIR", str(tmp_path / "pipelines"))
    s = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    yield s
    s.close()


def test_log_bytes_between_positions():
    files = [("mysql-bin.000001", 1000), ("mysql-bin.000002", 500), ("mysql-bin.000003", 300)]
    assert log_bytes_between(mpos("mysql-bin.000001", 400), mpos("mysql-bin.000001", 900)) == 500
    assert log_bytes_between(mpos("mysql-bin.000001", 400), mpos("mysql-bin.000003", 100),
                             files) == 600 + 500 + 100
    assert log_bytes_between(mpos("mysql-bin.000000", 4), mpos("mysql-bin.000003", 100), files) is None
    assert log_bytes_between({"lsn": "0/1000"}, {"lsn": "1/0"}) == (1 << 32) - 0x1000


def test_pipeline_status_checkpoints_lag_incidents_and_runs(store):
    epoch = store.leases.acquire("orders", "r1")
    store.checkpoints.write_many("orders", {"events": mpos("mysql-bin.000001", 900),
                                            "cache": mpos("mysql-bin.000001", 400)}, run_id="r1", epoch=epoch)
    jid = store.runs.begin("orders", "r1")
    store.runs.sink(jid, "events", start=mpos("mysql-bin.000001", 4),
                    end=mpos("mysql-bin.000001", 900), events=7, bytes=700, status="ok")
    store.runs.finish(jid, "success")
    inc = store.incidents.record("orders", "binlog_purged", mpos("mysql-bin.000001", 900),
                                 mpos("mysql-bin.000002", 4))
    head = mpos("mysql-bin.000001", 900)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=30)
    doc = pipeline_status(store, "orders", _spec(), (head, None, None), now=later)

    assert doc["halted"] and doc["incidents_open"] == 1
    (i,) = doc["incidents"]
    assert (i["id"], i["kind"], i["from"]["file"], i["to"]["file"]) == (inc.id, "binlog_purged",
                                                                       "mysql-bin.000001", "mysql-bin.000002")
    assert {"resolve": "accept_gap", "reason": i["resolve_with"][0]["reason"]} == i["resolve_with"][0]
    assert [r["resolve"] for r in i["resolve_with"]] == ["accept_gap", "resnapshot"]
    sinks = {s["id"]: s for s in doc["sinks"]}
    assert (sinks["events"]["version"], sinks["events"]["at_head"], sinks["events"]["lag_bytes"],
            sinks["events"]["lag_seconds"]) == (1, True, 0, 0.0)
    assert (sinks["cache"]["at_head"], sinks["cache"]["lag_bytes"]) == (False, 500)
    assert 29 < sinks["cache"]["lag_seconds"] < 60 and 29 < sinks["cache"]["checkpoint_age_seconds"] < 60
    (run,) = doc["runs"]
    assert (run["run_id"], run["status"], run["sinks"]["events"]["events"]) == ("r1", "success", 7)


def test_pipelines_status_reports_a_dead_source_and_broken_specs_without_raising(store):
    doc = pipelines_status(store=store, head_timeout_s=2)
    (p,) = doc["pipelines"]
    assert p["pipeline"] == "orders" and p["head"] is None and "nowhere" in p["head_error"].lower()
    assert [s["id"] for s in p["sinks"]] == ["events", "cache"] and not p["halted"]
    assert any("broken.yaml" in line for line in doc["spec_errors"])


def test_pipelines_status_asks_no_source_of_a_pipeline_include_leaves_out(store):
    asked = []

    class Parts:
        def source(self, spec, **kw):
            asked.append(spec.pipeline)
            raise OSError("not reached")

    doc = pipelines_status(store=store, parts=Parts(), include=lambda name: name != "orders")
    assert doc["pipelines"] == [] and asked == []
    every = pipelines_status(store=store, parts=Parts(), include=None)["pipelines"]
    assert [p["pipeline"] for p in every] == ["orders"] and asked == ["orders"]


class Recorder:
    def __init__(self):
        self.sent = []

    def incr(self, name, count=1, rate=None, *, tags=None):
        self.sent.append(("incr", name, count, tags))

    def gauge(self, name, value, rate=None, delta=None, *, tags=None):
        self.sent.append(("gauge", name, value, tags))


def test_state_metrics_name_and_tag_pipeline_and_sink(store):
    from tidegate_airflow.metrics import emit_run, emit_state

    epoch = store.leases.acquire("orders", "r1")
    store.checkpoints.write_many("orders", {"events": mpos("mysql-bin.000001", 900)}, run_id="r1",
                                 epoch=epoch)
    store.incidents.record("orders", "binlog_purged", None, None)
    status = pipeline_status(store, "orders", _spec(), (mpos("mysql-bin.000001", 1000), None, None))
    rec = Recorder()
    emit_state("orders", stats=rec, status=status)
    sent = {name: (kind, value, tags) for kind, name, value, tags in rec.sent}
    assert sent["tidegate.incidents_open.orders"] == ("gauge", 1, {"pipeline": "orders"})
    assert sent["tidegate.lag_bytes.orders.events"] == ("gauge", 100,
                                                        {"pipeline": "orders", "sink": "events"})
    assert sent["tidegate.checkpoint_age_seconds.orders.events"][0] == "gauge"
    assert "tidegate.lag_bytes.orders.cache" not in sent  # no checkpoint yet: nothing to tell

    rec = Recorder()
    emit_run({"pipeline": "orders", "mode": "incremental", "sinks": [
        {"id": "bus", "events": 3, "bytes": 30, "duplicates": 1, "dlq": None, "skipped": 2}]}, rec)
    assert [(k, n, v) for k, n, v, _ in rec.sent] == [
        ("incr", "tidegate.events.orders.bus", 3), ("incr", "tidegate.bytes.orders.bus", 30),
        ("incr", "tidegate.duplicates.orders.bus", 1), ("incr", "tidegate.skipped.orders.bus", 2)]
    rec = Recorder()
    emit_run({"pipeline": "orders", "mode": "dry_run", "sinks": [{"id": "bus", "events": 3}]}, rec)
    assert rec.sent == []


def test_emit_state_never_raises(monkeypatch):
    from tidegate_airflow.metrics import emit_state

    emit_state("no_such_pipeline", stats=Recorder(), status={"broken": True})  # logged, not raised


def _spec():
    """The spec of the fixture's pipelines folder."""
    from tidegate.catalog import find

    return find("orders")
