"""Connections outside Airflow: the same ``AIRFLOW_CONN_<ID>`` variables Airflow reads.

Airflow accepts a URI (``mysql://user:pass@host:3306/db?key=value``) or a JSON object
(``{"conn_type": ..., "host": ..., "extra": {...}}``); both are read here as Airflow reads
them (tests/dags/test_connections_generated.py: Airflow's own ``Connection`` as the oracle).
Inside Airflow, operators resolve the connection with Airflow's own machinery and hand the
engine a :class:`Connection`; the engine itself never imports Airflow. The password is kept out
of ``repr``, ``str`` and every error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from .errors import ConnectionConfigError


@dataclass(frozen=True)
class Connection:
    conn_id: str
    conn_type: str
    host: str | None = None
    port: int | None = None
    login: str | None = None
    password: str | None = field(default=None, repr=False)
    schema: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:  # never shows the password
        where = f"{self.host}:{self.port}" if self.port else (self.host or "")
        return f"{self.conn_id} ({self.conn_type}://{self.login or ''}@{where})"

    def __repr__(self) -> str:  # never shows the password, nor a secret kept in the extra
        extra = {k: "***" if is_secret_key(k) else v for k, v in self.extra.items()}
        return (f"Connection(conn_id={self.conn_id!r}, conn_type={self.conn_type!r}, host={self.host!r}, "
                f"port={self.port!r}, login={self.login!r}, schema={self.schema!r}, extra={extra!r})")


# Extra keys whose values are secrets (Kafka's ``sasl.password``, a NATS ``token``, ...): kept out
# of ``repr`` here, and out of every message a sink lets out (``tidegate.sinks._common``).
SECRET_HINTS = ("password", "secret", "token", "credential", "key.pem", "seed", "private")


def is_secret_key(key: str) -> bool:
    return any(h in key.lower() for h in SECRET_HINTS)


def env_var(conn_id: str) -> str:
    return "AIRFLOW_CONN_" + conn_id.upper()


def variable_env_var(name: str) -> str:
    return "AIRFLOW_VAR_" + name.upper()


def get_variable(name: str, environ: Mapping[str, str] | None = None) -> str:
    """Read Airflow variable ``name`` from ``AIRFLOW_VAR_<NAME>``, as Airflow does outside its
    metadata database. The value may be a secret (a hash salt): it never shows in an error."""
    environ = os.environ if environ is None else environ
    value = environ.get(variable_env_var(name))
    if not value:
        raise ConnectionConfigError(
            f"variable {name!r} is not defined: set {variable_env_var(name)}, or create the variable "
            f"in Airflow (Admin > Variables, `airflow variables set`)")
    return value


def get_connection(conn_id: str, environ: Mapping[str, str] | None = None) -> Connection:
    """Read connection ``conn_id`` from ``AIRFLOW_CONN_<CONN_ID>`` (URI or JSON)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(env_var(conn_id))
    if not raw:
        raise ConnectionConfigError(
            f"connection {conn_id!r} is not defined: set {env_var(conn_id)} (URI or JSON), "
            f"or create the connection in Airflow"
        )
    raw = raw.strip()
    try:
        return _from_json(conn_id, json.loads(raw)) if raw.startswith("{") else _from_uri(conn_id, raw)
    except ConnectionConfigError:
        raise
    except Exception as exc:  # the raw value may hold a password: never echo it
        raise ConnectionConfigError(
            f"connection {conn_id!r} in {env_var(conn_id)} is malformed "
            f"({type(exc).__name__}); expected an Airflow connection URI or JSON object"
        ) from None


def _from_json(conn_id: str, d: dict[str, Any]) -> Connection:
    extra = d.get("extra") or {}
    if isinstance(extra, str):
        extra = json.loads(extra) if extra.strip() else {}
    port = d.get("port")
    return Connection(
        conn_id=conn_id,
        conn_type=str(d.get("conn_type") or ""),
        host=d.get("host"),
        port=int(port) if port not in (None, "") else None,
        login=d.get("login"),
        password=d.get("password"),
        schema=d.get("schema"),
        extra=dict(extra),
    )


def _from_uri(conn_id: str, uri: str) -> Connection:
    """A connection URI read as Airflow reads it (tests/dags/test_connections_generated.py holds
    the two equal on generated connections): a host that carries a protocol of its own (a Spark
    Connect host ``sc://spark``) comes as ``<type>://sc://spark...``, and each query value that
    is JSON (``5``, ``true``, an object) is that value."""
    scheme = urlsplit(uri).scheme
    if not scheme:
        raise ConnectionConfigError(f"connection {conn_id!r}: URI has no scheme (e.g. mysql://)")
    rest = uri[len(scheme) + 3:] if uri[len(scheme):].startswith("://") else uri[len(scheme) + 1:]
    protocol = None
    if "://" in rest.split("?", 1)[0]:  # the host's own protocol (a query value may hold a URL)
        protocol, rest = rest.split("://", 1)
        if not protocol or "@" in protocol or ":" in protocol or "://" in rest:
            raise ConnectionConfigError(f"connection {conn_id!r}: the URI holds more than one "
                                        f"'://' outside a host's protocol")
    parts = urlsplit("//" + rest)
    host = _host(parts)
    return Connection(
        conn_id=conn_id,
        conn_type=scheme.replace("-", "_"),
        host=f"{protocol}://{host}" if protocol and host else host or None,
        port=parts.port,
        login=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        schema=unquote(parts.path[1:]) or None,
        extra=_query_extra(parts.query),
    )


def _host(parts: SplitResult) -> str:
    """The host as written but for its case (``urlsplit`` lowers it), unless it holds a path,
    which ``urlsplit`` would cut: then the part of the network location between user and port."""
    host = unquote(parts.hostname or "")
    if "/" in host:
        host = parts.netloc.rsplit("@", 1)[-1].split(":", 1)[0]
        host = unquote(host)
    return host


def _query_extra(query: str) -> dict[str, Any]:
    """The extra: ``__extra__`` (a JSON object) when the query has it, else every key, its value
    decoded as JSON where it is JSON."""
    values = dict(parse_qsl(query, keep_blank_values=True))
    if "__extra__" in values:
        return dict(json.loads(values["__extra__"]))
    return {k: _json_or_text(v) for k, v in values.items()}


def _json_or_text(value: str) -> Any:
    if not value:
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value
