"""The trigger form of a pipeline DAG and the run plan derived from it.

The form (:func:`run_params`) is validated by Airflow when a run is triggered (types, enums).
What JSON Schema cannot say (``reason`` is required with ``resolve``; ``replay_of`` goes with
``mode=replay``; sinks must belong to the pipeline) is checked by the engine's
:meth:`tidegate.plan.RunPlan.from_values`, which every tidegate operator reaches through
:func:`plan_for_run`, so a bad combination fails the first task with a clear message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tidegate.plan import MODES, PARAM_KEYS, RESOLUTIONS, RunParamsError, RunPlan

from .exceptions import InvalidRunParamsError

# The JSON Schema dialect of every field of the form. Airflow validates a Param with
# ``jsonschema.validate``, which first checks the field's schema against its dialect's metaschema,
# and it validates each of the seven fields about eleven times while a DAG is built and serialized
# (each task's copy of the params is compared and printed). Against the default dialect (2020-12)
# that check was most of a pipeline's parse; against draft-07 it costs a third as much. Every
# keyword the form uses means the same in both; Airflow's trigger form ignores the key.
SCHEMA_DIALECT = "http://json-schema.org/draft-07/schema#"
# How the form shows "resolve" left empty: a run that resolves nothing.
NO_RESOLUTION = "(none: resolve nothing)"


def run_params(sink_ids: Sequence[str]) -> dict[str, Any]:
    """The trigger form: ``{name: Param}`` for a DAG's ``params``."""
    from airflow.sdk import Param

    ids = list(sink_ids)
    form = {
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
            # Airflow's form labels an enum's values with this (its key for None is "null"; a value
            # without a label shows as itself); without it the default choice reads "null"
            values_display={"null": NO_RESOLUTION},
            description="Resolve the pipeline's open continuity incidents before running: "
                        "accept_gap moves the checkpoints past the missing range; resnapshot re-loads "
                        "the tables (also on a healthy pipeline, e.g. for a consumer that rebuilds) and "
                        "hands off to the log; continue goes on past a schema change. Needs a reason."),
        "reason": Param(
            None, type=["null", "string"], title="Reason",
            description="Why the incident is resolved this way (kept with the incident). "
                        "Required when resolve is set."),
        # snapshots: which tables a resnapshot re-loads
        "tables": Param(
            None, type=["null", "array"], uniqueItems=True, title="Tables to re-load",
            items={"type": "string", "pattern": r"^[A-Za-z0-9_$]+\.[A-Za-z0-9_$]+$"},
            description="With resolve=resnapshot: only these tables (schema.table; db.table for MySQL); "
                        "empty: every captured table. After a loss every table is re-loaded."),
    }
    for param in form.values():
        param.schema["$schema"] = SCHEMA_DIALECT
    return form


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def plan_for_run(context: Mapping[str, Any], *, sink_ids: Sequence[str] | None = None,
                 overrides: Mapping[str, Any] | None = None) -> RunPlan:
    """The run's plan. Precedence: operator overrides (not None) > ``dag_run.conf`` > params
    (the form, with its defaults). Raises :class:`InvalidRunParamsError` listing every problem."""
    params = context.get("params") or {}
    dag_run = context.get("dag_run")
    conf = (_get(dag_run, "conf") if dag_run is not None else None) or {}
    values = {k: params.get(k) for k in PARAM_KEYS if k in params}
    values.update({k: conf[k] for k in PARAM_KEYS if k in conf})
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    run_type = _get(dag_run, "run_type") if dag_run is not None else None
    run_type = str(getattr(run_type, "value", run_type) or "")
    who = (_get(dag_run, "triggering_user_name") if dag_run is not None else None) or "airflow"
    try:
        return RunPlan.from_values(values, sink_ids=sink_ids, run_id=run_id_of(context),
                                   backfill=run_type == "backfill", who=str(who))
    except RunParamsError as exc:
        raise InvalidRunParamsError(exc.problems) from None


def run_id_of(context: Mapping[str, Any]) -> str:
    run_id = context.get("run_id")
    if not run_id and context.get("dag_run") is not None:
        run_id = _get(context["dag_run"], "run_id")
    return str(run_id or "manual")
