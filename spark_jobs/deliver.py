"""spark-submit entry point: one bounded run of a tidegate pipeline, its range read by Spark.

    spark-submit spark_jobs/deliver.py --pipeline NAME --run-id ID [--report-file PATH]

Thin: parse the arguments, read the run's record from the checkpoint store
(``TIDEGATE_CHECKPOINT_STORE``; the bounds task wrote it: the spec's text, the plan, the bounds),
build the SparkSession, call ``tidegate.spark.job.deliver``, which submits the run as one job
whose task delivers (a spec with a Delta sink: the driver delivers). A driver on a cluster never reads
the Airflow worker's disk. The argv holds no secret; connections come from
``AIRFLOW_CONN_<ID>`` environment variables of the driver (see docs/operations.md, "Spark").
The run report (JSON) is written to ``--report-file`` and printed as one
``TIDEGATE_RUN_REPORT {...}`` line.

Exit codes: 0 done; 3 (``tidegate.plan.EXIT_FATAL``) an error that a retry cannot fix (fenced
producer, stale fencing epoch, halt, bad spec or connection, wrong source setting), also written
to ``--report-file`` as ``{"fatal": true, "error": ...}`` (how the deliver operator tells it
apart); anything else: retryable.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tidegate.plan import EXIT_FATAL

log = logging.getLogger("tidegate.spark_jobs.deliver")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="deliver.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--pipeline", required=True, help="pipeline name")
    p.add_argument("--run-id", required=True, help="the run id (its record, journal and fencing key)")
    p.add_argument("--report-file", default=None, help="write the run report (JSON) here")
    return p


def run(args: argparse.Namespace, spark: Any, deliver: Any = None) -> dict[str, Any]:
    """``deliver``: the engine's entry (default ``tidegate.spark.job.deliver``)."""
    from tidegate.bounds_step import from_record
    from tidegate.store import open_store

    if deliver is None:
        from tidegate.spark.job import deliver
    with open_store() as store:
        return deliver(spark, from_record(store, args.pipeline, args.run_id))


def spark_session(app_name: str) -> Any:
    from pyspark.sql import SparkSession

    return SparkSession.builder.appName(app_name).getOrCreate()


def main(argv: Sequence[str] | None = None, make_session: Any = spark_session, deliver: Any = None) -> int:
    from tidegate.errors import TidegateError

    args = parser().parse_args(argv)
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
