"""The ``tidegate`` command line: validate specs, inspect and rewind checkpoints, status.

Exit codes: 0 ok, 1 a problem was found (invalid spec, store refused), 2 usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import getpass
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from . import bounds_step, catalog, guards, runner
from . import spec as specmod
from .errors import TidegateError
from .kinds import source_kind
from .plan import EXIT_FATAL, MODES, RESOLUTIONS, RunParamsError, RunPlan
from .positions import SnapshotPosition, position_to_json
from .reader_process import ReaderProcess
from .run import RunContext
from .sink_checkpoints import rewind
from .sources.preflight import human_bytes, human_seconds
from .spark.connect import deliver_remote, spec_connect_url
from .spark.package import package_zip
from .status import pipelines_status
from .store import CheckpointStore, default_url, open_store

# A command that failed on an engine error exits EXIT_FAILED, or plan.EXIT_FATAL (as the Spark
# job does) when the error is fatal (a bad spec or connection, a halt, a fenced writer:
# ``TidegateError.fatal``): it fails the same way on every retry, as the Airflow task that fails
# without retrying. A script or scheduler running the CLI tells the two apart by the status.
# 2 is argparse's (a usage error).
EXIT_FAILED = 1


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except TidegateError as exc:  # expected failures: one clear line, no traceback
        print(f"tidegate: {exc}", file=sys.stderr)
        return EXIT_FATAL if exc.fatal else EXIT_FAILED


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tidegate", description="Change data capture as Airflow DAGs.")
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser("validate", help="validate pipeline specs (default: every spec in the folder)")
    v.add_argument("files", nargs="*",
                   help="spec files (default: $TIDEGATE_PIPELINES_DIR or include/pipelines)")
    v.set_defaults(func=cmd_validate)

    r = sub.add_parser("run", help="one bounded run without Airflow")
    r.add_argument("pipeline")
    r.add_argument("--sinks", help="comma-separated sink ids (default: all)")
    r.add_argument("--max-events", type=int, help="sub-batch size for this run")
    r.add_argument("--mode", choices=MODES, default="incremental")
    r.add_argument("--replay-of", help="mode replay: the run id whose range to deliver again")
    r.add_argument("--run-id", help="default: manual__<UTC time>")
    r.add_argument("--resolve", choices=RESOLUTIONS,
                   help="resolve the pipeline's open incidents first (needs --reason): accept_gap (lost "
                        "changes), resnapshot (re-load the tables; also on a healthy pipeline) or "
                        "continue (past a schema change that halted it)")
    r.add_argument("--reason", help="why the incidents are resolved this way (kept with them)")
    r.add_argument("--no-guards", action="store_true", help="skip the continuity guards (debugging)")
    r.add_argument("--tables", help="with --resolve resnapshot: comma-separated tables to re-load")
    r.add_argument("--retry", action="store_true",
                   help="deliver run --run-id again from its record, as an Airflow retry of its deliver "
                        "task does: no guards, no new bounds (the record holds the plan)")
    r.set_defaults(func=cmd_run)

    s = sub.add_parser("status", help="checkpoints, lag, the log held and incidents per pipeline")
    s.add_argument("pipeline", nargs="?")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_status)

    c = sub.add_parser("checkpoints", help="inspect or rewind a sink's checkpoint")
    csub = c.add_subparsers(dest="action", required=True)
    h = csub.add_parser("history", help="every version of a sink's checkpoint")
    h.add_argument("pipeline")
    h.add_argument("sink")
    h.add_argument("--json", action="store_true")
    h.set_defaults(func=cmd_history)
    w = csub.add_parser("rewind", help="restore an earlier version (recorded as a new version)")
    w.add_argument("pipeline")
    w.add_argument("sink")
    w.add_argument("--to-version", type=int, required=True)
    w.add_argument("--reason", required=True)
    w.add_argument("--who", default=None, help="who rewinds (default: the OS user)")
    w.add_argument("--no-source-check", action="store_true",
                   help="rewind without asking the source whether it still holds the log after the "
                        "version (when the source cannot be reached; a run fails if it does not)")
    w.set_defaults(func=cmd_rewind)
    return p


# --------------------------------------------------------------------------- validate


def cmd_validate(args: argparse.Namespace) -> int:
    files = args.files or [str(p) for p in specmod.spec_files()]
    if not files:
        print(f"no pipeline specs in {specmod.pipelines_dir()}", file=sys.stderr)
        return 0
    if args.files:
        problems = [line for f in files for line in specmod.validate_file(f)]
    else:  # the whole folder, as the DAG factory sees it (one pipeline name per file)
        problems = catalog.scan().problems
    for line in problems:
        print(line)
    if not problems:
        print(f"{len(files)} spec(s) valid", file=sys.stderr)
    return 1 if problems else 0


def cmd_run(args: argparse.Namespace) -> int:
    """One bounded run without Airflow, the tasks of the DAG in order: the guards (which first
    resolve the open incidents with ``--resolve`` and ``--reason``, validated as the trigger
    form's params are), the bounds (nothing to do: stop), the same run the Spark job does (read
    in-process instead of in Spark tasks), the release."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.retry:
        _check_retry(args)
    run_id = args.run_id or "manual__" + dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%f")
    spec = catalog.find(args.pipeline)
    plan = RunPlan.from_values({"mode": args.mode, "sinks": args.sinks, "max_events": args.max_events,
                                "replay_of": args.replay_of, "resolve": args.resolve, "reason": args.reason,
                                "tables": args.tables}, sink_ids=[s.id for s in spec.sinks],
                               who=_os_user())
    if args.no_guards and plan.resolve:
        raise RunParamsError(["--resolve resolves incidents in the guards step: drop --no-guards"])
    with open_store() as store:
        run = RunContext(spec, plan, run_id, store=store)
        # As the deliver task decides: a spec whose spark.conn_id is a Spark Connect connection
        # is delivered as a client of that server (a Delta sink writes there; no local Spark).
        remote = None if plan.mode == "dry_run" else spec_connect_url(spec, run.parts.connection)
        # Else the range is decoded in a reader process while this one delivers
        # (reader_process.py). It starts now, its start-up overlapping the guards and the bounds;
        # the run hands it the planned range before it opens the sinks.
        with contextlib.nullcontext() if remote else ReaderProcess(default_url()) as reader:
            if reader is not None and source_kind(spec.source.kind).may_read_in_child(spec.source):
                reader.warm_up(spec.source.kind)
            report = _run_steps(run, args, reader, remote)
    print(json.dumps(report, indent=2, default=str))
    return 0


def _check_retry(args: argparse.Namespace) -> None:
    """A retry delivers what its run's record says: it names the run and nothing of the plan."""
    problems = [] if args.run_id else ["--retry delivers a run again: name it with --run-id"]
    problems += [f"--retry takes the plan from the run's record: drop {flag}" for flag, given in (
        ("--sinks", args.sinks), ("--max-events", args.max_events), ("--mode", args.mode != "incremental"),
        ("--replay-of", args.replay_of), ("--resolve", args.resolve), ("--tables", args.tables)) if given]
    if problems:
        raise RunParamsError(problems)


def _run_steps(run: Any, args: argparse.Namespace, reader: Any, remote: str | None) -> dict[str, Any]:
    """The guards, the bounds (nothing to do: the report says so), the delivery (in this
    process, or as a client of the Spark Connect server at ``remote``), the release. A retry
    (``--retry``) is the delivery and the release of the run's record, as the DAG's retried
    deliver task and its release task."""
    report: dict[str, Any] = {}
    if args.retry:
        run = bounds_step.from_record(run.store, run.pipeline, run.run_id, run.parts)
        report["bounds"] = run.bounds.to_json()
    else:
        if not args.no_guards:
            guards.run_guards(run)
        if run.plan.mode != "dry_run":
            run = bounds_step.prepare_bounds(run)  # writes the run's record, which the delivery reads
            report["bounds"] = run.bounds.to_json()
            if run.bounds.nothing_to_do(run.plan.sinks):
                return {**report, "nothing_to_do": True}
    if remote:
        report.update(deliver_remote(remote, run.with_store(None), py_files=[str(package_zip())]))
    else:
        report.update(runner.run_pipeline(run, reader=reader))
    if run.plan.mode == "incremental":
        report["released_to"] = position_to_json(runner.release(run))
    return report


# --------------------------------------------------------------------------- status


def status_json(store: CheckpointStore, pipeline: str | None = None) -> dict[str, Any]:
    """The ``status --json`` document (docs/operations.md). Each source is asked for its head
    and the log it holds for the pipeline (a few seconds at most; one that does not answer is
    named in ``head_error``)."""
    doc = pipelines_status(store=store, pipelines=[pipeline] if pipeline else None)
    return {"pipelines": doc["pipelines"]}


def cmd_status(args: argparse.Namespace) -> int:
    with open_store() as store:
        doc = status_json(store, args.pipeline)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=False))
        return 0
    if not doc["pipelines"]:
        print("no pipelines")
    for p in doc["pipelines"]:
        _print_pipeline(p)
    return 0


def _print_pipeline(p: dict) -> None:
    open_incidents = [i for i in p["incidents"] if not i["resolved"]]
    print(f"{p['pipeline']}: {'HALTED' if p['halted'] else 'ok'}")
    for s in p["sinks"]:
        where = json.dumps(s["position"], sort_keys=True) if s["position"] else "(no checkpoint)"
        ver = f"v{s['version']} at {s['updated_at']}" if s["version"] else ""
        dlq = f" ({s['dlq']} dead-lettered)" if s.get("dlq") else ""
        print(f"  sink {s['id']}: {where} {ver}{dlq}".rstrip())
    held = p.get("log_held")
    if held and held.get("bytes") is not None:
        window = held.get("replay_retention_s") or 0
        print(f"  slot {held['slot']}: holds {human_bytes(held['bytes'])} of WAL (restart_lsn "
              f"{held['restart_lsn']}; replay_retention {human_seconds(window) if window else '0'})")
    for i in open_incidents:
        frm, to = json.dumps(i["from"], sort_keys=True), json.dumps(i["to"], sort_keys=True)
        what = (f"stopped before it at {frm}: {i.get('detail')}" if i["kind"] == "schema_change"
                else f"missing {frm} .. {to}")
        fix = " ".join(f"{r['resolve']}" for r in i.get("resolve_with") or [])
        print(f"  incident #{i.get('id')} {i['kind']} detected {i['detected_at']}: {what}"
              + (f" (resolve with: {fix} and a reason)" if fix else ""))
    # The last resolutions: who decided what, when and why (the audit trail of a halt).
    for i in [i for i in p["incidents"] if i["resolved"]][-3:]:
        print(f"  resolved #{i.get('id')} {i['kind']}: {i['resolution']} by {i.get('resolved_by') or '?'}"
              f" at {i.get('resolved_at') or '?'}: {i.get('reason') or ''}".rstrip(": "))


# --------------------------------------------------------------------------- checkpoints


def cmd_history(args: argparse.Namespace) -> int:
    with open_store() as store:
        history = store.checkpoints.history(args.pipeline, args.sink)
    if args.json:
        print(json.dumps([h.to_json() for h in history], indent=2))
        return 0
    if not history:
        print(f"{args.pipeline}::sink::{args.sink}: no checkpoint", file=sys.stderr)
        return 1
    for h in history:
        extra = f" (rewind to v{h.source_version} by {h.who}: {h.reason})" if h.kind == "rewind" else ""
        print(f"v{h.version}  {h.written_at}  {json.dumps(position_to_json(h.position), sort_keys=True)}"
              f"  run={h.run_id} epoch={h.epoch}{extra}")
    return 0


def cmd_rewind(args: argparse.Namespace) -> int:
    who = args.who or _os_user()
    check = None if args.no_source_check else (lambda position: _check_log_held_for_rewind(args, position))
    with open_store() as store:
        was, rec = rewind(store, args.pipeline, args.sink, args.to_version, reason=args.reason, who=who,
                          check_held=check)
    at = rec.position
    what = (f"the chunks of snapshot {at.snapshot_id} after chunk {at.chunk} (a snapshot still running "
            f"that the sink entered after version {args.to_version}), then every change committed after "
            f"its handoff {at.handoff}" if isinstance(at, SnapshotPosition)
            else f"every change committed after {at}")
    print(f"{rec.key}: version {rec.version} restores version {args.to_version} at {at} "
          f"(it was at {was.position}, version {was.version}).\n"
          f"The next run of {args.pipeline} delivers again to sink {args.sink} {what}, up to the source "
          f"head at that run; records the sink kept of earlier versions are ignored, and running "
          f"writers are fenced.")
    return 0


def _check_log_held_for_rewind(args: argparse.Namespace, position: Any) -> None:
    """A rewind past the log the source still holds would fail every later run until the
    checkpoint moves forward again: refuse it now, before a version is written."""
    spec = catalog.find(args.pipeline)
    try:
        bounds_step.check_rewind(spec, args.sink, args.to_version, position)
    except bounds_step.LogNotHeldError:
        raise
    except (TidegateError, OSError) as exc:
        raise TidegateError(f"cannot ask the source of {args.pipeline} whether it still holds the log "
                            f"after {position} ({exc}); rewind when it answers, or pass "
                            f"--no-source-check to rewind without asking") from None


def _os_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in some containers
        return "operator"


if __name__ == "__main__":
    sys.exit(main())
