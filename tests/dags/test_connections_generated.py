"""tidegate reads an Airflow connection as Airflow does, on generated connections.

The engine never imports Airflow: it parses ``AIRFLOW_CONN_<ID>`` itself
(``tidegate.connections``), wherever a run goes (a Spark executor, ``tidegate run``). What a
user writes in Airflow must mean the same there. The oracle is Airflow's own ``Connection``:
each generated connection (hosts, logins and passwords with characters a URI encodes, schemas
with slashes, extras of strings, numbers, booleans and nested objects, tidegate's own
``spark_connect`` type) is written as Airflow writes it (``get_uri()``, ``as_json()``), read by
tidegate and by Airflow, and every field must agree.
"""

from __future__ import annotations

import json
import random

import pytest

# Before tidegate read a URI as Airflow does, 40 of these seeds as URIs (the first: 9) had a host
# with a protocol of its own (Airflow writes ``kafka://sc://...``), whose login, password, port
# and schema tidegate lost; seed 120 had a query value that is JSON, which Airflow decodes.
SEEDS = range(1, 301)
CONN_TYPES = ["postgres", "mysql", "kafka", "nats", "redis", "spark_connect", "spark", "generic"]
TEXT = "abcXYZ019" + "@:/?#%&=+ " + "'\"\\!$*;,[]~" + "üß€"


def text(rng: random.Random, lo: int = 1, hi: int = 12) -> str:
    return "".join(rng.choice(TEXT) for _ in range(rng.randint(lo, hi)))


def maybe(rng: random.Random, make):
    return make() if rng.random() < 0.75 else None


def generated_fields(rng: random.Random) -> dict:
    extra = {}
    for _ in range(rng.randint(0, 3)):
        key = rng.choice(["sslmode", "bootstrap.servers", "tls", "client_id", "retries", "nested", text(rng)])
        extra[key] = rng.choice([text(rng), rng.randint(0, 10**6), rng.random() < 0.5,
                                 {"a": text(rng)}, "127.0.0.1:9092,127.0.0.1:9093"])
    return {"conn_type": rng.choice(CONN_TYPES),
            "host": maybe(rng, lambda: rng.choice(["127.0.0.1", "db.internal", "kafka-1.example.com",
                                                    "Mixed.Case.Host", "sc://spark-host"])),
            "port": maybe(rng, lambda: rng.randint(1, 65535)),
            "login": maybe(rng, lambda: text(rng)),
            "password": maybe(rng, lambda: text(rng, 6, 20)),
            "schema": maybe(rng, lambda: rng.choice(["shop", "db/1", text(rng)])),
            "extra": json.dumps(extra) if extra else None}


def fields(conn) -> dict:
    extra = conn.extra_dejson if hasattr(conn, "extra_dejson") else conn.extra
    return {"conn_type": conn.conn_type, "host": conn.host or None, "port": conn.port,
            "login": conn.login or None, "password": conn.password or None, "schema": conn.schema or None,
            "extra": extra or {}}


@pytest.mark.parametrize("form", ["uri", "json"])
def test_tidegate_reads_what_airflow_writes_as_airflow_reads_it(form):
    from airflow.models.connection import Connection as AirflowConnection
    from tidegate.connections import get_connection

    differences = []
    for seed in SEEDS:
        written = AirflowConnection(conn_id="gen", **generated_fields(random.Random(seed)))
        value = written.get_uri() if form == "uri" else written.as_json()
        airflow = fields(AirflowConnection(conn_id="gen", uri=value) if form == "uri"
                         else AirflowConnection.from_json(value, conn_id="gen"))
        ours = fields(get_connection("gen", {"AIRFLOW_CONN_GEN": value}))
        diff = {k: (airflow[k], ours[k]) for k in airflow if airflow[k] != ours[k]}
        if diff:
            differences.append((seed, value, diff))
    assert not differences, differences[:5]
