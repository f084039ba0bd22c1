"""Airflow connections for the engine.

The engine never imports Airflow; it asks a *connection lookup* (``conn_id -> Connection``) for each
connection. :func:`airflow_connection` answers from Airflow's own connections (metadata
database, secrets backends, ``AIRFLOW_CONN_*``). :func:`connection_env` turns connections into
``AIRFLOW_CONN_<ID>`` environment variables (JSON) for a Spark driver, so secrets travel in the
environment of the spark-submit process and never in its argv.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from tidegate.connections import Connection, env_var, variable_env_var
from tidegate.errors import ConnectionConfigError
from tidegate.parts import ConnectionLookup


def airflow_connection(conn_id: str) -> Connection:
    """The Airflow connection ``conn_id`` as a :class:`tidegate.connections.Connection`."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        c = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise ConnectionConfigError(
            f"connection {conn_id!r} is not defined in Airflow: create it (Admin > Connections, "
            f"`airflow connections add`) or set {env_var(conn_id)} (URI or JSON)") from None
    return from_airflow(conn_id, c)


def airflow_variable(name: str) -> str:
    """Airflow variable ``name`` (metadata database, secrets backends, ``AIRFLOW_VAR_*``), registered
    with the log masker: the engine's variable lookup (a hash salt may live in one)."""
    from airflow.sdk import Variable

    value = Variable.get(name, default=None)
    if value is None or value == "":
        raise ConnectionConfigError(
            f"variable {name!r} is not defined in Airflow: create it (Admin > Variables, `airflow "
            f"variables set`) or set {variable_env_var(name)}")
    value = str(value)
    _mask(value)
    return value


def from_airflow(conn_id: str, c) -> Connection:
    """Convert an Airflow Connection object (anything with its attributes)."""
    extra = getattr(c, "extra_dejson", None)
    if extra is None:
        raw = getattr(c, "extra", None) or "{}"
        extra = json.loads(raw) if isinstance(raw, str) else dict(raw)
    port = getattr(c, "port", None)
    return Connection(
        conn_id=conn_id,
        conn_type=str(getattr(c, "conn_type", None) or ""),
        host=getattr(c, "host", None) or None,
        port=int(port) if port not in (None, "") else None,
        login=getattr(c, "login", None) or None,
        password=getattr(c, "password", None) or None,
        schema=getattr(c, "schema", None) or None,
        extra=dict(extra or {}),
    )


def aliased(lookup: ConnectionLookup, aliases: Mapping[str, str] | None) -> ConnectionLookup:
    """A lookup that answers a request for ``name`` with the connection ``aliases[name]``
    (an operator's ``source_conn_id`` overriding the spec's), keeping the requested id."""
    if not aliases:
        return lookup

    def resolve(conn_id: str) -> Connection:
        target = aliases.get(conn_id, conn_id)
        c = lookup(target)
        return c if target == conn_id else Connection(**{**c.__dict__, "conn_id": conn_id})

    return resolve


def to_json(c: Connection) -> str:
    """Airflow's JSON connection format (what ``AIRFLOW_CONN_<ID>`` accepts)."""
    d = {"conn_type": c.conn_type, "host": c.host, "port": c.port, "login": c.login,
         "password": c.password, "schema": c.schema, "extra": dict(c.extra or {})}
    return json.dumps({k: v for k, v in d.items() if v not in (None, "", {})}, sort_keys=True)


def connection_env(conn_ids: Iterable[str], lookup: ConnectionLookup = airflow_connection) -> dict[str, str]:
    """``{"AIRFLOW_CONN_<ID>": json}`` for each connection; every secret is registered with
    Airflow's log masker first."""
    env: dict[str, str] = {}
    for conn_id in dict.fromkeys(conn_ids):
        c = lookup(conn_id)
        value = to_json(c)
        _mask(c.password)
        _mask(value)
        env[env_var(conn_id)] = value
    return env


def salt_env(spec, parts) -> dict[str, str]:
    """What a Spark driver needs to resolve the spec's hash salt as the engine does outside Airflow:
    the salt's connection as ``AIRFLOW_CONN_<ID>`` or its variable as ``AIRFLOW_VAR_<NAME>``, in the
    environment of the spark-submit process (never its argv), masked in the task's log."""
    where = spec.source.hash_salt
    if where is None:
        return {}
    kind, name = where
    if kind == "conn_id":
        return connection_env([name], parts.connection)
    value = parts.variable(name)
    _mask(value)
    return {variable_env_var(name): value}


def _mask(secret: str | None) -> None:
    if not secret:
        return
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover - very old task SDK
        return
    mask_secret(secret)
