"""TLS of a PostgreSQL connection, from its extra as Airflow's Postgres provider spells it: the
libpq parameters themselves.

    {"sslmode": "verify-full", "sslrootcert": "/path/ca.pem",
     "sslcert": "/path/client.pem", "sslkey": "/path/client.key"}

:func:`libpq_tls` hands them to libpq as they are, with two rules on top:

* a CA (``sslrootcert``) without ``sslmode`` means ``verify-full`` (chain and host name), not
  libpq's ``prefer``, which would verify nothing: a CA is given to be checked against;
* a CA with ``disable``, ``allow`` or ``prefer`` is an error (libpq would ignore the CA), as is an
  ``ssl*`` key libpq does not read (a typo would otherwise leave a setting silently unused).

Without TLS settings libpq's default stays: ``prefer``, TLS when the server offers it and no
verification (docs/operations.md says so). ``sslmode=require`` with a CA verifies the chain, as
libpq documents.
"""

from __future__ import annotations

import re
from typing import Any

from ...connections import Connection
from ..tls import config_error, existing_file, verification_failed

SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
FILES = ("sslrootcert", "sslcert", "sslkey", "sslcrl")
OTHER = ("sslmode", "sslcrldir", "sslsni", "sslcompression", "ssl_min_protocol_version",
         "ssl_max_protocol_version")
# libpq's words for a server certificate that does not verify (chain, or host name)
_UNVERIFIED = re.compile(r"certificate verify failed|does not match host name", re.I)


def libpq_tls(conn: Connection) -> dict[str, Any]:
    """libpq keyword arguments for the TLS the connection's extra asks for (see the module
    docstring); ``{}`` keeps libpq's default."""
    extra = conn.extra or {}
    ssl_keys = [k for k in extra if k.lower().startswith("ssl")]
    unknown = sorted(k for k in ssl_keys if k not in FILES + OTHER)
    if unknown:
        raise config_error(conn, ", ".join(unknown), f"not a TLS setting tidegate passes to libpq; "
                                                     f"it reads {', '.join(FILES + OTHER)}")
    kw: dict[str, Any] = {k: str(extra[k]) for k in ssl_keys if extra[k] not in (None, "")}
    for key in FILES:
        # "system": libpq 16+ takes the operating system's trusted CAs
        if key in kw and not (key == "sslrootcert" and kw[key] == "system"):
            existing_file(conn, key, kw[key])
    mode = kw.get("sslmode")
    if mode is not None and mode not in SSLMODES:
        raise config_error(conn, "sslmode", f"{mode!r} is not one of {', '.join(SSLMODES)}")
    if "sslrootcert" in kw:
        if mode is None:
            kw["sslmode"] = "verify-full"
        elif mode in ("disable", "allow", "prefer"):
            raise config_error(conn, "sslmode", f"{mode} ignores the CA in sslrootcert, so the server "
                                                f"would not be verified: use verify-full (or "
                                                f"verify-ca), or remove sslrootcert")
    return kw


def tls_failure(conn: Connection, exc: BaseException):
    """The :class:`~tidegate.errors.TlsVerificationError` a failed connect stands for, or None
    when it failed for another reason (libpq reports both in the error's text)."""
    text = str(exc)
    found = _UNVERIFIED.search(text)
    if found is None:
        return None
    line = next((ln for ln in text.splitlines() if _UNVERIFIED.search(ln)), found.group(0))
    return verification_failed(conn, line.strip())
