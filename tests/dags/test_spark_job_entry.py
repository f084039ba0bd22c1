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
    import base64

    from tidegate.plan import RunPlan
    from tidegate.spec import load_spec
    from tidegate_airflow.operators.deliver import build_args

    spec = load_spec(ROOT / "include" / "pipelines" / "shop_mysql.yaml")
    upto = {"file": "mysql-bin.000002", "pos": 154, "gtid_set": "0-1-42"}
    plan = RunPlan(sinks=["events", "cache"], max_events=1000)
    argv = build_args(spec=spec, run_id="scheduled__2026", plan=plan, upto=upto, report_file="/tmp/r.json")
    a = job.parse_args(argv)
    assert (a.pipeline, a.run_id, a.upto, a.plan, a.report_file) == (
        "shop_mysql", "scheduled__2026", upto, RunPlan(mode="incremental", sinks=["events", "cache"],
                                                        max_events=1000), "/tmp/r.json")
    assert base64.b64decode(a.spec_b64).decode() == spec.text
    import dataclasses

    rebuilt = job.load_spec(a)  # the spec the driver rebuilds from the argv is the file's
    assert dataclasses.replace(rebuilt, path=spec.path) == spec and rebuilt.path is None
    replay = RunPlan(mode="replay", replay_of="scheduled__1")
    a = job.parse_args(build_args(spec=spec, run_id="r", plan=replay))
    assert (a.plan.mode, a.plan.replay_of, a.upto, a.plan.sinks, a.plan.max_events) == (
        "replay", "scheduled__1", None, None, None)


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

    seen = {}
    report = {"pipeline": "p", "events": 5, "sinks": []}

    def deliver(spark, **kw):
        seen.update(kw, spark=spark)
        return report

    spark, names = FakeSpark(), []
    out = tmp_path / "report.json"
    monkeypatch.setattr(job, "load_spec", lambda args: f"spec of {args.spec}")
    code = job.main(["--pipeline", "p", "--spec", "/x/p.yaml", "--run-id", "r1", "--sinks", "a,b",
                     "--report-file", str(out)], make_session=lambda name: names.append(name) or spark,
                    deliver=deliver)
    assert code == 0 and names == ["tidegate-p"] and spark.stopped
    from tidegate.plan import RunPlan

    assert seen == {"spark": spark, "spec": "spec of /x/p.yaml", "run_id": "r1", "upto": None,
                    "plan": RunPlan(sinks=["a", "b"])}
    assert json.loads(out.read_text()) == report
    assert "TIDEGATE_RUN_REPORT " in capsys.readouterr().out


def test_fatal_engine_errors_exit_3_others_raise(job, monkeypatch, tmp_path):
    from tidegate.errors import CommitPolicyError, FatalRunError

    def fatal(spark, **kw):
        raise FatalRunError("producer fenced")

    monkeypatch.setattr(job, "load_spec", lambda args: None)
    spark, out = FakeSpark(), tmp_path / "report.json"
    assert job.main(["--pipeline", "p", "--run-id", "r", "--report-file", str(out)],
                    make_session=lambda n: spark, deliver=fatal) == job.EXIT_FATAL
    assert spark.stopped
    assert json.loads(out.read_text()) == {"fatal": True, "error": "FatalRunError: producer fenced"}

    def retryable(spark, **kw):
        raise CommitPolicyError("required sink events failed")

    with pytest.raises(CommitPolicyError):
        job.main(["--pipeline", "p", "--run-id", "r"], make_session=lambda n: FakeSpark(), deliver=retryable)


def test_exit_code_is_the_engines(job):
    from tidegate.plan import EXIT_FATAL

    assert job.EXIT_FATAL == EXIT_FATAL == 3
