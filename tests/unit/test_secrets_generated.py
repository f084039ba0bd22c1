"""Passwords never reach an error, a log line or the CLI's output, on generated passwords.

A run whose source or checkpoint store does not answer (nothing listens on port 9 of the
loopback), and a NATS or Redis sink that cannot connect, fail naming the connection; the
password is in no form on the way: not as given, not URL-encoded as the URI carries it, not
escaped. Each password is drawn from characters that parse specially in a URI
(``@ : / ? # % & = +``), quotes, backslashes, spaces and non-ASCII letters, and is given as an
Airflow connection URI (encoded) or JSON object (as it is).
"""

from __future__ import annotations

import json
import logging
import random
import traceback
import urllib.parse
from pathlib import Path

import pytest
from tidegate import cli

ROOT = Path(__file__).resolve().parents[2]
SEEDS = range(1, 25)
CHARS = "abcXYZ019" + "@:/?#%&=+" + " '\"\\!$*;,[]{}~^|<>" + "üß€✓"
DEAD = "127.0.0.1:9"  # the discard port: nothing listens on it here


def generated_password(rng: random.Random) -> str:
    return "".join(rng.choice(CHARS) for _ in range(rng.randint(8, 20)))


def forms_of(password: str) -> set[str]:
    """The password as it could leak: as given, URL-encoded, escaped."""
    return {password, urllib.parse.quote(password, safe=""), urllib.parse.quote(password),
            urllib.parse.quote_plus(password), password.encode("unicode_escape").decode("ascii"),
            json.dumps(password)[1:-1]}


def connection(rng: random.Random, conn_type: str, password: str, schema: str) -> str:
    host, port = DEAD.split(":")
    if rng.random() < 0.5:
        return f"{conn_type}://cdc:{urllib.parse.quote(password, safe='')}@{host}:{port}/{schema}"
    return json.dumps({"conn_type": conn_type, "host": host, "port": int(port), "login": "cdc",
                       "password": password, "schema": schema})


CASES = {  # what is unreachable: (the pipeline run, the variable that holds the password)
    "postgres source": ("shop_postgres", "AIRFLOW_CONN_CDC_POSTGRES"),
    "mysql source": ("shop_mysql", "AIRFLOW_CONN_CDC_MYSQL"),
    "postgres store": ("shop_mysql", "TIDEGATE_CHECKPOINT_STORE"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_unreachable_server_fails_without_showing_the_password(case, tmp_path, monkeypatch, capsys,
                                                                  caplog):
    pipeline, variable = CASES[case]
    monkeypatch.setenv("TIDEGATE_PIPELINES_DIR", str(ROOT / "include" / "pipelines"))
    monkeypatch.setenv("TIDEGATE_STORE_TIMEOUT_S", "2")
    caplog.set_level(logging.DEBUG)
    leaks = []
    for seed in SEEDS:
        rng = random.Random(seed)
        password = generated_password(rng)
        store = f"sqlite:///{tmp_path}/store_{seed}.sqlite"
        if variable == "TIDEGATE_CHECKPOINT_STORE":
            store = f"postgresql://cdc:{urllib.parse.quote(password, safe='')}@{DEAD}/store"
        else:
            monkeypatch.setenv(variable, connection(rng, variable.split("_")[-1].lower(), password, "shop"))
        monkeypatch.setenv("TIDEGATE_CHECKPOINT_STORE", store)
        caplog.clear()
        try:
            rc, raised = cli.main(["run", pipeline, "--run-id", f"s{seed}"]), ""
        except Exception as exc:  # noqa: BLE001 - an unexpected error must not show it either
            rc, raised = None, "".join(traceback.format_exception(exc))
        out = capsys.readouterr()
        said = "\n".join([out.out, out.err, caplog.text, raised])
        assert rc != 0, (seed, said)
        shown = [f for f in forms_of(password) if f in said]
        if shown:
            leaks.append((seed, password, shown, said[-400:]))
    assert not leaks, leaks[:3]


SINK_SEEDS = range(1, 7)  # a NATS client gives up on a dead server after about 1.5 s


@pytest.mark.parametrize("sink_id,conn_type", [("bus", "nats"), ("cache", "redis")])
def test_an_unreachable_sink_fails_without_showing_the_password(sink_id, conn_type, monkeypatch, caplog):
    """The example pipeline's NATS and Redis sinks, opened against a dead port with a generated
    password (a Kafka client waits 30 s for metadata first: its password is in no message of
    the Kafka sink's, which names the connection by id)."""
    from tidegate.catalog import find
    from tidegate.parts import Parts

    monkeypatch.setenv("TIDEGATE_PIPELINES_DIR", str(ROOT / "include" / "pipelines"))
    caplog.set_level(logging.DEBUG)
    spec, leaks = find("shop_mysql"), []
    for seed in SINK_SEEDS:
        rng = random.Random(seed)
        password = generated_password(rng)
        monkeypatch.setenv(f"AIRFLOW_CONN_CDC_{conn_type.upper()}", connection(rng, conn_type, password, "0"))
        caplog.clear()
        [sink] = Parts().sinks(spec, only=[sink_id])
        with pytest.raises(Exception) as failed:  # noqa: PT011 - whatever it is, it names no password
            sink.open()
        said = "\n".join(["".join(traceback.format_exception(failed.value)), caplog.text])
        assert "127.0.0.1" in said, said[-400:]  # it failed on the dead port
        shown = [f for f in forms_of(password) if f in said]
        if shown:
            leaks.append((seed, password, shown, said[-400:]))
    assert not leaks, leaks[:3]
