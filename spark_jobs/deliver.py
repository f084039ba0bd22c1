"""spark-submit entry point: one bounded run of a tidegate pipeline, its range read by Spark.

    spark-submit spark_jobs/deliver.py --pipeline NAME --run-id ID [--spec-b64 B64 | --spec FILE]
        [--mode incremental|replay|dry_run] [--upto-json JSON] [--sinks a,b] [--max-events N]
        [--replay-of RUN_ID] [--report-file PATH]

Thin: parse the arguments, build the SparkSession, call ``tidegate.spark_job.deliver``. The spec
travels with the job (``--spec-b64``: the spec file's content), so a driver or executor on a
cluster never reads it from the Airflow worker's disk. The argv holds no secret; connections
come from ``AIRFLOW_CONN_<ID>`` environment variables of the driver (see docs/operations.md,
"Spark"). The run report (JSON) is written to ``--report-file`` and printed as one
``TIDEGATE_RUN_REPORT {...}`` line.

Exit codes: 0 done; 3 (``tidegate.plan.EXIT_FATAL``) an error that a retry cannot fix (fenced
producer, stale fencing epoch, halt, bad spec or connection, wrong source setting), also written
to ``--report-file`` as ``{"fatal": true, "error": ...}`` (how the deliver operator tells it
apart); anything else: retryable.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tidegate.plan import EXIT_FATAL, MODES, RunParamsError, RunPlan

log = logging.getLogger("tidegate.spark_jobs.deliver")


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object (a source position)")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="deliver.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--pipeline", required=True, help="pipeline name")
    p.add_argument("--spec-b64", help="the spec file's content, base64")
    p.add_argument("--spec", help="a spec file (default: found by name in the pipelines folder)")
    p.add_argument("--run-id", required=True, help="the Airflow run id (journal and fencing key)")
    p.add_argument("--mode", choices=MODES, default="incremental")
    p.add_argument("--upto-json", type=_json_object, default=None, dest="upto",
                   help="the run's upper bound (position JSON from the bounds task)")
    p.add_argument("--sinks", default=None, help="comma-separated sink ids (default all)")
    p.add_argument("--max-events", default=None, help="sub-batch size override")
    p.add_argument("--replay-of", default=None, help="with --mode replay: the run whose range is replayed")
    p.add_argument("--report-file", default=None, help="write the run report (JSON) here")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    try:  # the same validation as the trigger form's
        args.plan = RunPlan.from_values({"mode": args.mode, "sinks": args.sinks,
                                         "max_events": args.max_events, "replay_of": args.replay_of})
    except RunParamsError as exc:
        p.error("; ".join(exc.problems))
    return args


def load_spec(args: argparse.Namespace) -> Any:
    from tidegate import catalog
    from tidegate.spec import load_spec_text

    if args.spec_b64:
        return load_spec_text(base64.b64decode(args.spec_b64).decode("utf-8"), origin=f"<{args.pipeline}>")
    return catalog.find(args.spec or args.pipeline)


def run(args: argparse.Namespace, spark: Any, deliver: Any = None) -> dict[str, Any]:
    """``deliver``: the engine's entry (default ``tidegate.spark_job.deliver``)."""
    from tidegate.positions import position_from_json

    if deliver is None:
        from tidegate.spark_job import deliver
    return deliver(spark, spec=load_spec(args), plan=args.plan, run_id=args.run_id,
                   upto=position_from_json(args.upto) if args.upto else None)


def spark_session(app_name: str) -> Any:
    from pyspark.sql import SparkSession

    return SparkSession.builder.appName(app_name).getOrCreate()


def main(argv: Sequence[str] | None = None, make_session: Any = spark_session, deliver: Any = None) -> int:
    from tidegate.errors import TidegateError

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spark = make_session(f"tidegate-{args.pipeline}")
    try:
        report = run(args, spark, deliver)
    except TidegateError as exc:
        if not exc.fatal:
            raise
        log.error("pipeline %s run %s: fatal, not retried: %s: %s", args.pipeline, args.run_id,
                  type(exc).__name__, exc)
        if args.report_file:  # how the operator tells a fatal end from a failure worth a retry
            ended = {"fatal": True, "error": f"{type(exc).__name__}: {exc}"}
            Path(args.report_file).write_text(json.dumps(ended), encoding="utf-8")
        return EXIT_FATAL
    finally:
        spark.stop()
    text = json.dumps(report, sort_keys=True, default=str)
    if args.report_file:
        Path(args.report_file).write_text(text, encoding="utf-8")
    print("TIDEGATE_RUN_REPORT " + text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
