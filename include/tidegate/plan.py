"""What one run does: its mode, sinks, batch size, replay target and incident resolution.

This module owns the vocabulary every face of tidegate shares (the Airflow trigger form and
operators, ``tidegate run``, the Spark job): the run modes, the resolutions, the order of the
guards and the exit code of a fatal Spark job. :meth:`RunPlan.from_values` validates one run's
inputs, whatever they came from, and names every problem at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .errors import TidegateError
from .spec import TABLE_RE

MODES = ("incremental", "replay", "dry_run")
# accept_gap moves the checkpoints past a recorded loss; resnapshot re-loads the tables (all,
# or the `tables` param) and hands off to the log, also on a healthy pipeline; continue goes on
# past a schema change that halted the pipeline (on_schema_change: halt).
RESOLUTIONS = ("accept_gap", "resnapshot", "continue")
# The guards of a run, in the order they run: an open incident first (nothing else matters
# while halted), then the server behind the connection, then whether its log still holds the
# checkpoints, then settings and headroom.
GUARD_ORDER = ("halted", "failover", "retention", "preflight")
# spark_jobs/deliver.py and the CLI exit with this code on an error that a retry cannot fix.
EXIT_FATAL = 3
PARAM_KEYS = ("mode", "sinks", "max_events", "replay_of", "resolve", "reason", "tables")


class RunParamsError(TidegateError):
    """A run's inputs are inconsistent; ``problems`` names each one."""

    fatal = True

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("invalid run params: " + "; ".join(self.problems))


@dataclass(frozen=True)
class RunPlan:
    """One run's inputs, validated. ``sinks`` None means every sink of the pipeline."""

    mode: str = "incremental"
    sinks: list[str] | None = None
    max_events: int | None = None
    replay_of: str | None = None
    resolve: str | None = None
    reason: str | None = None
    who: str = "airflow"
    tables: list[str] | None = None  # resolve=resnapshot: the tables to re-load (None: all)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_values(cls, values: Mapping[str, Any], *, sink_ids: Sequence[str] | None = None,
                    run_id: str = "", backfill: bool = False, who: str = "airflow") -> RunPlan:
        """Validate raw inputs (form params, ``dag_run.conf``, CLI flags). A backfill run with
        no explicit replay target replays the scheduled run of the same logical date."""
        problems: list[str] = []
        mode = _text(values.get("mode")) or "incremental"
        if mode not in MODES:
            problems.append(f"mode {mode!r} is not one of {' | '.join(MODES)}")
        sinks = _sinks(values.get("sinks"), sink_ids, problems)
        max_events = _max_events(values.get("max_events"), problems)
        replay_of = _text(values.get("replay_of"))
        if backfill and mode == "incremental" and replay_of is None and "__" in run_id:
            mode, replay_of = "replay", "scheduled__" + run_id.split("__", 1)[1]
        if replay_of is not None and mode != "replay":
            problems.append(f"replay_of={replay_of!r} needs mode=replay (mode is {mode!r})")
        if mode == "replay" and replay_of is None:
            problems.append("mode=replay needs replay_of: the run id whose range is replayed")
        resolve, reason = _text(values.get("resolve")), _text(values.get("reason"))
        if resolve is not None and resolve not in RESOLUTIONS:
            problems.append(f"resolve {resolve!r} is not one of {' | '.join(RESOLUTIONS)}")
        if resolve is not None and reason is None:
            problems.append(f"reason is required when resolve is set (resolve={resolve!r}): say why "
                            f"the incident is resolved this way; it is kept with the incident")
        tables = _tables(values.get("tables"), resolve, problems)
        if problems:
            raise RunParamsError(problems)
        return cls(mode, sinks, max_events, replay_of, resolve, reason, who, tables)


def _text(v: Any) -> str | None:
    if v is None or (isinstance(v, str) and not v.strip()):
        return None
    return str(v).strip()


def _names(v: Any, param: str, what: str, problems: list[str]) -> list[str] | None:
    """A list of names given as a list or as one comma-separated string (a CLI flag), each
    without the spaces around it. The form's pattern, checked by Python's ``re``, lets a name
    with a newline at its end through (``$`` matches before it)."""
    if isinstance(v, str):
        v = v.split(",")
    if not isinstance(v, (list, tuple)) or not all(isinstance(n, str) for n in v):
        problems.append(f"{param} must be a list of {what}, got {v!r}")
        return None
    return [n.strip() for n in v if n.strip()]


def _sinks(v: Any, known: Sequence[str] | None, problems: list[str]) -> list[str] | None:
    if v is None or v == "all":
        return None
    v = _names(v, "sinks", "sink ids", problems)
    if v is None:
        return None
    chosen = list(dict.fromkeys(v))
    if not chosen:
        problems.append("sinks is empty: choose at least one sink (or leave the default: all)")
        return None
    if known is None:
        return chosen
    unknown = [s for s in chosen if s not in known]
    if unknown:
        problems.append(f"unknown sink(s) {', '.join(unknown)}; this pipeline's sinks are: "
                        f"{', '.join(known)}")
        return None
    return None if set(chosen) == set(known) else chosen


def _tables(v: Any, resolve: str | None, problems: list[str]) -> list[str] | None:
    """``tables`` (resnapshot only): a list of ``db.table`` / ``schema.table`` names, or a
    comma-separated string of them; empty means every captured table."""
    if v is None or (isinstance(v, (str, list, tuple)) and not v) or (isinstance(v, str) and not v.strip()):
        return None
    v = _names(v, "tables", "schema.table names", problems)
    if v is None:
        return None
    bad = [t for t in v if not TABLE_RE.match(t)]
    if bad:
        problems.append(f"tables: malformed table name(s) {', '.join(map(repr, bad))}; expected "
                        f"schema.table (db.table for MySQL/MariaDB)")
        return None
    if resolve != "resnapshot":
        problems.append(f"tables={list(v)!r} only goes with resolve=resnapshot (resolve is {resolve!r})")
        return None
    return list(dict.fromkeys(v))


def _max_events(v: Any, problems: list[str]) -> int | None:
    if _text(v) is None if isinstance(v, str) else v is None:
        return None
    try:
        n = int(v)
        ok = not isinstance(v, bool) and n == float(v) and n >= 1
    except (TypeError, ValueError):
        ok = False
    if not ok:
        problems.append(f"max_events must be a positive integer or empty, got {v!r}")
        return None
    return n
