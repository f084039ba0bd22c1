"""TLS of a MySQL/MariaDB connection, from its extra as Airflow's MySQL provider spells it.

    {"ssl": {"ca": "/path/ca.pem", "cert": "/path/client.pem", "key": "/path/client.key",
             "check_hostname": true},
     "ssl_mode": "VERIFY_IDENTITY"}

``ssl`` may also be that object as JSON text (how a URI's query string carries it); ``ssl_mode``
(DISABLED, PREFERRED, REQUIRED, VERIFY_CA, VERIFY_IDENTITY) is optional. :func:`pymysql_tls` turns
them into PyMySQL's ``ssl_*`` arguments:

* a CA (``ssl.ca``) means the server's certificate is verified against it, and so is the host
  name unless ``check_hostname`` is false or ``ssl_mode`` is VERIFY_CA (PyMySQL's own default
  for a CA, and the safe one: a certificate of the right CA issued to another host must not do);
* a client certificate without a CA encrypts and identifies the client, and verifies nothing;
* no TLS settings: PyMySQL's default, which uses TLS when the server offers it and verifies
  nothing (docs/operations.md says so).

Contradictions (VERIFY_* without a CA, DISABLED with ``ssl``, VERIFY_IDENTITY with
``check_hostname: false``) are errors naming the field, never a silent downgrade.
"""

from __future__ import annotations

import functools
import json
import ssl
from typing import Any

import pymysql

from ...connections import Connection
from ..tls import config_error, existing_file, flag, verification_failed

SSL_KEYS = ("ca", "cert", "key", "check_hostname")
SSL_MODES = ("DISABLED", "PREFERRED", "REQUIRED", "VERIFY_CA", "VERIFY_IDENTITY")


def ssl_settings(conn: Connection) -> dict[str, Any]:
    """The extra's ``ssl`` object (``{}`` when absent), checked for unknown keys."""
    raw = (conn.extra or {}).get("ssl")
    if raw in (None, "", {}):
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            raise config_error(conn, "ssl", "is text but not a JSON object; give an object like "
                                            '{"ca": "/path/ca.pem"}') from None
    if not isinstance(raw, dict):
        raise config_error(conn, "ssl", f"must be an object with keys {', '.join(SSL_KEYS)}")
    unknown = sorted(set(raw) - set(SSL_KEYS))
    if unknown:
        raise config_error(conn, "ssl", f"unknown key(s) {', '.join(unknown)}; tidegate reads "
                                        f"{', '.join(SSL_KEYS)}")
    return raw


def ssl_mode(conn: Connection) -> str | None:
    mode = (conn.extra or {}).get("ssl_mode")
    if mode in (None, ""):
        return None
    upper = str(mode).strip().upper().replace("-", "_")
    if upper not in SSL_MODES:
        raise config_error(conn, "ssl_mode", f"{mode!r} is not one of {', '.join(SSL_MODES)}")
    return upper


def pymysql_tls(conn: Connection) -> dict[str, Any]:
    """PyMySQL keyword arguments for the TLS the connection's extra asks for (see the module
    docstring); ``{}`` keeps PyMySQL's default."""
    sslp, mode = ssl_settings(conn), ssl_mode(conn)
    if mode == "DISABLED":
        if sslp:
            raise config_error(conn, "ssl_mode", "DISABLED contradicts the ssl settings: remove one")
        return {"ssl_disabled": True}
    kw: dict[str, Any] = {}
    for key in ("cert", "key"):
        if sslp.get(key):
            kw[f"ssl_{key}"] = existing_file(conn, f"ssl.{key}", sslp[key])
    check = flag(conn, "ssl.check_hostname", sslp["check_hostname"]) if "check_hostname" in sslp else None
    if sslp.get("ca"):
        if mode == "VERIFY_IDENTITY" and check is False:
            raise config_error(conn, "ssl.check_hostname", "false contradicts ssl_mode VERIFY_IDENTITY")
        kw["ssl_ca"] = existing_file(conn, "ssl.ca", sslp["ca"])
        kw["ssl_verify_cert"] = True
        kw["ssl_verify_identity"] = mode != "VERIFY_CA" and check is not False
        return kw
    if mode in ("VERIFY_CA", "VERIFY_IDENTITY") or check:
        field = "ssl_mode" if mode in ("VERIFY_CA", "VERIFY_IDENTITY") else "ssl.check_hostname"
        raise config_error(conn, field, "verifying the server needs the CA that signed its "
                                        "certificate: name its file in ssl.ca")
    if mode == "REQUIRED" and not kw:
        # TLS or nothing, certificate unchecked: only PyMySQL's ssl object says that (its ssl_*
        # arguments turn TLS on only with a file or a verification).
        kw["ssl"] = {"check_hostname": False, "verify_mode": False}
    return kw


class PyMySqlConnection(pymysql.connections.Connection):
    """PyMySQL's connection, but without TLS settings (its PREFERRED mode: TLS when the server
    offers it, nothing verified) every connection of the process shares one SSL context.
    PyMySQL makes a new one per connection, loading the system's CA store it then never uses:
    about 20 ms, paid by every control, snapshot and replication connection. The shared one
    does not load it at all."""

    def _create_ssl_ctx(self, sslp: Any) -> ssl.SSLContext:
        if sslp == {}:
            return _unverified_context()
        return super()._create_ssl_ctx(sslp)


@functools.cache
def _unverified_context() -> ssl.SSLContext:
    # PyMySQL's context for no settings (TLS client, no host-name check, nothing verified) without
    # the system's CA store it would load and never read: another 20-40 ms per process.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def tls_failure(conn: Connection, exc: BaseException):
    """The :class:`~tidegate.errors.TlsVerificationError` a failed connect stands for, or None
    when it failed for another reason. PyMySQL wraps the handshake's error in an
    ``OperationalError`` and keeps it as ``original_exception``."""
    cause = getattr(exc, "original_exception", None) or exc
    if isinstance(cause, ssl.SSLCertVerificationError):
        return verification_failed(conn, cause.verify_message or str(cause))
    return None
