"""spark_jobs/deliver.py: argument parsing and the hand-off to tidegate.spark_job (no Spark)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.dags.conftest import ROOT


@pytest.fixture(scope="module")
def job():
    spec = importlib.util.spec_from_file_location("tidegate_deliver_job", ROOT / "spark_jobs" / "deliver.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_parses_what_the_operator_passes(job):
    from tidegate_airflow.operators.deliver import build_args

    argv = build_args(pipeline="shop_mysql", run_id="scheduled__2026", report_file="/tmp/r.json")
    a = job.parser().parse_args(argv)
    assert (a.pipeline, a.run_id, a.report_file) == ("shop_mysql", "scheduled__2026", "/tmp/r.json")


@pytest.mark.parametrize("argv", [
    ["--run-id", "r"],                                           # no pipeline
    ["--pipeline", "p"],                                         # no run id
    ["--pipeline", "p", "--run-id", "r", "--mode", "replay"],    # the plan is the record's
])
def test_rejects_bad_arguments(job, argv, capsys):
    with pytest.raises(SystemExit) as e:
        job.parser().parse_args(argv)
    assert e.value.code == 2


def _bounds():
    from tidegate.bounds_step import Bounds
    from tidegate.sources.mysql.position import BinlogPosition

    return Bounds("shop_mysql", BinlogPosition("mysql-bin.000002", 400), {"events": None, "cache": None})


def record_run(run_id: str, plan=None) -> None:
    """What the bounds task leaves for the driver: the run's record (spec text, plan, bounds)."""
    from tidegate.bounds_step import recorded
    from tidegate.plan import RunPlan
    from tidegate.run import RunContext
    from tidegate.spec import load_spec
    from tidegate.store import open_store

    spec = load_spec(ROOT / "include" / "pipelines" / "shop_mysql.yaml")
    with open_store() as store:
        recorded(RunContext(spec, plan or RunPlan(), run_id), _bounds(), store)


class FakeSpark:
    stopped = False

    def stop(self):
        self.stopped = True


def test_main_reads_the_run_record_calls_the_engine_and_writes_the_report(job, pipelines_dir, tmp_path,
                                                                          capsys):
    from tidegate.plan import RunPlan

    record_run("r1", RunPlan(sinks=["events", "cache"], max_events=10))
    seen = {}
    report = {"pipeline": "shop_mysql", "events": 5, "sinks": []}

    def deliver(spark, run):
        seen.update(spark=spark, run=run)
        return report

    spark, names = FakeSpark(), []
    out = tmp_path / "report.json"
    code = job.main(["--pipeline", "shop_mysql", "--run-id", "r1", "--report-file", str(out)],
                    make_session=lambda name: names.append(name) or spark, deliver=deliver)
    assert code == 0 and names == ["tidegate-shop_mysql"] and spark.stopped
    run = seen["run"]
    assert seen["spark"] is spark and run.run_id == "r1" and run.spec.pipeline == "shop_mysql"
    assert run.plan == RunPlan(sinks=["events", "cache"], max_events=10) and run.bounds == _bounds()
    assert run.spec.path.endswith("shop_mysql.yaml")  # named as the file it came from
    assert json.loads(out.read_text()) == report
    assert "TIDEGATE_RUN_REPORT " in capsys.readouterr().out


def test_fatal_engine_errors_exit_3_others_raise(job, pipelines_dir, tmp_path):
    from tidegate.errors import CommitPolicyError, FatalRunError

    record_run("r")

    def fatal(spark, run):
        raise FatalRunError("producer fenced")

    spark, out = FakeSpark(), tmp_path / "report.json"
    assert job.main(["--pipeline", "shop_mysql", "--run-id", "r", "--report-file", str(out)],
                    make_session=lambda n: spark, deliver=fatal) == job.EXIT_FATAL
    assert spark.stopped
    assert json.loads(out.read_text()) == {"fatal": True, "error": "FatalRunError: producer fenced"}

    def retryable(spark, run):
        raise CommitPolicyError("required sink events failed")

    with pytest.raises(CommitPolicyError):
        job.main(["--pipeline", "shop_mysql", "--run-id", "r"], make_session=lambda n: FakeSpark(),
                 deliver=retryable)


def test_a_run_without_a_record_is_fatal_and_says_why(job, pipelines_dir, tmp_path):
    out = tmp_path / "report.json"
    assert job.main(["--pipeline", "shop_mysql", "--run-id", "nobody_wrote_it", "--report-file", str(out)],
                    make_session=lambda n: FakeSpark(), deliver=lambda spark, run: {}) == job.EXIT_FATAL
    error = json.loads(out.read_text())["error"]
    assert "no run record for run 'nobody_wrote_it'" in error and "bounds step" in error


def test_exit_code_is_the_engines(job):
    from tidegate.plan import EXIT_FATAL

    assert job.EXIT_FATAL == EXIT_FATAL == 3
