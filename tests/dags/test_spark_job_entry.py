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

    upto = {"file": "mysql-bin.000002", "pos": 154, "gtid_set": "0-1-42"}
    argv = build_args(pipeline="shop_mysql", run_id="scheduled__2026", mode="incremental",
                      spec_path="/p/s.yaml", upto=upto, sinks=["events", "cache"], max_events=1000,
                      report_file="/tmp/r.json")
    a = job.parse_args(argv)
    got = (a.pipeline, a.spec, a.run_id, a.mode, a.upto, a.sinks, a.max_events, a.replay_of, a.report_file)
    assert got == (
        "shop_mysql", "/p/s.yaml", "scheduled__2026", "incremental", upto, ["events", "cache"], 1000, None,
        "/tmp/r.json")
    a = job.parse_args(build_args(pipeline="p", run_id="r", mode="replay", replay_of="scheduled__1"))
    assert (a.mode, a.replay_of, a.upto, a.sinks) == ("replay", "scheduled__1", None, None)
    assert a.max_events is None


@pytest.mark.parametrize("argv", [
    ["--run-id", "r"],                                           # no pipeline
    ["--pipeline", "p", "--run-id", "r", "--mode", "snapshot"],  # unknown mode
    ["--pipeline", "p", "--run-id", "r", "--upto-json", "{not json"],
    ["--pipeline", "p", "--run-id", "r", "--upto-json", "[1, 2]"],
    ["--pipeline", "p", "--run-id", "r", "--max-events", "0"],
    ["--pipeline", "p", "--run-id", "r", "--mode", "replay"],    # replay without --replay-of
    ["--pipeline", "p", "--run-id", "r", "--replay-of", "x"],    # --replay-of without replay
])
def test_rejects_bad_arguments(job, argv, capsys):
    with pytest.raises(SystemExit) as e:
        job.parse_args(argv)
    assert e.value.code == 2


class FakeSpark:
    stopped = False

    def stop(self):
        self.stopped = True


def test_main_calls_the_engine_and_writes_the_report(job, monkeypatch, tmp_path, capsys):
    import tidegate.spark_job as spark_job

    seen = {}
    report = {"pipeline": "p", "events": 5, "sinks": []}

    def deliver(spark, **kw):
        seen.update(kw, spark=spark)
        return report

    monkeypatch.setattr(spark_job, "deliver", deliver)
    spark, names = FakeSpark(), []
    out = tmp_path / "report.json"
    code = job.main(["--pipeline", "p", "--spec", "/x/p.yaml", "--run-id", "r1", "--sinks", "a,b",
                     "--report-file", str(out)], make_session=lambda name: names.append(name) or spark)
    assert code == 0 and names == ["tidegate-p"] and spark.stopped
    assert seen == {"spark": spark, "pipeline": "/x/p.yaml", "run_id": "r1", "mode": "incremental",
                    "upto": None, "sinks": ["a", "b"], "max_events": None, "replay_of": None}
    assert json.loads(out.read_text()) == report
    assert "TIDEGATE_RUN_REPORT " in capsys.readouterr().out


def test_fatal_engine_errors_exit_3_others_raise(job, monkeypatch):
    import tidegate.spark_job as spark_job
    from tidegate.errors import CommitPolicyError, FatalRunError

    def fatal(spark, **kw):
        raise FatalRunError("producer fenced")

    monkeypatch.setattr(spark_job, "deliver", fatal)
    spark = FakeSpark()
    assert job.main(["--pipeline", "p", "--run-id", "r"], make_session=lambda n: spark) == job.EXIT_FATAL
    assert spark.stopped

    def retryable(spark, **kw):
        raise CommitPolicyError("required sink events failed")

    monkeypatch.setattr(spark_job, "deliver", retryable)
    with pytest.raises(CommitPolicyError):
        job.main(["--pipeline", "p", "--run-id", "r"], make_session=lambda n: FakeSpark())


def test_exit_code_matches_the_operator(job):
    from tidegate_airflow.operators.deliver import EXIT_FATAL

    assert job.EXIT_FATAL == EXIT_FATAL
