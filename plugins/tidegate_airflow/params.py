"""The trigger form of a pipeline DAG and the run plan derived from it.

The form (:func:`run_params`) is validated by Airflow when a run is triggered (types, enums).
What JSON Schema cannot say (``reason`` is required with ``resolve``; ``replay_of`` goes with
``mode=replay``; sinks must belong to the pipeline) is checked by :func:`plan_for_run`, which
every tidegate operator calls, so a bad combination fails the first task with a clear message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .exceptions import InvalidRunParamsError

MODES = ("incremental", "replay", "dry_run")
RESOLUTIONS = ("accept_gap", "resnapshot")
PARAM_KEYS = ("mode", "sinks", "max_events", "replay_of", "resolve", "reason")


def run_params(sink_ids: Sequence[str]) -> dict[str, Any]:
    """The trigger form: ``{name: Param}`` for a DAG's ``params``."""
    from airflow.sdk import Param

    ids = list(sink_ids)
    return {
        "mode": Param(
            "incremental", type="string", enum=list(MODES), title="Mode",
            description="incremental: deliver what is new since each sink's checkpoint. "
                        "replay: deliver again exactly the range that the run `replay_of` delivered "
                        "(checkpoints never move backwards). dry_run: read and serialize, deliver "
                        "nothing, move no checkpoint."),
        "sinks": Param(
            ids, type="array", items={"type": "string", "enum": ids}, uniqueItems=True, minItems=1,
            examples=ids, title="Sinks",
            description="The sinks this run delivers to (default: all of them)."),
        "max_events": Param(
            None, type=["null", "integer"], minimum=1, title="Max events per sub-batch",
            description="Override batch.max_events of the spec for this run (empty: the spec's)."),
        "replay_of": Param(
            None, type=["null", "string"], title="Replay of run",
            description="With mode=replay: the run id whose delivered range is replayed."),
        "resolve": Param(
            None, type=["null", "string"], enum=[None, *RESOLUTIONS], title="Resolve incident",
            description="Resolve the pipeline's open continuity incidents before running: "
                        "accept_gap moves the checkpoints past the missing range; resnapshot "
                        "re-loads the tables. Needs a reason."),
        "reason": Param(
            None, type=["null", "string"], title="Reason",
            description="Why the incident is resolved this way (kept with the incident). "
                        "Required when resolve is set."),
    }


@dataclass(frozen=True)
class RunPlan:
    """What one run does, from the params, ``dag_run.conf`` and operator overrides."""

    mode: str = "incremental"
    sinks: list[str] | None = None  # None: all sinks
    max_events: int | None = None
    replay_of: str | None = None
    resolve: str | None = None
    reason: str | None = None
    who: str = "airflow"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _blank(v: Any) -> bool:
    return v is None or (isinstance(v, str) and not v.strip())


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def plan_for_run(context: Mapping[str, Any], *, sink_ids: Sequence[str] | None = None,
                 overrides: Mapping[str, Any] | None = None) -> RunPlan:
    """Validate and combine the run's inputs. Precedence: operator overrides (not None) >
    ``dag_run.conf`` > params (the form, with its defaults). Raises
    :class:`InvalidRunParamsError` listing every problem."""
    params = context.get("params") or {}
    dag_run = context.get("dag_run")
    conf = (_get(dag_run, "conf") if dag_run is not None else None) or {}
    values = {k: params.get(k) for k in PARAM_KEYS if k in params}
    values.update({k: conf[k] for k in PARAM_KEYS if k in conf})
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})

    problems: list[str] = []
    mode = values.get("mode")
    mode = "incremental" if _blank(mode) else str(mode).strip()
    if mode not in MODES:
        problems.append(f"mode {mode!r} is not one of {' | '.join(MODES)}")

    sinks = _sinks(values.get("sinks"), sink_ids, problems)
    max_events = _max_events(values.get("max_events"), problems)

    replay_of = values.get("replay_of")
    replay_of = None if _blank(replay_of) else str(replay_of).strip()
    run_type = _get(dag_run, "run_type") if dag_run is not None else None
    run_type = str(getattr(run_type, "value", run_type) or "")
    run_id = str(context.get("run_id") or (_get(dag_run, "run_id") if dag_run is not None else "") or "")
    if run_type == "backfill" and mode == "incremental" and replay_of is None and "__" in run_id:
        # A backfill replays what the scheduled run for the same date delivered.
        mode, replay_of = "replay", "scheduled__" + run_id.split("__", 1)[1]
    if replay_of is not None and mode != "replay":
        problems.append(f"replay_of={replay_of!r} needs mode=replay (mode is {mode!r})")
    if mode == "replay" and replay_of is None:
        problems.append("mode=replay needs replay_of: the run id whose range is replayed")

    resolve = values.get("resolve")
    resolve = None if _blank(resolve) else str(resolve).strip()
    reason = values.get("reason")
    reason = None if _blank(reason) else str(reason).strip()
    if resolve is not None and resolve not in RESOLUTIONS:
        problems.append(f"resolve {resolve!r} is not one of {' | '.join(RESOLUTIONS)}")
    if resolve is not None and reason is None:
        problems.append(f"reason is required when resolve is set (resolve={resolve!r}): "
                        f"say why the incident is resolved this way; it is kept with the incident")

    if problems:
        raise InvalidRunParamsError(problems)
    who = (_get(dag_run, "triggering_user_name") if dag_run is not None else None) or "airflow"
    return RunPlan(mode=mode, sinks=sinks, max_events=max_events, replay_of=replay_of,
                   resolve=resolve, reason=reason, who=str(who))


def _sinks(v: Any, known: Sequence[str] | None, problems: list[str]) -> list[str] | None:
    if v is None or v == "all":
        return None
    if isinstance(v, str):
        v = [s.strip() for s in v.split(",") if s.strip()]
    if not isinstance(v, (list, tuple)) or not all(isinstance(s, str) for s in v):
        problems.append(f"sinks must be a list of sink ids, got {v!r}")
        return None
    chosen = list(dict.fromkeys(v))
    if not chosen:
        problems.append("sinks is empty: choose at least one sink (or leave the default: all)")
        return None
    if known is not None:
        unknown = [s for s in chosen if s not in known]
        if unknown:
            problems.append(f"unknown sink(s) {', '.join(unknown)}; this pipeline's sinks are: "
                            f"{', '.join(known)}")
            return None
        if set(chosen) == set(known):
            return None
    return chosen


def _max_events(v: Any, problems: list[str]) -> int | None:
    if _blank(v):
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
