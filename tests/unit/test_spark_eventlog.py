"""benchmarks/spark_eventlog.py: what an event log says about a Spark application's time (the
figures benchmarks/cluster.py prints), and the worker layout of the `spark` service it runs on."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(name: str, path: Path):
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    loader.exec_module(module)
    return module


eventlog = load("tidegate_spark_eventlog", ROOT / "benchmarks" / "spark_eventlog.py")


def task_end(tid: int, executor: str, launch: int, finish: int, run: int, deser: int = 0, ser: int = 0,
             fetch: int = 0, failed: bool = False, size: int = 1024) -> str:
    return json.dumps({
        "Event": "SparkListenerTaskEnd", "Stage ID": tid, "Task End Reason": {"Reason": "Success"},
        "Task Info": {"Task ID": tid, "Index": 0, "Launch Time": launch, "Executor ID": executor,
                      "Host": "127.0.0.1", "Getting Result Time": fetch, "Finish Time": finish,
                      "Failed": failed, "Killed": False},
        "Task Metrics": {"Executor Deserialize Time": deser, "Executor Run Time": run,
                         "Result Serialization Time": ser, "Result Size": size}})


LOG = [
    json.dumps({"Event": "SparkListenerApplicationStart", "App Name": "tidegate-p", "App ID": "app-1",
                "Timestamp": 1_000}),
    json.dumps({"Event": "SparkListenerExecutorAdded", "Timestamp": 2_000, "Executor ID": "0",
                "Executor Info": {"Host": "127.0.0.1", "Total Cores": 1}}),
    json.dumps({"Event": "SparkListenerExecutorAdded", "Timestamp": 2_100, "Executor ID": "1",
                "Executor Info": {"Host": "127.0.0.1", "Total Cores": 1}}),
    json.dumps({"Event": "SparkListenerJobStart", "Job ID": 0, "Submission Time": 4_900}),
    json.dumps({"Event": "SparkListenerJobStart", "Job ID": 1, "Submission Time": 4_900}),
    # Two tasks at once on the two executors, then a third after a gap.
    task_end(0, "0", 5_000, 9_000, run=3_000, deser=500, ser=100, fetch=8_800),
    task_end(1, "1", 5_000, 8_000, run=2_500, deser=400),
    task_end(2, "0", 12_000, 13_000, run=700, deser=100),
    task_end(3, "1", 12_000, 12_500, run=100, failed=True),  # a failed attempt did no work
    "",
    json.dumps({"Event": "SparkListenerApplicationEnd", "Timestamp": 15_000}),
]


def test_tasks_per_executor_task_cost_and_where_the_span_went():
    s = eventlog.summary(eventlog.parse(LOG))
    assert (s["app"], s["jobs"], s["tasks"], s["span_s"]) == ("tidegate-p", 2, 3, 14.0)
    assert s["executors"] == {"0": {"host": "127.0.0.1", "cores": 1}, "1": {"host": "127.0.0.1", "cores": 1}}
    assert s["per_executor"] == {"0": {"host": "127.0.0.1", "tasks": 2, "busy_s": 5.0},
                                 "1": {"host": "127.0.0.1", "tasks": 1, "busy_s": 3.0}}
    # Durations 4, 3, 1 s; scheduler delay as Spark UI counts it: what is left of a duration
    # after run, deserialization, result serialization and the driver's result fetch.
    assert s["task_duration_s"] == {"mean": pytest.approx(8 / 3), "median": 3.0}
    assert s["getting_result_s"]["mean"] == pytest.approx(0.2 / 3)
    delays = [4_000 - 3_000 - 500 - 100 - 200, 3_000 - 2_500 - 400, 1_000 - 700 - 100]
    assert s["scheduler_delay_s"]["mean"] == pytest.approx(sum(delays) / 3 / 1000)
    assert s["deserialize_s"]["median"] == 0.4
    # 14 s = 4 s to the first task + 5 s with a task running + 5 s of the driver alone, 2 of
    # them after the last task.
    assert (s["first_task_after_s"], s["tasks_running_s"], s["driver_only_s"], s["after_last_task_s"]) == \
        (4.0, 5.0, 5.0, 2.0)


def test_an_application_with_no_task():
    s = eventlog.summary(eventlog.parse(LOG[:3] + LOG[-1:]))
    assert s["tasks"] == 0 and s["per_executor"] == {} and "task_duration_s" not in s


def test_busy_time_counts_overlaps_once():
    assert eventlog.busy_ms([(0, 10), (5, 15), (20, 25), (21, 22)]) == 20
    assert eventlog.busy_ms([]) == 0


def test_a_rolling_log_is_read_in_its_files_order(tmp_path):
    folder = tmp_path / "eventlog_v2_app-1"
    folder.mkdir()
    parts = [LOG[:5], LOG[5:7], LOG[7:]]
    for n, lines in zip((1, 2, 10), parts, strict=True):
        (folder / f"events_{n}_app-1").write_text("\n".join(lines) + "\n")
    (folder / "appstatus_app-1").write_text("")
    files = [p.name for p in eventlog.event_files(folder)]
    assert files == ["events_1_app-1", "events_2_app-1", "events_10_app-1"]
    assert eventlog.summary(eventlog.read_app(folder)) == eventlog.summary(eventlog.parse(LOG))
    single = tmp_path / "app-1"
    single.write_text("\n".join(LOG))
    assert eventlog.read_app(single).tasks == eventlog.parse(LOG).tasks


def test_the_spark_service_runs_one_worker_or_two_of_one_core(tmp_path, monkeypatch):
    monkeypatch.setenv("TIDEGATE_SERVICES_DIR", str(tmp_path))
    monkeypatch.delenv("TIDEGATE_SPARK_WORKERS", raising=False)
    services = load("tidegate_services_layout", ROOT / "scripts" / "services")
    assert services.COMPONENTS["spark"] == ("master", "worker")
    monkeypatch.setenv("TIDEGATE_SPARK_WORKERS", "2")
    assert services.spark_workers() == ("worker", "worker2")
    ports = services.spark_ports()
    assert len(set(ports.values())) == len(ports), ports
    # A second worker that a pid file records is stopped and shown also without the setting.
    monkeypatch.delenv("TIDEGATE_SPARK_WORKERS")
    folder = services.BASE / "spark"  # tmp_path, or a folder of /var/tmp when root cannot share it
    folder.mkdir(parents=True)
    try:
        (folder / "worker2.pid").write_text("1")
        assert services.spark_workers() == ("worker", "worker2")
    finally:
        shutil.rmtree(services.BASE)
    monkeypatch.setenv("TIDEGATE_SPARK_WORKERS", "3")
    with pytest.raises(SystemExit, match="TIDEGATE_SPARK_WORKERS='3'.*from 1 to 2"):
        services.spark_worker_count()
