"""Every port the services script binds lies below Linux's ephemeral range (32768-60999).

A port in that range can be taken by any client socket the tests open while a server starts:
a CI run met nats_tls unable to bind its port three starts in a row. Checked for every lane the
suite and the benchmarks use, with the ports a server binds besides its own (Kafka's controller
at + 1, NATS's monitor at + 4000, Spark's UIs)."""

from __future__ import annotations

import pytest

from tests.scripts import script_module

EPHEMERAL_LOW = 32768
LANES = (0, 1, 2, 3)


@pytest.fixture(scope="module")
def services():
    return script_module("services")


def bound_ports(services, lane: int) -> dict[str, int]:
    """Every port of every service on ``lane`` (as ``port()`` computes it with that lane)."""
    out = {}
    for name, base in services.DEFAULT_PORTS.items():
        p = base + services.LANE_STRIDE * lane
        out[name] = p
        if name.startswith("kafka"):
            out[f"{name} controller"] = p + 1
        if name.startswith("nats"):
            out[f"{name} monitor"] = p + 4000
        if name == "spark":
            out.update({"spark worker": p + 1, "spark master UI": p + 1004, "spark worker UI": p + 1005})
        if name.startswith("spark_connect"):
            out[f"{name} UI"] = p + 1040
    return out


@pytest.mark.parametrize("lane", LANES)
def test_every_port_is_below_the_ephemeral_range(services, lane):
    high = {n: p for n, p in bound_ports(services, lane).items() if p >= EPHEMERAL_LOW}
    assert not high, f"lane {lane}: ports in the ephemeral range: {high}"


def test_no_two_ports_collide_across_the_lanes(services):
    seen: dict[int, str] = {}
    for lane in LANES:
        for name, p in bound_ports(services, lane).items():
            assert p not in seen, f"lane {lane} {name} and {seen[p]} both on {p}"
            seen[p] = f"lane {lane} {name}"
