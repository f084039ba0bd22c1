"""How often one DAG run parses its spec and validates its params (issue 20's measure), counted
by instrumenting the interpreter (``sys.setprofile``), not by replacing any engine function.

One run: guard, bounds, deliver (the task and, in the same process here, the Spark job's entry
with the engine's deliver on a stand-in session), release, report. Each Airflow task and the
Spark driver is a process of its own in production, so the spec is parsed once in each of the
six; the params are validated where the run's plan is made (the guard, which may resolve
incidents, and the bounds task, which records the plan). The tasks after bounds read the run's
record: they still work with the spec file gone from the folder.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections import Counter
from contextlib import contextmanager

import pytest

from tests.dags.conftest import ROOT, make_context
from tests.dags.engine_fakes import MYSQL_OLD, MYSQL_UPTO, ScriptedParts, ScriptedSource, wire
from tests.dags.test_operators import connections, place  # noqa: F401 - connections: a fixture


@contextmanager
def counting(path: list[str], **functions):
    """Count calls of the given functions (by code object) while the block runs, and append the
    engine module of every call to ``path``."""
    codes = {f.__code__: name for name, f in functions.items()}
    seen: Counter[str] = Counter()

    def profile(frame, event, arg):
        if event != "call":
            return
        if frame.f_code in codes:
            seen[codes[frame.f_code]] += 1
        module = frame.f_globals.get("__name__") or ""
        if module == "tidegate" or module.startswith("tidegate."):
            path.append(module)

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(None)


class StandInSpark:
    """The session the Spark job's entry builds: the engine asks it for two settings only."""

    class sparkContext:  # noqa: N801 - SparkSession's attribute name
        defaultParallelism = 2

        @staticmethod
        def getConf():
            return {}

    def stop(self):
        pass


def load_module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.usefixtures("connections")
def test_one_run_parses_its_spec_once_per_process_and_validates_its_params_twice(spark_submit_specs, dags,
                                                                                   pipelines_dir):
    from tidegate import spec
    from tidegate.plan import RunPlan
    from tidegate.spark import job as spark_job

    place("shop_mysql", {"events": MYSQL_OLD, "bus": MYSQL_OLD, "cache": MYSQL_OLD})
    dag, source = dags["cdc_shop_mysql"], ScriptedSource()
    job = load_module("tidegate_deliver_job_counts", ROOT / "spark_jobs" / "deliver.py")
    guard, bounds, deliver, release, report = (dag.get_task(t) for t in
                                               ("guard", "bounds", "deliver", "release", "report"))
    wire(source, guard, bounds, deliver, release, report)

    def driver(spark, run):  # the engine's deliver, on the scripted source
        return spark_job.deliver_here(spark, dataclasses.replace(run, parts=ScriptedParts(source)))

    steps, paths = {}, {}
    path: list[str] = []
    with counting(path, yaml=spec._read_yaml, plan=RunPlan.from_values.__func__) as seen:
        for name, step in (
            ("guard", lambda: guard.execute(make_context(dag, guard))),
            ("bounds", lambda: bounds.execute(make_context(dag, bounds))),
            ("remove the spec file", lambda: (pipelines_dir / "shop_mysql.yaml").unlink()),
            ("deliver task", lambda: deliver.prepare(make_context(dag, deliver), None)),
            ("spark driver", lambda: job.main(deliver.application_args, make_session=lambda n: StandInSpark(),
                                              deliver=driver)),
            ("release", lambda: release.execute(make_context(dag, release))),
            ("report", lambda: report.execute(make_context(dag, report))),
        ):
            before, path[:] = Counter(seen), []
            out = step()
            steps[name] = (seen["yaml"] - before["yaml"], seen["plan"] - before["plan"], out)
            paths[name] = list(path)
    counts = {name: (y, p) for name, (y, p, _) in steps.items()}
    assert counts == {"guard": (1, 1), "bounds": (1, 1), "remove the spec file": (0, 0),
                      "deliver task": (1, 0), "spark driver": (1, 0), "release": (1, 0), "report": (1, 0)}
    assert dict(seen) == {"yaml": 6, "plan": 2}
    assert steps["spark driver"][2] == 0  # the job ended well
    assert steps["bounds"][2]["upto"] == MYSQL_UPTO
    assert steps["report"][2]["upto"] == MYSQL_UPTO  # from the record: the report read no folder
    assert source.calls == ["identity", "retention", "preflight", "release"]  # the report read no head
    # The deliver path through the engine's modules, for the record (benchmarks/structure.py).
    structure = load_module("tidegate_structure_counts", ROOT / "benchmarks" / "structure.py")
    moves = structure.path_moves(paths["spark driver"], structure.engine_graph())
    print(f"\ndeliver path: {moves['moves']} moves between modules, {moves['up']} back up the import "
          f"order; most entered: {list(moves['visits'].items())[:6]}")
