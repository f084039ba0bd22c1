"""What a Spark application's event log says about where its time went (benchmarks/cluster.py).

The event log (``spark.eventLog.enabled``, uncompressed) is one JSON object per line. This reads
the application's start and end, the executors it got, and every finished task
(``SparkListenerTaskEnd``: its executor, launch and finish times and metrics), and sums them up:
how many tasks each executor ran, what a task costs (duration, the time Spark spent before and
around the task's own work), and how the application's span divides between starting up,
tasks running, and the driver alone (in a tidegate deliver job: delivering, waiting on nothing
but itself).

Scheduler delay is Spark UI's figure: a task's duration less its run time, deserialization,
result serialization and the time the driver took to fetch its result.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Task:
    executor: str
    host: str
    launch_ms: int
    finish_ms: int
    run_ms: int
    deserialize_ms: int
    serialize_ms: int
    getting_result_ms: int
    result_bytes: int

    @property
    def duration_ms(self) -> int:
        return self.finish_ms - self.launch_ms

    @property
    def scheduler_delay_ms(self) -> int:
        return max(0, self.duration_ms - self.run_ms - self.deserialize_ms - self.serialize_ms
                   - self.getting_result_ms)


@dataclass
class Application:
    name: str = ""
    app_id: str = ""
    start_ms: int = 0
    end_ms: int = 0
    executors: dict[str, dict] = field(default_factory=dict)  # id -> {"host", "cores"}
    tasks: list[Task] = field(default_factory=list)
    jobs: int = 0


def parse(lines: Iterable[str]) -> Application:
    """An application from its event log's lines (failed tasks are left out: they did no work
    that reached the driver)."""
    app = Application()
    for line in lines:
        if not line.strip():
            continue
        ev = json.loads(line)
        kind = ev.get("Event")
        if kind == "SparkListenerApplicationStart":
            app.name, app.app_id, app.start_ms = ev.get("App Name", ""), ev.get("App ID", ""), ev["Timestamp"]
        elif kind == "SparkListenerApplicationEnd":
            app.end_ms = ev["Timestamp"]
        elif kind == "SparkListenerExecutorAdded":
            info = ev.get("Executor Info", {})
            app.executors[ev["Executor ID"]] = {"host": info.get("Host"), "cores": info.get("Total Cores")}
        elif kind == "SparkListenerJobStart":
            app.jobs += 1
        elif kind == "SparkListenerTaskEnd":
            task = _task(ev)
            if task is not None:
                app.tasks.append(task)
    return app


def _task(ev: dict) -> Task | None:
    info, metrics = ev.get("Task Info", {}), ev.get("Task Metrics") or {}
    if info.get("Failed") or info.get("Killed"):
        return None
    launch, finish, fetch = info["Launch Time"], info["Finish Time"], info.get("Getting Result Time", 0)
    return Task(executor=str(info["Executor ID"]), host=info.get("Host", ""), launch_ms=launch,
                finish_ms=finish,
                run_ms=metrics.get("Executor Run Time", 0),
                deserialize_ms=metrics.get("Executor Deserialize Time", 0),
                serialize_ms=metrics.get("Result Serialization Time", 0),
                getting_result_ms=finish - fetch if fetch > 0 else 0,
                result_bytes=metrics.get("Result Size", 0))


def event_files(path: Path) -> list[Path]:
    """The files of one application's log: the file itself, or (a rolling log, Spark 4's
    default: a folder ``eventlog_v2_<app>``) its ``events_<n>_<app>`` files in order."""
    if not path.is_dir():
        return [path]
    files = [p for p in path.iterdir() if p.name.startswith("events_")]
    return sorted(files, key=lambda p: int(p.name.split("_")[1]))


def read_app(path: Path) -> Application:
    """The application whose event log is ``path`` (a file, or a rolling log's folder)."""
    lines: list[str] = []
    for f in event_files(path):
        lines += f.read_text(encoding="utf-8", errors="replace").splitlines()
    return parse(lines)


def busy_ms(intervals: Iterable[tuple[int, int]]) -> int:
    """Milliseconds covered by at least one of the intervals."""
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def summary(app: Application) -> dict:
    """The figures benchmarks/cluster.py prints (times in seconds)."""
    tasks = app.tasks
    span = (app.end_ms - app.start_ms) / 1000 if app.end_ms else None
    out: dict = {"app": app.name, "span_s": span, "jobs": app.jobs, "tasks": len(tasks),
                 "executors": {k: v for k, v in sorted(app.executors.items())}}
    per: dict[str, dict] = {}
    for t in tasks:
        e = per.setdefault(t.executor, {"host": t.host, "tasks": 0, "busy_s": 0.0})
        e["tasks"] += 1
        e["busy_s"] += t.duration_ms / 1000
    out["per_executor"] = dict(sorted(per.items()))
    if not tasks:
        return out

    def stat(values: list[float]) -> dict:
        return {"mean": statistics.fmean(values) / 1000, "median": statistics.median(values) / 1000}

    out["task_duration_s"] = stat([t.duration_ms for t in tasks])
    out["task_run_s"] = stat([t.run_ms for t in tasks])
    out["scheduler_delay_s"] = stat([t.scheduler_delay_ms for t in tasks])
    out["deserialize_s"] = stat([t.deserialize_ms for t in tasks])
    out["getting_result_s"] = stat([t.getting_result_ms for t in tasks])
    out["result_mb_mean"] = statistics.fmean(t.result_bytes for t in tasks) / 2**20
    first = min(t.launch_ms for t in tasks)
    last = max(t.finish_ms for t in tasks)
    running = busy_ms((t.launch_ms, t.finish_ms) for t in tasks) / 1000
    out["first_task_after_s"] = (first - app.start_ms) / 1000 if app.start_ms else None
    out["tasks_running_s"] = running  # some task running (the driver may be delivering too)
    out["after_last_task_s"] = (app.end_ms - last) / 1000 if app.end_ms else None
    if span:
        # The span less start-up and the task time: the driver alone (delivering, or waiting on
        # its sinks) with no task running.
        out["driver_only_s"] = span - out["first_task_after_s"] - running
    return out


__all__ = ["Application", "Task", "busy_ms", "event_files", "parse", "read_app", "summary"]
