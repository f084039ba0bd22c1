"""spark-submit entry point: one bounded run of a tidegate pipeline, its range read by Spark.

    spark-submit spark_jobs/deliver.py --pipeline NAME --run-id ID [--mode incremental|replay|dry_run]
        [--spec FILE] [--upto-json JSON] [--sinks a,b] [--max-events N] [--replay-of RUN_ID]
        [--report-file PATH]

Thin: parse the arguments, build the SparkSession, call ``tidegate.spark_job.deliver``. The argv
holds no secret; connections come from ``AIRFLOW_CONN_<ID>`` environment variables (the Airflow
operator sets them from Airflow's connections). The run report (JSON) is written to
``--report-file`` and printed as one ``TIDEGATE_RUN_REPORT {...}`` line.

Exit codes: 0 done; 3 a fatal error that a retry cannot fix (fenced producer, stale fencing
epoch, halt, bad spec or connection, wrong source setting); anything else (1): retryable.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXIT_FATAL = 3
MODES = ("incremental", "replay", "dry_run")
log = logging.getLogger("tidegate.spark_jobs.deliver")


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object (a source position)")
    return value


def _sink_list(text: str) -> list[str]:
    sinks = [s.strip() for s in text.split(",") if s.strip()]
    if not sinks:
        raise argparse.ArgumentTypeError("empty sink list")
    return sinks


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="deliver.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--pipeline", required=True, help="pipeline name")
    p.add_argument("--spec", help="the spec file (default: found by name in the pipelines folder)")
    p.add_argument("--run-id", required=True, help="the Airflow run id (journal and fencing key)")
    p.add_argument("--mode", choices=MODES, default="incremental")
    p.add_argument("--upto-json", type=_json_object, default=None, dest="upto",
                   help="the run's upper bound (position JSON from the bounds task)")
    p.add_argument("--sinks", type=_sink_list, default=None, help="comma-separated sink ids (default all)")
    p.add_argument("--max-events", type=_positive_int, default=None, help="sub-batch size override")
    p.add_argument("--replay-of", default=None, help="with --mode replay: the run whose range is replayed")
    p.add_argument("--report-file", default=None, help="write the run report (JSON) here")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.mode == "replay" and not args.replay_of:
        p.error("--mode replay needs --replay-of")
    if args.replay_of and args.mode != "replay":
        p.error("--replay-of needs --mode replay")
    return args


def fatal_errors() -> tuple[type[BaseException], ...]:
    """Engine errors a retry cannot fix."""
    import importlib

    found: list[type[BaseException]] = []
    for module, names in (
        ("tidegate.errors", ("FatalRunError", "StaleEpochError", "SpecError", "ConnectionConfigError",
                             "SourceSettingError", "PositionPurgedError", "SlotMissingError",
                             "SlotInvalidatedError")),
        ("tidegate.runner", ("RunError",)),
        ("tidegate.guards", ("ContinuityHalt",)),
    ):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        found += [getattr(mod, n) for n in names if isinstance(getattr(mod, n, None), type)]
    return tuple(found)


def run(args: argparse.Namespace, spark: Any) -> dict[str, Any]:
    from tidegate.spark_job import deliver

    return deliver(spark, pipeline=args.spec or args.pipeline, run_id=args.run_id, mode=args.mode,
                   upto=args.upto, sinks=args.sinks, max_events=args.max_events, replay_of=args.replay_of)


def spark_session(app_name: str) -> Any:
    from pyspark.sql import SparkSession

    return SparkSession.builder.appName(app_name).getOrCreate()


def main(argv: Sequence[str] | None = None, make_session: Any = spark_session) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spark = make_session(f"tidegate-{args.pipeline}")
    fatal = fatal_errors()
    try:
        report = run(args, spark)
    except fatal as exc:
        log.error("pipeline %s run %s: fatal, not retried: %s: %s", args.pipeline, args.run_id,
                  type(exc).__name__, exc)
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
