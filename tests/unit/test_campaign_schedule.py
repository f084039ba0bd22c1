"""The campaign's schedules (tests/campaign/schedule.py): what an option adds is drawn from a
generator of its own, so a seed's faults and workload stay the seed's."""

from __future__ import annotations

import dataclasses

from tests.campaign.schedule import draw


def test_failovers_are_drawn_for_mariadb_schedules_only_and_leave_the_rest_of_the_seed_alone():
    mariadb = 0
    for seed in range(1, 201):
        plain, with_failovers = draw(seed), draw(seed, failovers=True)
        assert dataclasses.replace(with_failovers, failover_steps=()) == plain
        if plain.source == "postgres":  # a promoted standby halts by design: nothing to translate
            assert with_failovers.failover_steps == ()
            continue
        mariadb += 1
        steps = with_failovers.failover_steps
        assert steps and list(steps) == sorted(set(steps))
        assert all(0 <= i < len(plain.steps) for i in steps)
        assert "fails over" in with_failovers.describe()
    assert 60 < mariadb < 140


def test_rewinds_name_a_message_sink_of_the_pipeline_and_leave_the_rest_of_the_seed_alone():
    for seed in range(1, 201):
        plain, with_rewinds = draw(seed), draw(seed, rewinds=True)
        assert dataclasses.replace(with_rewinds, rewinds=()) == plain
        message_sinks = [s for s in plain.sinks if s in ("kafka", "nats", "redis")]
        if not message_sinks:  # Delta keeps what its tables hold: nothing to rewind there
            assert with_rewinds.rewinds == ()
            continue
        assert with_rewinds.rewinds
        for rw in with_rewinds.rewinds:
            assert rw.sink in message_sinks and 1 <= rw.back <= 6
            assert not (rw.in_flight and plain.steps[rw.step].fault == "zombie")
        assert draw(seed, rewinds=True, failovers=True).rewinds == ()  # refused by design
