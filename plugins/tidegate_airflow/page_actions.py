"""The tidegate page's actions: resolve a pipeline's open incidents (a DAG run triggered with
``resolve``/``reason``, as the page user) and pause or resume its DAG.

A resolution is recorded exactly as one triggered from the DAG's form or the REST API: the page
creates a manual DAG run through Airflow's own server-side trigger
(:func:`airflow.api.common.trigger_dag.trigger_dag`, with ``triggering_user_name``, what
``POST /api/v2/dags/{dag_id}/dagRuns`` passes to ``create_dagrun``), and the run's guard
resolves the incidents with that user and the reason. Validation of the form happens first, here
and in the engine's :meth:`tidegate.plan.RunPlan.from_values`, so a bad form gets a message and
creates no run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tidegate.plan import RunParamsError, RunPlan
from tidegate.status import resolve_params


class FormError(ValueError):
    """A form the page refuses; the message names the field and the fix."""


def resolutions_for(open_kinds: Iterable[str]) -> list[str]:
    """The ``resolve`` values that fit every open incident (``continue`` only for schema changes)."""
    ways = [{p["resolve"] for p in resolve_params(kind)} for kind in open_kinds]
    common = set.intersection(*ways) if ways else set()
    return [w for w in ("accept_gap", "resnapshot", "continue") if w in common]


def resolution_conf(form: Mapping[str, Any], open_kinds: list[str], who: str) -> dict[str, Any]:
    """The ``dag_run.conf`` of the resolution the form asks for (raises :class:`FormError`)."""
    if not open_kinds:
        raise FormError("this pipeline has no open incident to resolve (reload the page)")
    allowed = resolutions_for(open_kinds)
    resolve = str(form.get("resolve") or "").strip()
    reason = str(form.get("reason") or "").strip()
    if resolve not in allowed:
        raise FormError(f"resolve: choose one of {', '.join(allowed)} for the open incidents "
                        f"({', '.join(sorted(set(open_kinds)))}); got {resolve or 'nothing'!r}")
    if not reason:
        raise FormError("reason: required. Say why the incident is resolved this way; it is kept "
                        "with the incident, with your user name and the time")
    conf: dict[str, Any] = {"resolve": resolve, "reason": reason}
    tables = [t for t in str(form.get("tables") or "").replace(",", " ").split() if t]
    if tables and resolve != "resnapshot":
        raise FormError("tables: only with resolve=resnapshot (which tables to re-load); leave it empty")
    if tables:
        conf["tables"] = tables
    try:
        RunPlan.from_values(conf, run_id="tidegate-page", who=who)
    except RunParamsError as exc:
        raise FormError("; ".join(exc.problems)) from None
    return conf


def trigger_run(dag_id: str, conf: dict[str, Any], who: str) -> str:
    """Create a manual run of ``dag_id`` with ``conf``, triggered by ``who`` (the UI)."""
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.utils.types import DagRunTriggeredByType

    run = trigger_dag(dag_id, triggered_by=DagRunTriggeredByType.UI, triggering_user_name=who, conf=conf)
    if run is None:
        raise FormError(f"Airflow created no run of {dag_id}")
    return run.run_id


def set_paused(dag_id: str, paused: bool) -> None:
    """Pause or resume the DAG (``is_paused``), as ``PATCH /api/v2/dags/{dag_id}`` does."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    with create_session() as session:  # commits on exit
        dag = DagModel.get_dagmodel(dag_id, session=session)
        if dag is None:
            raise FormError(f"DAG {dag_id} is not known to Airflow (yet): its spec may not be parsed")
        dag.is_paused = paused


def paused_states(dag_ids: list[str]) -> dict[str, bool]:
    """``is_paused`` of the DAGs Airflow knows among ``dag_ids``."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        known = [dag_id for dag_id in dag_ids if DagModel.get_dagmodel(dag_id, session=session)]
        paused = DagModel.get_paused_dag_ids(known, session=session)
    return {dag_id: dag_id in paused for dag_id in known}
