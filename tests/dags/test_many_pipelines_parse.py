"""The DAG file beside many pipelines: the dag-processor's parse reads the folder once, each spec
once, and builds one DAG per spec; a task's parse (the parsing context names its DAG) reads its
own spec only, whatever the folder holds (benchmarks/pipelines.py measures both at 10, 100 and
500 specs). What is read is observed with Python's audit events (tests/file_reads.py)."""

from __future__ import annotations

import pytest

from tests.file_reads import reads_of, write_many

N = 6


@pytest.fixture()
def folder(tmp_path, monkeypatch):
    d = tmp_path / "pipelines"
    names = write_many(d, N)
    monkeypatch.setenv("TIDEGATE_PIPELINES_DIR", str(d))
    monkeypatch.delenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", raising=False)
    return d, names


def test_the_dag_files_parse_lists_the_folder_once_and_reads_each_spec_once(folder):
    from tidegate_airflow.factory import build_dags

    d, names = folder
    with reads_of(d) as seen:
        dags = build_dags()
    assert sorted(dags) == [f"cdc_{n}" for n in names]
    assert sorted(seen["opened"]) == [f"{n}.yaml" for n in names] and len(seen["listed"]) == 1


def test_a_tasks_parse_reads_only_its_own_spec(folder, monkeypatch):
    from tidegate_airflow.factory import build_dags

    d, _ = folder
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "cdc_p_003")
    with reads_of(d) as seen:
        dags = build_dags()
    assert list(dags) == ["cdc_p_003"]
    assert seen == {"opened": ["p_003.yaml"], "listed": []}
