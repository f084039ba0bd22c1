"""Whole DAG runs through Airflow's own executor loop (``dag.test()``), every task on the
engine's real steps with a scripted source (the tasks' ``parts``) and a SQLite store: proves
the wiring, the short-circuit and the no-retry halt in a real task runner."""

from __future__ import annotations

import pytest

from tests.dags.conftest import dagbag
from tests.dags.engine_fakes import ScriptedSource, wire
from tests.dags.test_operators import place, purge_incident

UP = {"kind": "mysql", "file": "mysql-bin.000004", "pos": 900, "gtid_set": None, "server_id": 1,
      "server_uuid": None}


@pytest.fixture(scope="module")
def airflow_db():
    from airflow.utils import db

    db.initdb()  # the tmp AIRFLOW_HOME's SQLite database


def wired_dag(source: ScriptedSource):
    """The shop_mysql DAG whose every task gets the scripted source (its ``parts``)."""
    dag = dagbag().dags["cdc_shop_mysql"]
    wire(source, *dag.tasks)
    return dag


def _states(dr) -> dict[str, tuple[str, int]]:
    return {ti.task_id: (str(getattr(ti.state, "value", ti.state)), ti.try_number)
            for ti in dr.get_task_instances()}


def test_nothing_to_do_run_succeeds_without_spark(pipelines_dir, airflow_db):
    place("shop_mysql", {"events": UP, "bus": UP, "cache": UP})
    source = ScriptedSource()
    dr = wired_dag(source).test()
    states = _states(dr)
    assert str(getattr(dr.state, "value", dr.state)) == "success", states
    assert states["deliver"][0] == "skipped"
    assert {k: v[0] for k, v in states.items() if k != "deliver"} == {
        "guard": "success", "bounds": "success", "release": "success", "report": "success"}
    assert source.calls == ["identity", "retention", "preflight", "release"]


def test_halt_fails_the_run_at_the_guard_without_retry(pipelines_dir, airflow_db):
    n = purge_incident("shop_mysql")
    source = ScriptedSource()
    dr = wired_dag(source).test()
    states = _states(dr)
    assert str(getattr(dr.state, "value", dr.state)) == "failed", states
    assert states["guard"] == ("failed", 1)  # retries=3, but a halt is not retried
    assert states["bounds"][0] == "upstream_failed" and states["deliver"][0] == "upstream_failed"
    assert source.calls == []
    assert n == 1
