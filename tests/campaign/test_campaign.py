"""The fault campaign's fixed seeds, run by `make test`: between them every fault kind on both
sources, and every sink (Kafka exactly-once, NATS, Redis, Delta merge and changelog). Each seed is
the same schedule and workload `make campaign SEED=s` runs (tests/campaign/runner.py), checked by
the same oracle: every change exactly once per sink, per-key order, the replay equal to the source
table, checkpoints never back, every failed run retried to success or halted loudly."""

from __future__ import annotations

import os

import pytest

from tests.campaign.runner import Services, run_schedule
from tests.campaign.schedule import draw

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

# Chosen (greedy, by their drawn schedules) so that between them every fault kind runs at least
# once, both sources and every sink are there, at the least cost: 15 is the one Delta seed (MariaDB,
# the run SIGKILLed after a sub-batch), the others are Kafka + NATS + Redis. The cross product
# (every kind on each source) needs ten more: 2102 1397 1552 2562 851 1030 1596 415 2488
# (`make campaign SEED=s`, or TIDEGATE_CAMPAIGN_SEEDS="..." for this test).
# 2488 is the zombie on PostgreSQL: it meets a known defect (below) and stays in the list, xfail
# strict, so that the fix flips it.
SLOT_HELD = pytest.mark.xfail(strict=True, reason="defect: a stalled (SIGSTOPped) PostgreSQL run keeps its "
                              "replication slot active, so every takeover run fails with 'replication slot "
                              "... is active for PID'")
SEEDS = [15, 2703, 2976, 971, 3273, 874, pytest.param(2488, marks=SLOT_HELD)]
if os.environ.get("TIDEGATE_CAMPAIGN_SEEDS"):
    SEEDS = [int(s) for s in os.environ["TIDEGATE_CAMPAIGN_SEEDS"].replace(",", " ").split()]


@pytest.fixture(scope="module")
def services(tmp_path_factory, service_env) -> Services:
    return Services(tmp_path_factory.mktemp("campaign"))


@pytest.mark.parametrize("seed", SEEDS)
def test_campaign_seed(services, seed):
    outcome = run_schedule(services, draw(seed))
    print(outcome.report())
    assert outcome.ok, outcome.report()
