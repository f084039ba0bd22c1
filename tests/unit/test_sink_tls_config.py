"""TLS and authentication settings of the sinks, without servers: what each client is handed from
the connection, how a refused server certificate is told from a network fault, and the NATS
nkey that scripts/services makes. The live proofs are in tests/integration/test_tls_sinks.py."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import ssl
import subprocess
from pathlib import Path

import nkeys
import pytest
import redis.exceptions as rex
from confluent_kafka import KafkaError, KafkaException
from tidegate.connections import Connection
from tidegate.errors import ErrorClass, NonRetryableSinkError
from tidegate.sinks._common import tls_verification_failed
from tidegate.sinks.kafka.sink import KafkaSink
from tidegate.sinks.kafka.spec import KafkaSinkSpec
from tidegate.sinks.nats.client import classify_nats_error
from tidegate.sinks.nats.sink import NatsSink
from tidegate.sinks.nats.spec import NatsSinkSpec
from tidegate.sinks.redis.sink import RedisSink
from tidegate.sinks.redis.spec import RedisSinkSpec
from tidegate.spec import PipelineSpec, SinkSpec, SourceSpec

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "Scr4m-s3cret-pw"
KAFKA = KafkaSinkSpec(id="events", kind="kafka", conn_id="cdc_kafka_tls", topic="{pipeline}.{schema}.{table}",
                      exactly_once=True)
NATS = NatsSinkSpec(id="bus", kind="nats", conn_id="cdc_nats_tls", stream="CDC",
                    subject="{pipeline}.{schema}.{table}")
REDIS = RedisSinkSpec(id="cache", kind="redis", conn_id="cdc_redis_tls", stream="{pipeline}:{schema}.{table}")
SECURITY = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "tidegate",
            "sasl.password": PASSWORD, "ssl.ca.location": "/tls/ca.crt",
            "ssl.endpoint.identification.algorithm": "https"}


def spec_for(sink: SinkSpec) -> PipelineSpec:
    return PipelineSpec(pipeline="orders", source=SourceSpec("mysql", "db"), sinks=(sink,))


def kafka_sink(exactly_once: bool = True) -> KafkaSink:
    spec = KafkaSinkSpec(**{**KAFKA.__dict__, "exactly_once": exactly_once})
    conn = Connection("cdc_kafka_tls", "kafka", extra={"bootstrap.servers": "localhost:9093", **SECURITY})
    return KafkaSink(spec_for(spec), spec, conn)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """A self-signed certificate and key (only for loading into an SSL context)."""
    d = tmp_path_factory.mktemp("certs")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=localhost", "-keyout", str(d / "c.key"), "-out", str(d / "c.crt")],
                   check=True, capture_output=True)
    return d


# --------------------------------------------------------------------------- Kafka


@pytest.mark.parametrize("exactly_once", [True, False])
def test_kafka_every_client_gets_the_connections_security_settings(exactly_once):
    """The producer (transactional or idempotent), the admin client and the consumer that reads
    the checkpoint topic back all connect with SASL_SSL, SCRAM and the CA from the extra."""
    sink = kafka_sink(exactly_once)
    configs = {"producer": sink.settings.producer(), "admin": sink.settings.admin(),
               "checkpoint reader": sink.settings.reader()}
    for what, cfg in configs.items():
        assert {k: cfg.get(k) for k in SECURITY} == SECURITY, what
        assert cfg["bootstrap.servers"] == "localhost:9093", what
        assert callable(cfg["error_cb"]), f"{what}: a refused certificate or login must be seen"
    assert configs["checkpoint reader"]["isolation.level"] == "read_committed"
    assert ("transactional.id" in configs["producer"]) is exactly_once
    assert not any("transactional.id" in configs[w] for w in ("admin", "checkpoint reader"))


def test_kafka_login_and_password_fields_become_sasl_settings_the_extra_can_refine():
    conn = Connection("k", "kafka", host="localhost", port=9093, login="tidegate", password=PASSWORD,
                      extra={"sasl.mechanism": "SCRAM-SHA-256", "ssl.ca.location": "/tls/ca.crt"})
    cfg = KafkaSink(spec_for(KAFKA), KAFKA, conn).settings.producer()
    assert cfg["bootstrap.servers"] == "localhost:9093"
    assert (cfg["sasl.username"], cfg["sasl.password"]) == ("tidegate", PASSWORD)
    assert cfg["sasl.mechanism"] == "SCRAM-SHA-256" and cfg["security.protocol"] == "SASL_SSL"


def test_kafka_password_never_in_an_error_or_in_the_connection_text():
    sink = kafka_sink()
    err = sink.error(KafkaException(KafkaError(KafkaError._AUTHENTICATION, f"login with {PASSWORD} refused")),
                     "opening")
    assert isinstance(err, NonRetryableSinkError)
    assert PASSWORD not in str(err) and PASSWORD not in repr(err) and "***" in str(err)
    assert "cdc_kafka_tls" in str(err), "the message names the connection to fix"
    assert PASSWORD not in str(sink.conn) and PASSWORD not in repr(sink.conn)


def test_kafka_refused_certificate_is_not_retried_and_names_sink_and_connection():
    sink = kafka_sink()
    text = ("sasl_ssl://127.0.0.1:9093/bootstrap: SSL handshake failed: error:0A000086:SSL routines::"
            "certificate verify failed: broker certificate could not be verified")
    err = sink.error(KafkaException(KafkaError(KafkaError._SSL, text)), "talking to the brokers")
    assert err.error_class is ErrorClass.NON_RETRYABLE
    msg = str(err)
    assert "TLS verification" in msg and "'events'" in msg and "'cdc_kafka_tls'" in msg and "host name" in msg


# --------------------------------------------------------------------------- telling TLS failures apart


def _wrapped(inner: BaseException, outer: type[BaseException], text: str) -> BaseException:
    """``outer`` raised while handling ``inner``, as redis-py wraps a handshake failure."""
    try:
        try:
            raise inner
        except BaseException:
            raise outer(text)  # noqa: B904 - the implicit context is the point
    except BaseException as exc:  # noqa: BLE001
        return exc


def test_tls_verification_failures_are_told_from_network_faults():
    verify = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
                                             "IP address mismatch")
    assert tls_verification_failed(verify)
    assert tls_verification_failed(_wrapped(verify, rex.ConnectionError, "Error 1 connecting"))
    assert tls_verification_failed(KafkaException(KafkaError(KafkaError._SSL, "certificate verify failed")))
    assert not tls_verification_failed(ConnectionRefusedError(111, "Connection refused"))
    assert not tls_verification_failed(_wrapped(ConnectionRefusedError(), rex.ConnectionError, "Error 111"))
    assert classify_nats_error(verify) is ErrorClass.NON_RETRYABLE  # an OSError, yet not retried
    assert classify_nats_error(ConnectionRefusedError()) is ErrorClass.RETRYABLE


@pytest.mark.parametrize("kind", ["redis", "nats"])
def test_a_refused_certificate_is_non_retryable_for_every_sink(kind):
    conn_id = f"cdc_{kind}_tls"
    conn = Connection(conn_id, kind, host="127.0.0.1", port=1, login="u", password=PASSWORD)
    sink = (RedisSink(spec_for(REDIS), REDIS, conn) if kind == "redis"
            else NatsSink(spec_for(NATS), NATS, conn))
    exc = _wrapped(ssl.SSLCertVerificationError(1, "certificate verify failed: unable to get local issuer "
                                                   "certificate"), ConnectionError, "Error 1 connecting")
    assert sink.classify(exc) is ErrorClass.NON_RETRYABLE
    err = sink.error(exc, "connecting")
    assert err.error_class is ErrorClass.NON_RETRYABLE
    assert repr(sink.sink_id) in str(err) and repr(conn_id) in str(err) and PASSWORD not in str(err)


# --------------------------------------------------------------------------- NATS and Redis


def test_nats_tls_context_verifies_the_server_and_carries_the_client_certificate(certs):
    conn = Connection("cdc_nats_tls", "nats", host="localhost", port=4223, extra={
        "tls": True, "tls_ca": str(certs / "c.crt"), "tls_cert": str(certs / "c.crt"),
        "tls_key": str(certs / "c.key"), "nkeys_seed": "/secrets/tidegate.nk"})
    opts = NatsSink(spec_for(NATS), NATS, conn).client.options()
    assert opts["servers"] == ["tls://localhost:4223"]
    ctx = opts["tls"]
    assert ctx.verify_mode is ssl.CERT_REQUIRED and ctx.check_hostname is True
    assert opts["nkeys_seed"] == "/secrets/tidegate.nk"
    assert "user" not in opts and "password" not in opts and "token" not in opts


def test_redis_tls_extras_as_airflows_redis_provider_spells_them():
    conn = Connection("cdc_redis_tls", "redis", host="localhost", port=6380, login="tidegate_sink",
                      password=PASSWORD, extra={"ssl": "true", "ssl_ca_certs": "/tls/ca.crt",
                                                "ssl_certfile": "/tls/c.crt", "ssl_keyfile": "/tls/c.key",
                                                "ssl_cert_reqs": "required", "ssl_check_hostname": "false"})
    kw = RedisSink(spec_for(REDIS), REDIS, conn).client_kwargs()
    assert kw["ssl"] is True and kw["ssl_ca_certs"] == "/tls/ca.crt" and kw["ssl_cert_reqs"] == "required"
    assert (kw["ssl_certfile"], kw["ssl_keyfile"]) == ("/tls/c.crt", "/tls/c.key")
    assert kw["ssl_check_hostname"] is False
    assert (kw["username"], kw["password"]) == ("tidegate_sink", PASSWORD)
    rediss = Connection("r", "rediss", host="localhost", port=6380)
    assert RedisSink(spec_for(REDIS), REDIS, rediss).client_kwargs()["ssl"] is True


def test_the_nkey_scripts_services_makes_is_one_nats_py_can_sign_with(tmp_path):
    loader = importlib.machinery.SourceFileLoader("tidegate_services", str(ROOT / "scripts" / "services"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    services = importlib.util.module_from_spec(spec)
    loader.exec_module(services)
    seed_file = tmp_path / "user.nk"
    public = services.nkey_user(seed_file)
    assert public.startswith("U") and len(public) == 56
    assert seed_file.stat().st_mode & 0o077 == 0, "the seed is a secret: mode 600"
    kp = nkeys.from_seed(bytearray(seed_file.read_bytes().strip()))
    assert kp.public_key.decode() == public
    assert services.nkey_user(seed_file) == public, "made once, kept"
