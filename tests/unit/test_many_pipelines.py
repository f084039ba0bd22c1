"""Many pipelines in one folder: what each face of tidegate reads of it stays its own share.

The DAG file's parse reads every spec once (and checks the folder's replication clients in one
pass); a run, a task's parse and the state of one pipeline read that pipeline's spec only
(benchmarks/pipelines.py measures what this costs at 10, 100 and 500 specs). What is read is
observed with Python's audit events (tests/file_reads.py) and the profiler hook: nothing of the
engine is replaced.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from tidegate import catalog
from tidegate.sources.mysql import spec as mysql_spec
from tidegate.sources.postgres import spec as postgres_spec
from tidegate.status import pipelines_status
from tidegate.store import open_store

from tests.file_reads import many_spec, reads_of, write_many

N = 40


@pytest.fixture()
def folder(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "pipelines"
    write_many(d, N)
    monkeypatch.setenv("TIDEGATE_PIPELINES_DIR", str(d))
    return d


def test_scan_lists_the_folder_once_and_reads_each_spec_once(folder):
    with reads_of(folder) as seen:
        found = catalog.scan()
    assert [s.pipeline for s in found.specs] == [f"p_{i:03d}" for i in range(N)] and found.problems == []
    assert sorted(seen["opened"]) == [f"p_{i:03d}.yaml" for i in range(N)]
    assert len(seen["listed"]) == 1


def test_scan_asks_each_spec_for_its_replication_client_once(folder):
    """The check that no two pipelines share a server_id or a slot on one connection looks each
    spec's up once: it does not compare every pair (which grows with the square of the folder)."""
    watched = {mysql_spec.replication_client.__code__, postgres_spec.replication_client.__code__}
    asked = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in watched:
            asked.append(frame.f_code.co_filename)

    sys.setprofile(profile)
    try:
        found = catalog.scan()
    finally:
        sys.setprofile(None)
    assert len(found.specs) == N
    assert len(asked) == N


def test_find_reads_only_the_named_spec_and_never_lists_the_folder(folder):
    with reads_of(folder) as seen:
        found = catalog.find("p_017")
    assert found.pipeline == "p_017" and found.source.kind == "postgres"
    assert seen == {"opened": ["p_017.yaml"], "listed": []}


def test_find_of_a_spec_named_otherwise_still_searches_the_folder(folder):
    other = {**many_spec(0), "pipeline": "other_name", "source": {**many_spec(0)["source"], "server_id": 1}}
    (folder / "renamed.yaml").write_text(yaml.safe_dump(other))
    with reads_of(folder) as seen:
        assert catalog.find("other_name").path == str(folder / "renamed.yaml")
    assert seen["listed"] == ["os.scandir"] and "renamed.yaml" in seen["opened"]


def test_the_state_of_one_pipeline_reads_only_its_spec(folder, tmp_path):
    """What a failed or retried task's callback reads to emit its metrics (metrics.emit_state)
    and ``tidegate status <pipeline>``: that pipeline's spec, not the folder's."""
    (folder / "zz_broken.yaml").write_text("pipeline: Bad Name\n")
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    try:
        with reads_of(folder) as seen:
            doc = pipelines_status(store=store, pipelines=["p_020"], with_lag=False)
        [entry] = doc["pipelines"]
        assert (entry["pipeline"], entry["has_spec"], entry["source_kind"]) == ("p_020", True, "mysql")
        assert seen == {"opened": ["p_020.yaml"], "listed": []}
        assert doc["spec_errors"] == []  # the broken neighbour is not this pipeline's problem
        # the whole folder's document still names every problem
        every = pipelines_status(store=store, with_lag=False)
        assert len(every["pipelines"]) == N and any("zz_broken.yaml" in p for p in every["spec_errors"])
    finally:
        store.close()


def test_the_state_of_a_pipeline_with_a_broken_spec_names_its_problem(folder, tmp_path):
    (folder / "p_005.yaml").write_text("pipeline: p_005\nsource: {kind: nosuch}\n")
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    try:
        doc = pipelines_status(store=store, pipelines=["p_005"], with_lag=False)
    finally:
        store.close()
    [entry] = doc["pipelines"]
    assert not entry["has_spec"]
    own = str(folder / "p_005.yaml")
    assert doc["spec_errors"] and all(line.startswith(own) for line in doc["spec_errors"])


def test_specs_are_read_with_libyaml_and_still_refuse_a_duplicate_key(tmp_path):
    """Both DAG files read every spec at each parse: with libyaml's parser reading 500 specs
    took a third of the CPU of PyYAML's pure-Python one (benchmarks/pipelines.py)."""
    from tidegate import spec as specmod

    assert yaml.__with_libyaml__  # requirements.txt's PyYAML wheel ships it
    assert issubclass(specmod._UniqueKeyLoader, yaml.CSafeLoader)
    path = tmp_path / "dup.yaml"
    path.write_text(yaml.safe_dump(many_spec(1)) + "pipeline: again\n")
    [problem] = specmod.validate_file(path)
    assert problem.startswith(f"{path}: line ") and "not valid YAML: duplicate key 'pipeline'" in problem
