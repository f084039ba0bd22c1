"""The trigger form against the run's plan, on generated confs.

Airflow validates a run's conf against the DAG's params (the form) when the run is triggered;
the bounds task then builds the run's plan from it (``params.plan_for_run``). The two must
agree on each field: a value the form lets through is one the plan takes, or the plan refuses
it only for a rule between fields (``reason`` with ``resolve``, ``replay_of`` with
``mode=replay``, ``tables`` with ``resolve=resnapshot``), which JSON Schema per field cannot say.
Otherwise the user clicks "Trigger" and learns of a bad field only when the run fails. A plan
the two accept names only tables as a table name is written, and survives the run's record.
"""

from __future__ import annotations

import json
import random
import re

import pytest

CROSS_FIELD = ("needs mode=replay", "mode=replay needs replay_of", "reason is required",
               "only goes with resolve=resnapshot")
# Before the plan stripped every name, 14 of these seeds per DAG (the first: 54 for
# cdc_shop_mysql, 20 for cdc_shop_postgres) found a table name ending in a newline that the form
# and the plan both took: the form's pattern is checked with Python's ``re``, whose ``$`` matches
# before a final newline.
SEEDS = range(1, 401)
TABLE = re.compile(r"[A-Za-z0-9_$]+\.[A-Za-z0-9_$]+")

# Per field: values the form is meant to take, then values it is meant to refuse (the test
# does not rely on which is which: it compares the form's verdict with the plan's).
POOLS = {
    "mode": (["incremental", "replay", "dry_run"], ["snapshot", "", " replay", 3]),
    "max_events": ([None, 1, 500, 2.0, 10**12], [0, -3, "10", "ten", 2.5, True, ""]),
    "replay_of": ([None, "", "  ", "scheduled__2026-01-01T00:00:00+00:00", "manual__x", "r1\n"], [7]),
    "resolve": ([None, "accept_gap", "resnapshot", "continue"], ["", "ignore", 1]),
    "reason": ([None, "", "  ", "consumer rebuilt", "why\n"], [5]),
    "tables": ([None, [], ["shop.orders"], ["shop.orders", "shop.customers"], ["shop.orders\n"]],
               [["shop.orders", "shop.orders"], ["no_schema"], "shop.orders", [3], ["a b.c"],
                [" shop.orders"], ["shop.orders", ""]]),
}


def generated_conf(rng: random.Random, sink_ids: list[str]) -> dict:
    """Some of the form's fields, each drawn from values the form takes (most often) and
    values it refuses."""
    sinks = ([[rng.choice(sink_ids)], rng.sample(sink_ids, len(sink_ids))],
             [[], ["nope"], [1], [sink_ids[0], sink_ids[0]], ",".join(sink_ids), "all", None])
    conf = {}
    for key, (taken, refused) in {**POOLS, "sinks": sinks}.items():
        if rng.random() < 0.6:
            conf[key] = rng.choice(taken if rng.random() < 0.85 else refused)
    # the rules between fields, met most of the time, so the fields behind them are reached
    if "tables" in conf and rng.random() < 0.7:
        conf.update(resolve="resnapshot", reason=rng.choice(["consumer rebuilt", "why\n"]))
    if conf.get("mode") == "replay" and rng.random() < 0.7:
        conf["replay_of"] = rng.choice(["manual__x", "r1\n", "scheduled__2026-01-01T00:00:00+00:00"])
    if conf.get("resolve") and rng.random() < 0.7:
        conf["reason"] = "consumer rebuilt"
    return conf


def served(dag):
    """The DAG as the API server holds it: serialized by the dag-processor, read back."""
    from airflow.serialization.serialized_objects import DagSerialization

    return DagSerialization.from_dict(DagSerialization.to_dict(dag))


def form_verdict(served_dag, conf: dict) -> bool:
    """Whether the API server takes ``conf`` when the run is triggered (it merges the conf into
    the DAG's params and validates every field, as ``SerializedDAG.create_dagrun`` does)."""
    from airflow.sdk.exceptions import ParamValidationError

    try:
        served_dag.params.deep_merge(conf).validate()
    except ParamValidationError:
        return False
    return True


def plan_verdict(dag, conf: dict):
    """The plan the bounds task builds from the validated params and ``conf``, or its problems."""
    from tidegate.plan import RunPlan
    from tidegate_airflow.exceptions import InvalidRunParamsError
    from tidegate_airflow.params import plan_for_run

    context = {"params": dag.params.validate(), "run_id": "manual__g",
               "dag_run": {"conf": conf, "run_type": "manual", "run_id": "manual__g"}}
    sink_ids = [s for s in dag.params.get_param("sinks").value]
    try:
        plan = plan_for_run(context, sink_ids=sink_ids)
    except InvalidRunParamsError as exc:
        return exc.problems
    assert RunPlan(**json.loads(json.dumps(plan.to_json()))) == plan  # as the run's record keeps it
    return plan


@pytest.mark.parametrize("dag_id", ["cdc_shop_mysql", "cdc_shop_postgres"])
def test_what_the_form_takes_the_plan_takes_but_for_rules_between_fields(dags, dag_id):
    dag = dags[dag_id]
    form = served(dag)
    sink_ids = list(dag.params.get_param("sinks").value)
    disagreements, taken = [], 0
    for seed in SEEDS:
        conf = generated_conf(random.Random(seed), sink_ids)
        if not form_verdict(form, conf):
            continue
        taken += 1
        verdict = plan_verdict(dag, conf)
        if isinstance(verdict, list):
            own = [p for p in verdict if not any(rule in p for rule in CROSS_FIELD)]
            if own:
                disagreements.append((seed, conf, own))
        elif verdict.tables is not None and not all(TABLE.fullmatch(t) for t in verdict.tables):
            disagreements.append((seed, conf, f"tables {verdict.tables!r} are not table names"))
    assert taken >= 60, taken  # the generator reaches the form's inside often enough
    assert not disagreements, disagreements[:5]
