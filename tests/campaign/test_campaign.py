"""The fault campaign's fixed seeds, run by `make test`: between them every fault kind, both
sources, and every sink (Kafka exactly-once, NATS, Redis, Delta merge and changelog). Each seed is
the same schedule and workload `make campaign SEED=s` runs (tests/campaign/runner.py), checked by
the same oracle: every change exactly once per sink, per-key order, the replay equal to the source
table, checkpoints never back, every failed run retried to success or halted loudly."""

from __future__ import annotations

import os
import re

import pytest

from tests.campaign.runner import Services, run_schedule
from tests.campaign.schedule import draw

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

# Chosen (greedy, by their drawn schedules) so that between them every fault kind runs at least
# once, both sources and every sink are there, at the least cost: 15 is the one Delta seed (MariaDB,
# the run SIGKILLed after a sub-batch), the others are Kafka + NATS + Redis. The cross product
# (every kind on each source) needs eight more: 2102 1397 1552 2562 851 1030 1596 415
# (`make campaign SEED=s`, or TIDEGATE_CAMPAIGN_SEEDS="..." for this test).
# 2488 is the zombie on PostgreSQL: it meets a known defect (below) and stays in the list, xfail
# strict, so that the fix flips it.
SLOT_HELD = pytest.mark.xfail(strict=True, reason="defect: a stalled (SIGSTOPped) PostgreSQL run keeps its "
                              "replication slot active, so every takeover run fails with 'replication slot "
                              "... is active for PID'")
SEEDS = [15, 2703, 2976, 971, 3273, 874, pytest.param(2488, marks=SLOT_HELD)]

# A known defect a seed meets or not depending on timing: a run stalled (or a broker down) longer
# than the Kafka transaction timeout fails fatally, with INVALID_TXN_STATE or as "fenced by a newer
# instance (another run took over ...)" when no other run ran, instead of naming the timeout and
# being retried (`SINKS=kafka,nats,redis` seeds 111, 113; seed 415 met it; 3273 and 874 can). A
# seed whose only findings are this, with every sink exact, is an xfail; anything else fails.
# Remove the entry once the fix is in.
TIMING_DEFECTS = {
    "Kafka transaction timeout reported as a fatal INVALID_TXN_STATE or fencing": re.compile(
        r"failed fatally .*(INVALID_TXN_STATE|_FENCED: Failed to end tr)"),
}
if os.environ.get("TIDEGATE_CAMPAIGN_SEEDS"):
    SEEDS = [int(s) for s in os.environ["TIDEGATE_CAMPAIGN_SEEDS"].replace(",", " ").split()]


@pytest.fixture(scope="module")
def services(tmp_path_factory, service_env) -> Services:
    return Services(tmp_path_factory.mktemp("campaign"))


@pytest.mark.parametrize("seed", SEEDS)
def test_campaign_seed(services, seed):
    outcome = run_schedule(services, draw(seed))
    print(outcome.report())
    if not outcome.ok and all(v.ok for v in outcome.verdicts):
        known = {name for f in outcome.findings for name, pat in TIMING_DEFECTS.items() if pat.search(f)}
        if known and all(any(p.search(f) for p in TIMING_DEFECTS.values()) for f in outcome.findings):
            pytest.xfail(f"defect: {', '.join(sorted(known))}")
    assert outcome.ok, outcome.report()
