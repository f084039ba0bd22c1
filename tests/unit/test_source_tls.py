"""TLS settings of the sources, read from the connection's extra as Airflow's MySQL and Postgres
providers spell them (pure logic: what reaches PyMySQL and libpq), and the errors a wrong setting
or a certificate that does not verify becomes. The servers themselves: tests/integration/
test_tls_sources.py."""

from __future__ import annotations

import json
import ssl

import pymysql
import pytest
from tidegate.connections import Connection, get_connection
from tidegate.errors import ConnectionConfigError, TlsVerificationError
from tidegate.sources.mysql.tls import PyMySqlConnection, pymysql_tls
from tidegate.sources.mysql.tls import tls_failure as mysql_failure
from tidegate.sources.postgres.tls import libpq_tls
from tidegate.sources.postgres.tls import tls_failure as pg_failure

SECRET = "s3cret-pw"


@pytest.fixture()
def pem(tmp_path):
    """Three readable files standing in for a CA, a client certificate and its key."""
    files = {}
    for name in ("ca.pem", "client.pem", "client.key"):
        (tmp_path / name).write_text("-----BEGIN-----\n")
        files[name] = str(tmp_path / name)
    return files


def mysql_conn(extra: dict, host: str = "db.example") -> Connection:
    return Connection("src_db", "mysql", host=host, port=3306, login="cdc", password=SECRET, extra=extra)


def pg_conn(extra: dict, host: str = "db.example") -> Connection:
    return Connection("src_pg", "postgres", host=host, port=5432, login="cdc", password=SECRET,
                      extra=extra)


def config_error(make, extra) -> str:
    with pytest.raises(ConnectionConfigError) as info:
        make(extra)
    text = str(info.value)
    assert SECRET not in text
    return text


# --------------------------------------------------------------------------- MySQL


def test_mysql_without_tls_settings_keeps_pymysqls_default():
    assert pymysql_tls(mysql_conn({})) == {}
    assert pymysql_tls(mysql_conn({"charset": "utf8mb4"})) == {}


def test_mysql_ca_verifies_the_certificate_and_the_host_name_by_default(pem):
    kw = pymysql_tls(mysql_conn({"ssl": {"ca": pem["ca.pem"], "cert": pem["client.pem"],
                                         "key": pem["client.key"]}}))
    assert kw == {"ssl_ca": pem["ca.pem"], "ssl_cert": pem["client.pem"], "ssl_key": pem["client.key"],
                  "ssl_verify_cert": True, "ssl_verify_identity": True}


@pytest.mark.parametrize("extra", [
    {"ssl": {"ca": "CA", "check_hostname": False}},
    {"ssl": {"ca": "CA", "check_hostname": "false"}},  # a URI's query string carries text
    {"ssl": {"ca": "CA"}, "ssl_mode": "VERIFY_CA"},
    {"ssl": {"ca": "CA"}, "ssl_mode": "verify-ca"},
])
def test_mysql_host_name_check_can_be_turned_off_keeping_the_chain_check(pem, extra):
    extra = json.loads(json.dumps(extra).replace('"CA"', json.dumps(pem["ca.pem"])))
    kw = pymysql_tls(mysql_conn(extra))
    assert kw == {"ssl_ca": pem["ca.pem"], "ssl_verify_cert": True, "ssl_verify_identity": False}


def test_mysql_ssl_as_json_text_as_the_provider_accepts_it(pem):
    kw = pymysql_tls(mysql_conn({"ssl": json.dumps({"ca": pem["ca.pem"], "check_hostname": True})}))
    assert kw["ssl_ca"] == pem["ca.pem"] and kw["ssl_verify_identity"] is True


def test_mysql_ssl_from_an_airflow_uri(pem):
    uri = "mysql://cdc:pw@db.example:3306/shop?ssl=" + json.dumps({"ca": pem["ca.pem"]})
    conn = get_connection("src_db", {"AIRFLOW_CONN_SRC_DB": uri})
    assert pymysql_tls(conn)["ssl_ca"] == pem["ca.pem"]


def test_mysql_client_certificate_without_ca_encrypts_and_verifies_nothing(pem):
    kw = pymysql_tls(mysql_conn({"ssl": {"cert": pem["client.pem"], "key": pem["client.key"]}}))
    assert kw == {"ssl_cert": pem["client.pem"], "ssl_key": pem["client.key"]}


def test_mysql_ssl_modes_disabled_and_required():
    assert pymysql_tls(mysql_conn({"ssl_mode": "DISABLED"})) == {"ssl_disabled": True}
    assert pymysql_tls(mysql_conn({"ssl_mode": "REQUIRED"})) == {
        "ssl": {"check_hostname": False, "verify_mode": False}}


@pytest.mark.parametrize("extra, field, words", [
    ({"ssl": {"ca": "/nowhere/ca.pem"}}, "ssl.ca", "no file /nowhere/ca.pem"),
    ({"ssl": {"ca": "CA", "capath": "/etc/ssl"}}, "ssl", "unknown key(s) capath"),
    ({"ssl": "{not json"}, "ssl", "not a JSON object"),
    ({"ssl": ["CA"]}, "ssl", "must be an object"),
    ({"ssl_mode": "STRICT"}, "ssl_mode", "'STRICT' is not one of"),
    ({"ssl_mode": "VERIFY_IDENTITY"}, "ssl_mode", "needs the CA"),
    ({"ssl": {"check_hostname": True}}, "ssl.check_hostname", "needs the CA"),
    ({"ssl": {"ca": "CA"}, "ssl_mode": "DISABLED"}, "ssl_mode", "DISABLED contradicts"),
    ({"ssl": {"ca": "CA", "check_hostname": False}, "ssl_mode": "VERIFY_IDENTITY"},
     "ssl.check_hostname", "contradicts"),
    ({"ssl": {"ca": "CA", "check_hostname": "maybe"}}, "ssl.check_hostname", "not a boolean"),
])
def test_mysql_wrong_settings_name_the_connection_and_the_field(pem, extra, field, words):
    extra = json.loads(json.dumps(extra).replace('"CA"', json.dumps(pem["ca.pem"])))
    text = config_error(lambda e: pymysql_tls(mysql_conn(e)), extra)
    assert text.startswith(f"connection 'src_db': extra field {field}: "), text
    assert words in text, text


def test_mysql_certificate_verification_failures_become_the_named_error():
    conn = mysql_conn({})
    for message in ("self-signed certificate in certificate chain",
                    "IP address mismatch, certificate is not valid for '10.0.0.5'."):
        cause = ssl.SSLCertVerificationError(1, message)
        cause.verify_message = message
        exc = pymysql.err.OperationalError(2003, f"Can't connect to MySQL server on 'x' ({cause})")
        exc.original_exception = cause
        err = mysql_failure(conn, exc)
        assert isinstance(err, TlsVerificationError) and err.fatal
        assert str(err).startswith("connection 'src_db': the TLS certificate of the server at "
                                   "db.example:3306 does not verify (" + message)
        assert SECRET not in str(err)
    assert "ssl.ca" in str(mysql_failure(conn, _wrapped("self-signed certificate in certificate chain")))
    assert "check_hostname false" in str(mysql_failure(conn, _wrapped("Hostname mismatch, not valid")))
    # any other connect failure is not a TLS verification failure
    assert mysql_failure(conn, pymysql.err.OperationalError(1045, "Access denied")) is None
    refused = pymysql.err.OperationalError(2003, "Can't connect")
    refused.original_exception = ConnectionRefusedError(111, "Connection refused")
    assert mysql_failure(conn, refused) is None


def _wrapped(message: str) -> pymysql.err.OperationalError:
    cause = ssl.SSLCertVerificationError(1, message)
    cause.verify_message = message
    exc = pymysql.err.OperationalError(2003, "Can't connect")
    exc.original_exception = cause
    return exc


# --------------------------------------------------------------------------- PostgreSQL


def test_postgres_without_tls_settings_keeps_libpqs_default():
    assert libpq_tls(pg_conn({})) == {}
    assert libpq_tls(pg_conn({"sslmode": "require"})) == {"sslmode": "require"}


def test_postgres_settings_pass_to_libpq_as_spelled(pem):
    extra = {"sslmode": "verify-ca", "sslrootcert": pem["ca.pem"], "sslcert": pem["client.pem"],
             "sslkey": pem["client.key"], "cursor": "dictcursor"}
    assert libpq_tls(pg_conn(extra)) == {k: v for k, v in extra.items() if k != "cursor"}


def test_postgres_ca_without_sslmode_means_verify_full(pem):
    assert libpq_tls(pg_conn({"sslrootcert": pem["ca.pem"]})) == {
        "sslrootcert": pem["ca.pem"], "sslmode": "verify-full"}
    assert libpq_tls(pg_conn({"sslrootcert": "system"}))["sslmode"] == "verify-full"
    # an explicit mode that verifies stays as given (require with a CA: libpq checks the chain)
    for mode in ("require", "verify-ca", "verify-full"):
        assert libpq_tls(pg_conn({"sslrootcert": pem["ca.pem"], "sslmode": mode}))["sslmode"] == mode


@pytest.mark.parametrize("extra, field, words", [
    ({"sslrootcert": "/nowhere/ca.pem"}, "sslrootcert", "no file /nowhere/ca.pem"),
    ({"sslmode": "strict"}, "sslmode", "'strict' is not one of"),
    ({"sslmode": "prefer", "sslrootcert": "CA"}, "sslmode", "prefer ignores the CA"),
    ({"sslmode": "disable", "sslrootcert": "CA"}, "sslmode", "disable ignores the CA"),
    ({"sslrootcrt": "CA"}, "sslrootcrt", "not a TLS setting tidegate passes to libpq"),
    ({"sslpassword": "x"}, "sslpassword", "not a TLS setting"),
])
def test_postgres_wrong_settings_name_the_connection_and_the_field(pem, extra, field, words):
    extra = {k: (pem["ca.pem"] if v == "CA" else v) for k, v in extra.items()}
    text = config_error(lambda e: libpq_tls(pg_conn(e)), extra)
    assert text.startswith(f"connection 'src_pg': extra field {field}: "), text
    assert words in text, text


def test_postgres_certificate_verification_failures_become_the_named_error():
    conn = pg_conn({})
    chain = ('connection to server at "db.example" (10.0.0.5), port 5432 failed: SSL error: '
             'certificate verify failed\n')
    host = ('connection to server at "10.0.0.5", port 5432 failed: server certificate for "db.example" '
            'does not match host name "10.0.0.5"\n')
    for text, fix in ((chain, "sslrootcert"), (host, "sslmode verify-ca")):
        err = pg_failure(conn, Exception(text))
        assert isinstance(err, TlsVerificationError) and err.fatal
        assert str(err).startswith("connection 'src_pg': the TLS certificate of the server at "
                                   "db.example:5432 does not verify (" + text.strip() + ")")
        assert fix in str(err) and SECRET not in str(err)
    assert pg_failure(conn, Exception("FATAL:  connection requires a valid client certificate")) is None
    assert pg_failure(conn, Exception('password authentication failed for user "cdc"')) is None


def test_tls_verification_error_is_a_fatal_connection_error():
    err = TlsVerificationError("x")
    assert isinstance(err, ConnectionConfigError) and err.fatal


def test_mysql_connections_without_tls_settings_share_one_unverified_context():
    """PyMySQL's PREFERRED default (no TLS settings) verifies nothing: one context serves every
    connection of the process. Any setting (here ssl_mode REQUIRED's) still gets its own."""
    make = object.__new__(PyMySqlConnection)._create_ssl_ctx  # a connection not connected
    preferred = make({})
    assert make({}) is preferred
    assert preferred.verify_mode == ssl.CERT_NONE and preferred.check_hostname is False
    assert preferred.cert_store_stats()["x509_ca"] == 0  # the system CA store is never read
    required = pymysql_tls(mysql_conn({"ssl_mode": "REQUIRED"}))["ssl"]
    own = make(required)
    assert own is not preferred and make(required) is not own
