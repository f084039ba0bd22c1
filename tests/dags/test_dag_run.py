"""Whole DAG runs through Airflow's own executor loop (``dag.test()``), the engine replaced by
fakes: proves the wiring, the short-circuit and the no-retry halt in a real task runner."""

from __future__ import annotations

import pytest

from tests.dags.conftest import dagbag

UP = {"file": "mysql-bin.000004", "pos": 900, "gtid_set": None, "server_id": 1, "server_uuid": None}


@pytest.fixture(scope="module")
def airflow_db():
    from airflow.utils import db

    db.initdb()  # the tmp AIRFLOW_HOME's SQLite database


@pytest.fixture()
def engine(monkeypatch):
    import tidegate.guards as guards
    import tidegate.runner as runner

    calls: list[str] = []

    def rec(name, result):
        def fn(*a, **kw):
            calls.append(name)
            return result
        return fn

    from tidegate.positions import position_from_json

    up = position_from_json(UP)
    monkeypatch.setattr(runner, "prepare_bounds", rec("bounds", runner.Bounds(
        "shop_mysql", up, {"events": up, "bus": up, "cache": up})))
    monkeypatch.setattr(runner, "release", rec("release", up))
    monkeypatch.setattr(guards, "check_halted", rec("halted", None))
    for name in ("guard_failover", "guard_retention"):
        monkeypatch.setattr(guards, name, rec(name, {"status": "ok"}))
    monkeypatch.setattr(guards, "preflight", rec("preflight", []))
    return calls


def _states(dr) -> dict[str, tuple[str, int]]:
    return {ti.task_id: (str(getattr(ti.state, "value", ti.state)), ti.try_number)
            for ti in dr.get_task_instances()}


def test_nothing_to_do_run_succeeds_without_spark(pipelines_dir, airflow_db, engine):
    dag = dagbag().dags["cdc_shop_mysql"]
    dr = dag.test()
    states = _states(dr)
    assert str(getattr(dr.state, "value", dr.state)) == "success", states
    assert states["deliver"][0] == "skipped"
    assert {k: v[0] for k, v in states.items() if k != "deliver"} == {
        "guard": "success", "bounds": "success", "release": "success", "report": "success"}
    assert engine == ["halted", "guard_failover", "guard_retention", "preflight", "bounds", "release"]


def test_halt_fails_the_run_at_the_guard_without_retry(pipelines_dir, airflow_db, engine, monkeypatch):
    from types import SimpleNamespace

    import tidegate.guards as guards

    inc = SimpleNamespace(id=1, kind="binlog_purged", pipeline="shop_mysql", detected_at="now",
                          from_position="mysql-bin.000001:4", to_position="mysql-bin.000003:4", detail="")

    def halted(*a, **kw):
        raise guards.ContinuityHalt(inc)

    monkeypatch.setattr(guards, "check_halted", halted)
    dag = dagbag().dags["cdc_shop_mysql"]
    dr = dag.test()
    states = _states(dr)
    assert str(getattr(dr.state, "value", dr.state)) == "failed", states
    assert states["guard"] == ("failed", 1)  # retries=3, but a halt is not retried
    assert states["bounds"][0] == "upstream_failed" and states["deliver"][0] == "upstream_failed"
    assert engine == []
