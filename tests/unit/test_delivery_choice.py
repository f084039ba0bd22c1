"""Where a Spark Connect run delivers (tidegate/spark/delivery.py), without Spark: the setting's
check, the choice per read plan, the kept session's id and the parts a delivery task resolves
nothing with."""

from __future__ import annotations

import logging
import pickle
import uuid

import pytest
from tidegate.bounds_step import Bounds, RunRecord
from tidegate.connections import Connection
from tidegate.errors import ConnectionConfigError, SpecError
from tidegate.parts import resolved_parts
from tidegate.plan import RunPlan
from tidegate.positions import SnapshotPosition
from tidegate.run import PlannedRun
from tidegate.segments import Chunk, Slice, SnapshotEnd
from tidegate.sources.mysql.position import BinlogPosition
from tidegate.spark.delivery import delivery_mode, engine_error, gathers_parts, needs_barrier, on_executor
from tidegate.spark.session import kept_session_id
from tidegate.spec import load_spec_text


def spec_text(conf: str = "", sinks: str = "- {id: k, kind: kafka, conn_id: kafka, topic: t}") -> str:
    return (f"pipeline: p\nsource: {{kind: mysql, conn_id: src, tables: [db.t], server_id: 5}}\n"
            f"spark: {{conn_id: spark_connect{conf}}}\nsinks:\n  {sinks}\n")


def run_with(segments, text: str | None = None) -> PlannedRun:
    text = text or spec_text()
    spec = load_spec_text(text)
    bounds = Bounds("p", BinlogPosition("bin.000001", 4), {"k": None})
    record = RunRecord("p", "r1", text, None, RunPlan(), bounds, segments)
    return PlannedRun(spec, RunPlan(), "r1", record=record)


def pos(n: int) -> BinlogPosition:
    return BinlogPosition("bin.000001", n)


def test_an_unknown_delivery_mode_fails_the_spec_naming_the_setting_and_the_choices():
    with pytest.raises(SpecError) as e:
        load_spec_text(spec_text(", conf: {spark.tidegate.delivery: cluster}"))
    assert "spark.conf.spark.tidegate.delivery: 'cluster' is not a delivery mode" in str(e.value)
    assert "auto, gathered, executor, client" in str(e.value)
    with pytest.raises(SpecError, match="'driver' is not one of auto, gathered, executor, client"):
        delivery_mode({"spark.tidegate.delivery": "driver"})  # an operator's own conf


def test_auto_delivers_in_a_spark_task_and_gathers_a_snapshots_chunks():
    one = (Slice(pos(4), pos(900)),)
    two = (Slice(pos(4), pos(500)), Slice(pos(500), pos(900)))
    chunk = Chunk(SnapshotPosition("s1", 1, pos(4)))
    plans = (one, (*one, SnapshotEnd("s1")), two, (chunk, *one), None)
    assert [on_executor(run_with(p), {}) for p in plans] == [True] * 5
    assert on_executor(run_with(one), {"spark.tidegate.delivery": "client"}) is False
    for mode in ("gathered", "executor"):
        assert all(on_executor(run_with(p), {"spark.tidegate.delivery": mode}) for p in plans)
    # parts read by tasks of their own and gathered: a snapshot's chunks under auto, every
    # parallel part under gathered; no plan made: the delivery task makes and reads it
    assert [gathers_parts(run_with(p), {}) for p in plans] == [False, False, False, True, False]
    gathered = {"spark.tidegate.delivery": "gathered"}
    assert [gathers_parts(run_with(p), gathered) for p in plans] == [False, False, True, True, False]
    executor = {"spark.tidegate.delivery": "executor"}
    assert [gathers_parts(run_with(p), executor) for p in plans] == [False] * 5


def test_a_sink_that_writes_through_spark_keeps_the_run_in_the_client():
    delta = spec_text(sinks="- {id: d, kind: delta, path: '/tmp/x/{table}'}")
    asked = {"spark.tidegate.delivery": "executor"}
    assert on_executor(run_with((Slice(pos(4), pos(9)),), delta), asked) is False
    assert on_executor(run_with((Slice(pos(4), pos(9)), Slice(pos(9), pos(20))), delta), {}) is False


def test_a_pipeline_keeps_one_session_per_build_of_the_package():
    a = kept_session_id("orders", ["/tmp/tidegate-aaaa.zip"])
    assert a == kept_session_id("orders", ["/elsewhere/tidegate-aaaa.zip"])
    assert uuid.UUID(a).version == 4  # the server accepts only version-4 ids
    assert a != kept_session_id("orders", ["/tmp/tidegate-bbbb.zip"])  # new code: a new session
    assert a != kept_session_id("payments", ["/tmp/tidegate-aaaa.zip"])


def test_resolved_parts_hand_out_what_was_resolved_and_name_what_was_not():
    src = Connection(conn_id="src", conn_type="mysql", host="127.0.0.1", port=3306, login="u", password="pw")
    parts = pickle.loads(pickle.dumps(resolved_parts({"src": src}, b"salt")))  # as a task gets them
    assert parts.connection("src") == src
    assert parts.hash_salt(load_spec_text(spec_text())) == b"salt"
    with pytest.raises(ConnectionConfigError, match="'kafka' was not resolved for this Spark task"):
        parts.connection("kafka")


class ServerConf:
    """What a Connect session's ``spark.conf.get`` answers (the server's settings)."""

    def __init__(self, **settings: str):
        self.settings = {k.replace("_", "."): v for k, v in settings.items()}
        self.conf = self

    def get(self, key: str, default=None):
        return self.settings.get(key, default)


def test_the_delivery_stage_is_a_barrier_stage_only_where_speculation_could_copy_it():
    # no speculation, or speculation without a duration threshold: a one-task stage is never
    # speculated, and a plain stage keeps Spark's task retries
    assert needs_barrier(ServerConf()) is False
    assert needs_barrier(ServerConf(spark_speculation="true")) is False
    threshold = {"spark_speculation": "true", "spark_speculation_task_duration_threshold": "30s"}
    assert needs_barrier(ServerConf(**threshold)) is True
    # dynamic allocation refuses barrier stages: a plain stage (a copy is fenced by the lease)
    assert needs_barrier(ServerConf(**threshold, spark_dynamicAllocation_enabled="true")) is False


def test_the_delivery_tasks_log_comes_back_and_is_logged_again_under_its_loggers(caplog):
    from tidegate.spark.delivery import TASK_LOG_LINES, _task_log, relog

    engine = logging.getLogger("tidegate")
    level = engine.level
    engine.setLevel(logging.WARNING)  # as in a Spark worker: nothing configured
    with _task_log() as lines:
        logging.getLogger("tidegate.runner").info("run %s: reading (%s, %s]", "r1", 4, 900)
        logging.getLogger("tidegate.reading").debug("not kept")
        logging.getLogger("elsewhere").info("not the engine's")
        for i in range(TASK_LOG_LINES + 5):
            logging.getLogger("tidegate.coordinator").info("sub-batch %d", i)
    assert engine.level == logging.WARNING  # put back: the worker runs the next session's tasks
    assert len(lines) == TASK_LOG_LINES and lines[-1][3] == f"sub-batch {TASK_LOG_LINES + 4}"
    kept = [(20, "tidegate.runner", "1.250", "run r1: reading (4, 900]"), *list(lines)[-2:]]
    engine.setLevel(level)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        relog(kept)
    got = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert got[0] == ("tidegate.runner", logging.INFO,
                      "[Spark task 00:00:01.250 UTC] run r1: reading (4, 900]")
    assert [(name, text.split(" UTC] ", 1)[1]) for name, _, text in got[1:]] == [
        ("tidegate.coordinator", f"sub-batch {TASK_LOG_LINES + 3}"),
        ("tidegate.coordinator", f"sub-batch {TASK_LOG_LINES + 4}")]


# The end of the text of the Spark Connect error a campaign run (seed 5505, delivered by a Spark
# task) ended with when PostgreSQL, its source and its store, was SIGKILLed: Spark retried the
# task, each attempt failed to open the store, and the run printed this traceback's last line,
# " SQLSTATE: 38000", as its error.
STORE_REFUSED = ("cannot connect to the Postgres checkpoint store postgresql://u@127.0.0.1:5/s "
                 "(TIDEGATE_STORE_TIMEOUT_S=30s): connection to server at \"127.0.0.1\", port 5 failed: "
                 "Connection refused")
SPARK_TASK_FAILED = f"""
  An exception was thrown from the Python worker. Please see the stack trace below.
[PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback (most recent call last):
  File "/work/main/include/tidegate/spark/delivery.py", line 226, in task
    yield from delivery_task(payload)
  File "/w/app-1/0/./tidegate-4dc424d536f0.zip/tidegate/store/postgres.py", line 65, in _connect
    raise StoreError(f"cannot connect to the Postgres checkpoint store {{self.url}} "
tidegate.store.tx.StoreError: {STORE_REFUSED}
 SQLSTATE: 38000"""


def test_a_failed_delivery_task_is_said_by_the_engine_error_its_traceback_names():
    assert engine_error(RuntimeError(SPARK_TASK_FAILED)) == "StoreError: " + STORE_REFUSED
    # the last one, when an attempt's error names another as its cause
    chained = "tidegate.errors.SourceError: the source went away\n" + SPARK_TASK_FAILED
    assert engine_error(RuntimeError(chained)) == "StoreError: " + STORE_REFUSED
    # a Spark failure of its own (an executor lost past the retries) is not the engine's
    assert engine_error(RuntimeError("Job aborted due to stage failure: ExecutorLostFailure "
                                     "(executor 0 exited caused by one of the running tasks)")) is None
    # nor is a logger's line that a task printed before it failed
    assert engine_error(RuntimeError("tidegate.sinks.kafka: producer closed\n" + "Job aborted")) is None
    # an engine error whose name does not end in "Error" is one all the same
    halt = "tidegate.errors.ContinuityHalt: the slot was invalidated\nJob aborted"
    assert engine_error(RuntimeError(halt)) == "ContinuityHalt: the slot was invalidated"


def test_the_delivery_task_gets_the_record_the_deliver_task_read_and_plans_from_it_alone():
    from tidegate.bounds_step import planned_from
    from tidegate.spark.delivery import task_payload

    src = Connection(conn_id="src", conn_type="mysql", host="127.0.0.1", port=3306, login="u", password="pw")
    kafka = Connection(conn_id="kafka", conn_type="kafka", extra={"bootstrap.servers": "127.0.0.1:9"})
    run = run_with((Slice(pos(4), pos(900)),))
    run = PlannedRun(run.spec, run.plan, run.run_id, resolved_parts({"src": src, "kafka": kafka}, b"s"),
                     record=run.record)
    record, connections, salt, store_url, _ = pickle.loads(pickle.dumps(task_payload(run, "sqlite:///x")))
    assert set(connections) == {"src", "kafka"} and salt == b"s" and store_url == "sqlite:///x"
    # the task's run is the record's, with no read of the store (which holds no record here)
    got = planned_from(RunRecord.from_json(record), None, resolved_parts(connections, salt))
    assert (got.run_id, got.spec, got.plan, got.record) == (run.run_id, run.spec, run.plan, run.record)
