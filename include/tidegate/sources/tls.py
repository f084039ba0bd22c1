"""What the source kinds share about TLS: reading the connection's extra, checking the files it
names, and the error a certificate that does not verify becomes.

Each kind spells its settings as Airflow's provider for it does and turns them into its driver's
arguments itself (``mysql/tls.py``, ``postgres/tls.py``); every connection a source opens goes
through that one function, so the control connection, the log stream, the snapshot readers, the
reader process and the Spark tasks (which receive the :class:`~tidegate.connections.Connection`,
extra and all) connect alike. What the settings mean is in docs/operations.md, "TLS and
authentication".
"""

from __future__ import annotations

import os
import re
from typing import Any

from ..connections import Connection
from ..errors import ConnectionConfigError, TlsVerificationError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def config_error(conn: Connection, field: str, problem: str) -> ConnectionConfigError:
    """A wrong TLS setting: names the connection and the field of its extra."""
    return ConnectionConfigError(f"connection {conn.conn_id!r}: extra field {field}: {problem}")


def flag(conn: Connection, field: str, value: Any) -> bool:
    """A boolean of the extra: JSON true/false, or its text in a URI's query string."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise config_error(conn, field, f"{value!r} is not a boolean: use true or false")


def existing_file(conn: Connection, field: str, path: Any) -> str:
    """``path`` when it names a readable file; a clear error otherwise (the driver would report
    a missing CA as a failed connection, far from its cause). Checked where the connection is
    opened: a Spark executor needs the file at the same path as the Airflow worker."""
    if not isinstance(path, str) or not path:
        raise config_error(conn, field, f"{path!r} is not a file path")
    if not os.path.isfile(path):
        raise config_error(conn, field, f"no file {path} on this machine ({os.uname().nodename}): "
                                        f"every worker and Spark executor needs it at that path")
    if not os.access(path, os.R_OK):
        raise config_error(conn, field, f"{path} is not readable by this process")
    return path


def verification_failed(conn: Connection, reason: str) -> TlsVerificationError:
    """The error of a server certificate that does not verify (never retried); ``reason`` is
    the driver's, which tells a wrong host name from an unknown signer."""
    where = f"{conn.host}:{conn.port}" if conn.port else str(conn.host)
    if re.search(r"mismatch|does not match host name", reason, re.I):
        fix = (f"the certificate does not carry the connection's host {conn.host!r}: connect by a "
               f"name it carries, or (trusting the CA alone) turn the host-name check off "
               f"(MySQL: ssl.check_hostname false; PostgreSQL: sslmode verify-ca)")
    else:
        fix = ("the certificate is not signed by the CA the connection trusts: put the CA that "
               "signed the server's certificate in the extra (MySQL: ssl.ca; PostgreSQL: "
               "sslrootcert), or find out why the server presents another one")
    return TlsVerificationError(
        f"connection {conn.conn_id!r}: the TLS certificate of the server at {where} does not verify "
        f"({reason}); nothing was read or sent, and the run is not retried: {fix}")
