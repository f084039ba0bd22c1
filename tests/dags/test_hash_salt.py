"""The hash salt's way through the plugin: read from Airflow's variables or a connection's
password, into a client-mode Spark driver's environment (never its argv), masked in the log."""

from __future__ import annotations

import json
import textwrap

import pytest
from tidegate.connections import Connection, get_connection, get_variable
from tidegate.errors import ConnectionConfigError
from tidegate.parts import Parts
from tidegate.spec import load_spec_text

SPEC = """\
pipeline: pii
source:
  kind: mysql
  conn_id: db
  columns: {{shop.customers: {{hash: [phone]}}}}
  hash_salt: {salt}
sinks: [{{id: a, kind: redis, conn_id: r, stream: s}}]
"""


def spec(salt: str):
    return load_spec_text(textwrap.dedent(SPEC.format(salt=salt)), "pii.yaml")


def test_the_salt_from_an_airflow_variable(monkeypatch):
    from tidegate_airflow.connections import airflow_variable, salt_env

    monkeypatch.setenv("AIRFLOW_VAR_PII_SALT", "variable-salt-123")
    parts = Parts(lambda cid: Connection(cid, "x"), airflow_variable)
    s = spec("{variable: pii_salt}")
    assert parts.hash_salt(s) == b"variable-salt-123"
    env = salt_env(s, parts)
    assert env == {"AIRFLOW_VAR_PII_SALT": "variable-salt-123"}
    assert get_variable("pii_salt", env) == "variable-salt-123"  # what the driver reads
    with pytest.raises(ConnectionConfigError, match="AIRFLOW_VAR_NOPE") as exc:
        airflow_variable("nope")
    assert "salt-123" not in str(exc.value)


def test_the_salt_from_a_connection_password():
    from tidegate_airflow.connections import salt_env

    parts = Parts(lambda cid: Connection(cid, "generic", password="conn-salt-456"))
    s = spec("{conn_id: pii_salt}")
    env = salt_env(s, parts)
    assert list(env) == ["AIRFLOW_CONN_PII_SALT"]
    assert get_connection("pii_salt", env).password == "conn-salt-456"
    assert json.loads(env["AIRFLOW_CONN_PII_SALT"])["password"] == "conn-salt-456"
    plain = ("pipeline: p\nsource: {kind: mysql, conn_id: db}\n"
             "sinks: [{id: a, kind: redis, conn_id: r, stream: s}]\n")
    assert salt_env(load_spec_text(plain, "p.yaml"), parts) == {}
