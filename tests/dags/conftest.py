"""Airflow-facing tests: a private AIRFLOW_HOME (nothing is written to ~/airflow), the project's
dags/ and plugins/ folders, and pipeline specs copied into a tmp TIDEGATE_PIPELINES_DIR."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DAGS = ROOT / "dags"
PLUGINS = ROOT / "plugins"
EXAMPLES = ROOT / "include" / "pipelines"

# Set before Airflow is imported anywhere in this session.
_HOME = tempfile.mkdtemp(prefix="tidegate-airflow-home-")
atexit.register(shutil.rmtree, _HOME, True)
os.environ["AIRFLOW_HOME"] = _HOME
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(DAGS)
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(PLUGINS)
os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")
for p in (str(PLUGINS), str(ROOT / "include")):
    if p not in sys.path:
        sys.path.insert(0, p)


@pytest.fixture()
def pipelines_dir(tmp_path, monkeypatch) -> Path:
    """A tmp pipelines folder holding copies of include/pipelines/*.yaml."""
    d = tmp_path / "pipelines"
    d.mkdir()
    for f in sorted(EXAMPLES.glob("*.yaml")):
        shutil.copy(f, d / f.name)
    monkeypatch.setenv("TIDEGATE_PIPELINES_DIR", str(d))
    monkeypatch.setenv("TIDEGATE_CHECKPOINT_STORE", f"sqlite:///{tmp_path / 'store.db'}")
    return d


# The examples' closing block: their runs go through the Spark Connect server.
CONNECT_BLOCK = "\nspark:\n  conn_id: spark_connect\n"


@pytest.fixture()
def spark_submit_specs(pipelines_dir) -> Path:
    """The examples' copies without their ``spark: {conn_id: spark_connect}`` block: their deliver
    tasks spark-submit through ``spark_default`` (request it before ``dags``)."""
    for f in pipelines_dir.glob("*.yaml"):
        text = f.read_text()
        assert CONNECT_BLOCK in text, f
        f.write_text(text.replace(CONNECT_BLOCK, "\n"))
    return pipelines_dir


def dagbag(dag_folder: Path = DAGS):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(dag_folder))


@pytest.fixture()
def dags(pipelines_dir) -> dict[str, Any]:
    bag = dagbag()
    assert bag.import_errors == {}, bag.import_errors
    return bag.dags


class FakeTI:
    """The bits of a RuntimeTaskInstance the operators use."""

    map_index = -1

    def __init__(self, xcoms: dict[str, Any] | None = None):
        self.xcoms = dict(xcoms or {})
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value

    def xcom_pull(self, task_ids: str | None = None, key: str = "return_value") -> Any:
        return self.xcoms.get(task_ids)


def make_context(dag=None, task=None, *, conf: dict | None = None, run_id: str = "manual__2026-01-01",
                 run_type: str = "manual", user: str | None = "alice",
                 xcoms: dict[str, Any] | None = None) -> dict[str, Any]:
    """A task context as Airflow builds it: params = the DAG's defaults updated by the conf."""
    params = {k: dag.params[k] for k in dag.params} if dag is not None else {}
    params.update(conf or {})
    dag_run = SimpleNamespace(run_id=run_id, run_type=run_type, conf=dict(conf or {}),
                              triggering_user_name=user)
    return {"params": params, "dag_run": dag_run, "run_id": run_id, "ti": FakeTI(xcoms), "task": task}


@pytest.fixture()
def calls() -> list:
    return []
