"""Every sink over TLS with a real login, against the *_tls servers of scripts/services: Kafka
SASL_SSL + SCRAM-SHA-512 (exactly-once, read back by a read_committed consumer over SASL_SSL),
Redis over TLS as an ACL user allowed only what the sink calls, NATS over TLS (client
certificate) as an nkey user. Each delivers through the coordinator (``run_once``, as the other
sink tests do) and is read back for exactly the events sent, in order, once. A connection that
trusts another CA, or names a host the server certificate does not carry, fails at once with a
non-retryable error naming the sink and the connection, and delivers nothing; so does a wrong
password, which never shows in the error.

The servers start once per session (``scripts/services up`` is idempotent); every test uses its
own pipeline, topic, stream and store."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nats
import pytest
import redis
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient
from test_sink_support import all_events, make_batches, pipeline_spec, source_items
from tidegate.connections import Connection, get_connection
from tidegate.coordinator import Coordinator
from tidegate.errors import CommitPolicyError
from tidegate.sinks import make_sink
from tidegate.sinks.kafka.spec import KafkaSinkSpec
from tidegate.sinks.nats.spec import NatsSinkSpec
from tidegate.sinks.redis.spec import RedisSinkSpec
from tidegate.spec import BatchSpec, SinkSpec
from tidegate.store import open_store

from tests.scripts import script_module

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
N_TX, ROWS, MAX_EVENTS = 6, 3, 6  # 6 transactions of 3 rows, 2 per sub-batch: 3 sub-batches
KINDS = ("kafka", "redis", "nats")
SERVICES = ("kafka_tls", "redis_tls", "nats_tls")
CA_SETTING = {"kafka": "ssl.ca.location", "redis": "ssl_ca_certs", "nats": "tls_ca"}


@pytest.fixture(scope="module")
def tls(service_env) -> dict[str, Connection]:
    """The three TLS sink servers, up; their sink and reader connections by name."""
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "services"), "up", *SERVICES],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"the TLS sink servers are not available (scripts/services up {' '.join(SERVICES)}):\n"
                    f"{r.stderr[-2000:]}", pytrace=False)
    ids = ("cdc_kafka_tls", "cdc_redis_tls", "cdc_redis_tls_admin", "cdc_nats_tls", "cdc_nats_tls_admin")
    return {i: get_connection(i, service_env) for i in ids}


def unique() -> str:
    return f"tls_{uuid.uuid4().hex[:10]}"  # the Redis ACL user may write tls_* keys only


def sink_spec(kind: str, name: str) -> SinkSpec:
    if kind == "kafka":
        return KafkaSinkSpec(id="events", kind="kafka", conn_id="cdc_kafka_tls",
                             topic=name + ".{schema}.{table}", exactly_once=True, partitions=1,
                             checkpoint_topic=f"_ckpt_{name}")
    if kind == "redis":
        return RedisSinkSpec(id="cache", kind="redis", conn_id="cdc_redis_tls",
                             stream="{pipeline}:{schema}.{table}")
    return NatsSinkSpec(id="bus", kind="nats", conn_id="cdc_nats_tls", stream=name.upper(),
                        subject="{pipeline}.{schema}.{table}")


def run(kind: str, name: str, conn: Connection, store_url: str, batches: list) -> tuple:
    """One run through the coordinator; (report, error, retry sleeps)."""
    spec = sink_spec(kind, name)
    sink = make_sink(pipeline_spec(name, spec), spec, conn)
    store = open_store(store_url)
    sleeps: list[float] = []
    try:
        epoch = store.leases.acquire(name, "run")
        co = Coordinator(store, name, "run", epoch, [sink], BatchSpec(max_events=MAX_EVENTS),
                         sleep=sleeps.append)
        error = None
        try:
            with co:
                co.run(source_items(batches, co.lowest_start()))
        except CommitPolicyError as exc:
            error = exc
        return co.report, error, sleeps, store.checkpoints.get(name, spec.id)
    finally:
        store.close()


def expected_keys(batches: list) -> list[str]:
    return [ev.idempotency_key for ev in all_events(batches)]


# --------------------------------------------------------------------------- readers


def kafka_read(conn: Connection, topic: str) -> list[tuple[str, bytes]] | None:
    """(idempotency key, value) of every committed record of a one-partition topic, as a
    read_committed consumer over the same SASL_SSL connection sees it; None: no such topic."""
    c = Consumer({**conn.extra, "group.id": "reader-" + uuid.uuid4().hex, "enable.auto.commit": False,
                  "isolation.level": "read_committed", "enable.partition.eof": True})
    try:
        md = c.list_topics(topic, timeout=10).topics.get(topic)
        if md is None or md.error is not None:
            return None
        assert list(md.partitions) == [0]
        c.assign([TopicPartition(topic, 0, 0)])
        out, deadline = [], time.monotonic() + 30
        while time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    return out
                raise AssertionError(m.error())
            out.append((dict(m.headers())["idempotency_key"].decode(), m.value()))
        raise AssertionError(f"did not reach the end of {topic}")
    finally:
        c.close()


def kafka_topics(conn: Connection) -> set[str]:
    return set(AdminClient(dict(conn.extra)).list_topics(timeout=10).topics)


def redis_client(conn: Connection) -> redis.Redis:
    x = conn.extra
    return redis.Redis(host=conn.host, port=conn.port, username=conn.login, password=conn.password, ssl=True,
                       ssl_ca_certs=x["ssl_ca_certs"])


def nats_read(conn: Connection, stream: str) -> list | None:
    """Every message of a JetStream stream in order (None: no such stream), over TLS with the
    client certificate, as the admin user."""
    x = conn.extra
    ctx = ssl.create_default_context(cafile=x["tls_ca"])
    ctx.load_cert_chain(x["tls_cert"], x["tls_key"])

    async def go():
        nc = await nats.connect(f"tls://{conn.host}:{conn.port}", user=conn.login, password=conn.password,
                                tls=ctx, allow_reconnect=False)
        try:
            js = nc.jetstream()
            try:
                info = await js.stream_info(stream)
            except nats.js.errors.NotFoundError:
                return None
            if not info.state.messages:
                return []
            return [await js.get_msg(stream, s) for s in range(info.state.first_seq, info.state.last_seq + 1)]
        finally:
            await nc.close()

    return asyncio.run(go())


def delivered(kind: str, tls: dict[str, Connection], name: str) -> list[str] | None:
    """The idempotency keys the sink's server holds for pipeline ``name``, in order (markers and
    checkpoint records left out); None when nothing of the pipeline exists there."""
    if kind == "kafka":
        records = kafka_read(tls["cdc_kafka_tls"], f"{name}.shop.orders")
        return None if records is None else [k for k, _ in records]
    if kind == "redis":
        r = redis_client(tls["cdc_redis_tls_admin"])
        try:
            if not r.exists(f"{name}:shop.orders"):
                return None
            return [f[b"idempotency_key"].decode() for _, f in r.xrange(f"{name}:shop.orders")]
        finally:
            r.close()
    msgs = nats_read(tls["cdc_nats_tls_admin"], name.upper())
    return None if msgs is None else [m.headers["Nats-Msg-Id"] for m in msgs
                                      if m.subject == f"{name}.shop.orders"]


# --------------------------------------------------------------------------- delivery


@pytest.mark.parametrize("kind", KINDS)
def test_each_sink_delivers_exactly_the_events_over_tls_with_a_real_login(kind, tls, tmp_path):
    name = unique()
    batches = make_batches(name, N_TX, ROWS, 1)
    url = f"sqlite:///{tmp_path}/ck.sqlite"
    report, error, sleeps, rec = run(kind, name, tls[f"cdc_{kind}_tls"], url, batches)
    assert error is None and sleeps == [], report.sinks
    assert rec.position == batches[-1].end_position
    keys = delivered(kind, tls, name)
    assert keys == expected_keys(batches), "not every event exactly once, in source order"

    # A second run with the same source range sends nothing again.
    _, error, _, rec = run(kind, name, tls[f"cdc_{kind}_tls"], url, batches)
    assert error is None and rec.position == batches[-1].end_position
    assert delivered(kind, tls, name) == keys


def test_kafka_exactly_once_over_sasl_ssl_values_and_the_checkpoint_record_read_back(tls, tmp_path):
    """The records' values are the envelopes, visible to read_committed readers only once
    committed; the sink's checkpoint record is read back over SASL_SSL by a fresh sink."""
    name = unique()
    batches = make_batches(name, N_TX, ROWS, 1)
    _, error, _, rec = run("kafka", name, tls["cdc_kafka_tls"], f"sqlite:///{tmp_path}/ck.sqlite", batches)
    assert error is None
    records = kafka_read(tls["cdc_kafka_tls"], f"{name}.shop.orders")
    assert [v for _, v in records] == [ev.value for ev in all_events(batches)]
    spec = sink_spec("kafka", name)
    fresh = make_sink(pipeline_spec(name, spec), spec, tls["cdc_kafka_tls"])
    try:
        fresh.open()
        ckpt = fresh.committed_checkpoint()
    finally:
        fresh.close()
    assert ckpt.position == batches[-1].end_position == rec.position


def test_redis_acl_user_may_do_what_the_sink_needs_and_nothing_else(tls, tmp_path):
    name = unique()
    batches = make_batches(name, 2, 2, 1)
    _, error, _, _ = run("redis", name, tls["cdc_redis_tls"], f"sqlite:///{tmp_path}/ck.sqlite", batches)
    assert error is None
    r = redis_client(tls["cdc_redis_tls"])
    try:
        for refused in (lambda: r.keys("*"), lambda: r.xrange(f"{name}:shop.orders"),
                        lambda: r.set("other:key", "x"), lambda: r.flushall()):
            with pytest.raises(redis.exceptions.NoPermissionError):
                refused()
    finally:
        r.close()


# --------------------------------------------------------------------------- refused


def _with(conn: Connection, **changes) -> Connection:
    return Connection(**{**conn.__dict__, **changes})


def wrong_ca(kind: str, conn: Connection) -> Connection:
    key = CA_SETTING[kind]
    return _with(conn, extra={**conn.extra, key: conn.extra[key].replace("/ca.crt", "/other-ca.crt")})


def wrong_host(kind: str, conn: Connection) -> Connection:
    """127.0.0.1: the server's certificate names only localhost."""
    if kind == "kafka":
        return _with(conn, extra={**conn.extra, "bootstrap.servers":
                                  conn.extra["bootstrap.servers"].replace("localhost", "127.0.0.1")})
    return _with(conn, host="127.0.0.1")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mistake", ["other_ca", "host_not_in_certificate"])
def test_a_server_certificate_that_fails_verification_stops_the_sink_and_delivers_nothing(kind, mistake, tls,
                                                                                         tmp_path):
    name = unique()
    conn = tls[f"cdc_{kind}_tls"]
    bad = wrong_ca(kind, conn) if mistake == "other_ca" else wrong_host(kind, conn)
    t0 = time.monotonic()
    report, error, sleeps, rec = run(kind, name, bad, f"sqlite:///{tmp_path}/ck.sqlite",
                                     make_batches(name, 2, 2, 1))
    assert time.monotonic() - t0 < 15, "a refused certificate must fail at once, not time out"
    assert error is not None and rec is None, "no checkpoint may move"
    rep = report.sinks[sink_spec(kind, name).id]
    assert rep.error_class == "non_retryable" and sleeps == [], "retried a refused certificate"
    assert "TLS verification of the server failed" in rep.error
    assert f"sink {rep.sink_id!r}" in rep.error and f"{conn.conn_id!r}" in rep.error
    assert "host name the certificate carries" in rep.error
    assert delivered(kind, tls, name) is None, "something reached the server"


def wrong_password(kind: str, conn: Connection, tmp_path: Path) -> tuple[Connection, str]:
    secret = "Wr0ng-" + uuid.uuid4().hex
    if kind == "kafka":
        return _with(conn, extra={**conn.extra, "sasl.password": secret}), secret
    if kind == "redis":
        return _with(conn, password=secret), secret
    # NATS: an nkey the server does not know (its seed is the secret; nats-py reads it from the file)
    seed = tmp_path / "stranger.nk"
    services_module().nkey_user(seed)
    return _with(conn, extra={**conn.extra, "nkeys_seed": str(seed)}), seed.read_text().strip()


def services_module():
    """scripts/services as a module (its nkey maker)."""
    return script_module("services")


@pytest.mark.parametrize("kind", KINDS)
def test_a_wrong_password_fails_clearly_without_the_password_and_delivers_nothing(kind, tls, tmp_path,
                                                                                  caplog):
    caplog.set_level(logging.DEBUG)
    name = unique()
    bad, secret = wrong_password(kind, tls[f"cdc_{kind}_tls"], tmp_path)
    report, error, sleeps, rec = run(kind, name, bad, f"sqlite:///{tmp_path}/ck.sqlite",
                                     make_batches(name, 2, 2, 1))
    assert error is not None and rec is None
    rep = report.sinks[sink_spec(kind, name).id]
    assert rep.error_class == "non_retryable" and sleeps == []
    assert "authentication failed" in rep.error.lower() or "authorization" in rep.error.lower(), rep.error
    assert f"cdc_{kind}_tls" in rep.error
    for text in (rep.error, str(error), repr(error), json.dumps(rep.__dict__, default=str)):
        assert secret not in text, "the secret reached an error"
    assert secret not in caplog.text, "the secret reached the log"
    assert delivered(kind, tls, name) is None
