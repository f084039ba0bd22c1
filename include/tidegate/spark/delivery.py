"""A run delivered by one Spark task on the cluster (docs/architecture.md, "Processes").

With a Spark Connect connection, the deliver task's process only submits and waits for a run
whose read plan has no parallel parts (one log slice: the steady state of a pipeline), and for
every run under ``spark.tidegate.delivery: executor`` in the spec's ``spark.conf``. The whole
run (the read of its plan, the coordinator, the sinks, the checkpoints) runs in one Spark task,
on an executor's Python worker: the job is a one-row frame of one partition mapped by the run
(``mapInArrow``); its one row is the run report.

What the task needs travels pickled inside the function: the run's record as the deliver task
read it (the task never reads it again, so it has no "no record" case), the connections the spec
names and the hash salt, resolved by the deliver task (an executor has no Airflow), the
store's URL and the deliver task's ``TIDEGATE_*`` settings. The task reads the log as
``tidegate run`` does: a range of more than a few MiB is decoded in a reader process beside it,
so it uses two cores.

A failed task is retried by Spark (``spark.task.maxFailures``) as the deliver task would be by
Airflow: the new attempt reads the checkpoints that moved, takes the lease (a new epoch: the
failed attempt's producers, were they still alive, are fenced) and delivers the rest. An error a
retry cannot fix (fenced, halted, a bad spec or connection) ends the task normally with a
``fatal`` report, so Spark does not retry it; the deliver task raises it.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import re
import resource
import sys
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import DeliveryTaskError, FatalRunError, SpecError, TidegateError
from ..parts import resolved_parts
from ..segments import Chunk, Slice
from ..spec import DELIVERY_CONF, DELIVERY_MODES
from ..store import open_store
from .gathered import GatheredReader, gathered_frame, gathered_parts, part_reader

if TYPE_CHECKING:
    from ..run import PlannedRun

log = logging.getLogger(__name__)

REPORT_SCHEMA = "report STRING"


def delivery_mode(conf: Mapping[str, str]) -> str:
    """The spec's ``spark.tidegate.delivery`` (default ``auto``); raises on an unknown value."""
    mode = str(conf.get(DELIVERY_CONF, "auto")).strip()
    if mode not in DELIVERY_MODES:
        raise SpecError([f"spark.conf {DELIVERY_CONF}: {mode!r} is not one of {', '.join(DELIVERY_MODES)}: "
                         f"'auto' (the default) runs a run as one Spark job whose task delivers, a "
                         f"snapshot's chunks read by tasks of their own; 'gathered' parts read by tasks of "
                         f"their own, gathered into the delivery task; 'executor' the delivery task "
                         f"reads every part itself; 'client' the deliver task delivers, Spark tasks "
                         f"read the parts"])
    return mode


def on_executor(run: PlannedRun, conf: Mapping[str, str]) -> bool:
    """Whether Spark tasks deliver this run (see :func:`delivery_mode`): not under ``client``
    nor with a sink that writes through Spark itself (a Delta sink needs a session, and a task
    cannot open one on its own cluster)."""
    mode = delivery_mode(conf)
    through_spark = [s.id for s in run.spec.sinks if s.kind == "delta"]
    if mode == "client" or through_spark:
        if mode != "client":
            log.info("pipeline %s: sink(s) %s write through Spark: delivered by this process",
                     run.pipeline, ", ".join(through_spark))
        return False
    return True


def gathers_parts(run: PlannedRun, conf: Mapping[str, str]) -> bool:
    """Whether the run's parts are read by tasks of their own and gathered into the delivery task
    (gathered.py): under ``gathered``, a plan with parallel parts; under ``auto``, a plan with a
    snapshot's chunks (a chunk is a query the database serves, read ``snapshot.parallelism`` at
    a time). Otherwise the delivery task reads them itself, one after the other, the log
    streaming through its reader process: decoding a log slice costs about what delivering it
    does, so a delivery that reads as it goes takes max(read, deliver), and gathered slices take
    read / cores + deliver, no less (docs/architecture.md, "Parallel parts")."""
    mode = delivery_mode(conf)
    return (mode == "gathered" and has_parallel_parts(run)) or (mode == "auto" and has_chunks(run))


def has_chunks(run: PlannedRun) -> bool:
    return any(isinstance(s, Chunk) for s in run.record.segments or ())


def has_parallel_parts(run: PlannedRun) -> bool:
    """Snapshot chunks, or more than one log slice, among the parts Spark tasks would read
    (gathered.gathered_parts) of the run's read plan (none made yet: the delivery task makes it,
    and reads it itself)."""
    parts = gathered_parts(run.spec, run.record.segments or ())
    return any(isinstance(p, Chunk) for p in parts) or sum(isinstance(p, Slice) for p in parts) > 1


class TaskPayload(NamedTuple):
    """What the delivery task gets (secrets: pickled into the job, never logged)."""

    record: dict[str, Any]  # the run's record (RunRecord.to_json), as the deliver task read it
    connections: dict[str, Any]  # the connections the spec names, resolved
    salt: bytes  # the masking hash salt, resolved
    store_url: str
    settings: dict[str, str]  # the deliver task's TIDEGATE_* settings


def task_payload(run: PlannedRun, store_url: str) -> TaskPayload:
    """What the task gets: the run's record, the resolved connections and salt, the store URL."""
    spec, parts = run.spec, run.parts
    ids = [spec.source.conn_id, *(s.conn_id for s in spec.sinks if s.conn_id)]
    connections = {i: parts.connection(i) for i in dict.fromkeys(ids)}
    # The run's settings (timeouts, the reader process threshold) are the deliver task's, as
    # when it delivered itself: an executor's environment has none of them.
    settings = {k: v for k, v in os.environ.items() if k.startswith("TIDEGATE_")}
    return TaskPayload(run.record.to_json(), connections, parts.hash_salt(spec), store_url, settings)


def delivery_task(payload: TaskPayload, gathered: Iterator[Any] | None = None) -> Iterator[Any]:
    """The Spark task: the run, as a spark-submit driver runs it, reading in this worker (and a
    reader process of its own), or taking its parts from ``gathered`` (Arrow batches of the parts'
    rows, gathered.py); yields its report (or its fatal error) as one Arrow row."""
    t0, cpu0 = time.monotonic(), _cpu_with_children()
    warm = "tidegate.runner" in sys.modules  # a reused worker has the engine imported already
    clients = "confluent_kafka" in sys.modules  # a worker of tidegate's daemon has the clients
    # imported here, where the run happens: the deliver task that imports this module runs none
    # of it, and its CPU is what this shape saves
    import pyarrow as pa

    from ..bounds_step import RunRecord, planned_from
    from ..reader_process import ReaderProcess
    from ..runner import run_pipeline

    record, connections, salt, store_url, settings = payload
    try:
        with _environment(settings), _task_log() as lines, open_store(store_url) as store:
            run = planned_from(RunRecord.from_json(record), store, resolved_parts(connections, salt))
            with ReaderProcess(store_url) as own:
                segments = run.record.segments
                reader = own if gathered is None else GatheredReader(
                    gathered, segments, gathered_parts(run.spec, segments), own)
                report = run_pipeline(run, reader=reader)
    except TidegateError as exc:
        if not exc.fatal:
            raise  # Spark retries the task
        report = {"fatal": True, "error": f"{type(exc).__name__}: {exc}"}
    report["task_log"] = list(lines)
    for _ in gathered or ():  # the rest of the input (nothing, a run that planned again: all)
        pass
    # what the task cost where it ran (its reader process included): benchmarks/delivery_split.py
    report["delivery_task"] = {"pid": os.getpid(), "seconds": round(time.monotonic() - t0, 3),
                               "cpu_seconds": round(_cpu_with_children() - cpu0, 3), "worker_warm": warm,
                               "clients_preloaded": clients}
    text = json.dumps(report, sort_keys=True, default=str)
    yield pa.RecordBatch.from_arrays([pa.array([text], pa.string())], names=["report"])


TASK_LOG_LINES = 2000  # the last lines of a run's log the report carries back


@contextlib.contextmanager
def _task_log() -> Iterator[collections.deque]:
    """The engine's INFO lines while the run is delivered here, for the report: a Spark task's
    own output goes to the server's log, and the deliver task logs them again (what the run read,
    resumed, planned), as it would had it delivered itself."""
    lines: collections.deque = collections.deque(maxlen=TASK_LOG_LINES)

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append((record.levelno, record.name, f"{record.created:.3f}", record.getMessage()))

    engine, handler = logging.getLogger("tidegate"), Keep(logging.INFO)
    level = engine.level
    engine.setLevel(min(engine.getEffectiveLevel(), logging.INFO))
    engine.addHandler(handler)
    try:
        yield lines
    finally:
        engine.removeHandler(handler)
        engine.setLevel(level)


def relog(lines: list) -> None:
    """A delivery task's log lines (:func:`_task_log`) in this process's log, each under its own
    logger and level, with the time it was written there."""
    for level, name, created, message in lines:
        stamp = time.strftime("%H:%M:%S", time.gmtime(float(created))) + created[-4:]
        logging.getLogger(name).log(level, "[Spark task %s UTC] %s", stamp, message)


def _cpu_with_children() -> float:
    """CPU seconds of this process and of its children that ended (the reader process)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


@contextlib.contextmanager
def _environment(settings: Mapping[str, str]) -> Iterator[None]:
    """The run's settings in this worker's environment (a reader process it starts inherits
    them) for the run only: the worker is reused by the session's later tasks."""
    before = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def deliver_on_executor(spark: Any, run: PlannedRun, store_url: str,
                        conf: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run ``run`` as one Spark job through ``spark`` (a Connect client's session, or a
    spark-submit driver's own) with its parts gathered where :func:`gathers_parts` says so;
    returns its report. A fatal error of the task is raised here as
    :class:`~tidegate.errors.FatalRunError`; an engine error on each of the task's attempts
    (Spark retried it) as :class:`~tidegate.errors.DeliveryTaskError`, which Airflow retries."""
    payload = task_payload(run, store_url)
    barrier = needs_barrier(spark)
    gathered = gathers_parts(run, {**run.spec.spark.conf, **(conf or {})})
    if gathered:
        frame = _gathered_job(spark, run, payload, barrier)
    else:
        def task(batches: Iterator[Any]) -> Iterator[Any]:
            # The one input row is read to its end first: PySpark's worker goes back to the pool
            # for the next task only when its input was read through; otherwise it ends, and
            # every run paid a new worker (about 2 s more per run on a loaded 2-core machine).
            for _ in batches:
                pass
            yield from delivery_task(payload)

        # One partition, one task: a UDF over a one-row frame needs no planning process on the
        # server (a Python Data Source starts two, each importing the engine, before its task runs).
        frame = spark.range(1, numPartitions=1).mapInArrow(task, REPORT_SCHEMA, barrier=barrier)
    try:
        [row] = frame.collect()
    except Exception as exc:
        said = engine_error(exc)
        if said is None:
            raise  # not the engine's (an executor lost past Spark's retries): as Spark says it
        raise DeliveryTaskError(f"pipeline {run.pipeline!r}, run {run.run_id!r}: the Spark task delivering "
                                f"it failed on each attempt (spark.task.maxFailures), the last on "
                                f"{said}") from exc
    report = json.loads(row["report"])
    relog(report.pop("task_log", []))
    if report.get("fatal"):
        raise FatalRunError(f"pipeline {run.pipeline!r}: the delivery task stopped on a fatal error, "
                            f"not retried: {report.get('error')}")
    report["delivered_by"] = "executor"
    report["parts_gathered"] = len(gathered_parts(run.spec, run.record.segments)) if gathered else 0
    return report


# The line of a task's Python traceback that names the engine's error ("tidegate.store.tx.StoreError:
# cannot connect ..."), inside the text of the Spark error that ends the job.
_ENGINE_ERROR = re.compile(r"^tidegate\.(?:\w+\.)*(\w+): (.+)$", re.M)


def _engine_error_names() -> set[str]:
    """Names of the engine's error classes: a logger's line ("tidegate.sinks.kafka: ...") that a
    task printed before it failed has the same shape, and is not one."""
    names, todo = set(), [TidegateError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names


def engine_error(exc: BaseException) -> str | None:
    """``Class: message`` of the last engine error named in a failed Spark job's text (a task
    re-raises a retryable one so that Spark retries it; a fatal one it reports), or None. Said
    here in one line, as the run would say it in one process, instead of the Spark error's
    pages of traceback that end in ``SQLSTATE: 38000``."""
    names = _engine_error_names()
    found = [m for m in _ENGINE_ERROR.findall(str(exc)) if m[0] in names]
    return f"{found[-1][0]}: {found[-1][1].strip()}" if found else None


def _gathered_job(spark: Any, run: PlannedRun, payload: TaskPayload, barrier: bool) -> Any:
    """The two-stage job of a plan with parallel parts (gathered.py)."""
    parts = gathered_parts(run.spec, run.record.segments)
    read = part_reader(run.spec, payload.connections[run.spec.source.conn_id], payload.salt,
                       payload.store_url, parts)
    # A snapshot's chunks are read at most snapshot.parallelism at once, as the spec promises the
    # source's owners: that many tasks, each reading its share of the chunks in turn.
    tasks = run.spec.snapshot.parallelism if any(isinstance(p, Chunk) for p in parts) else len(parts)
    log.info("pipeline %s: %d part(s) read by Spark tasks side by side (%d task(s)), gathered into the "
             "delivery task", run.pipeline, len(parts), min(tasks, len(parts)))

    def task(batches: Iterator[Any]) -> Iterator[Any]:
        yield from delivery_task(payload, batches)

    return gathered_frame(spark, read, len(parts), task, REPORT_SCHEMA, tasks=tasks, barrier=barrier)


def needs_barrier(spark: Any) -> bool:
    """Whether the delivery stage must be a barrier stage so that Spark cannot speculate it.
    Spark speculates a one-task stage only when ``spark.speculation.task.duration.threshold`` is
    set (``TaskSetManager.checkSpeculatableTasks``), and never a barrier stage; but a failed
    barrier result stage is not retried (the job fails, and Airflow retries the run), and
    dynamic allocation refuses barrier stages. So: a plain stage, which Spark retries, unless
    speculation could start a copy and a barrier stage is allowed (a copy the barrier could not
    stop would be a second run of the record, fenced by the lease)."""
    def on(key: str) -> bool:
        return str(_setting(spark, key)).lower() == "true"

    could_speculate = on("spark.speculation") and _setting(
        spark, "spark.speculation.task.duration.threshold") not in (None, "")
    return could_speculate and not on("spark.dynamicAllocation.enabled")


def _setting(spark: Any, key: str) -> str | None:
    try:
        return spark.conf.get(key, None)
    except Exception:  # noqa: BLE001 - a setting the server does not show
        return None


__all__ = ["DELIVERY_CONF", "deliver_on_executor", "delivery_mode", "delivery_task", "engine_error",
           "gathers_parts", "on_executor", "relog"]
