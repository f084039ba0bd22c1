"""Poison events against the real servers: one event a sink cannot take on its own (a row over
the topic's max.message.bytes, over NATS max_payload, bound for a stream the ACL forbids).
With ``on_poison: halt`` the run fails naming it and nothing of its sub-batch is visible; with
``dlq`` every other row is delivered once, the DLQ holds one record naming the error, and the
checkpoint moves past the row."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid

import pytest
import redis
from confluent_kafka.admin import AdminClient, NewTopic
from test_sink_support import end_pos, make_tx, pipeline_spec, source_items
from tidegate.batching import SubBatch
from tidegate.coordinator import run_once
from tidegate.debezium.envelope import DebeziumOptions
from tidegate.errors import CommitPolicyError
from tidegate.sinks import make_sink
from tidegate.sinks.kafka.spec import KafkaSinkSpec
from tidegate.sinks.nats.spec import NatsSinkSpec
from tidegate.sinks.redis.spec import RedisSinkSpec
from tidegate.spec import BatchSpec
from tidegate.store import open_store

from tests.integration.test_sink_kafka import read_topic

pytestmark = pytest.mark.integration

ROWS = 1000  # in one sub-batch: 100 transactions of 10 rows


def batch_with_one_big_row(pipeline: str, *at: int, rows: tuple[int, ...] = (9,),
                           pad: int = 2 * 1024 * 1024) -> SubBatch:
    """1,000 rows in 100 transactions of 10; the last row (or the ``rows``) of each transaction
    ``at`` (default: the very last row) carries an incompressible pad of ``pad`` characters
    (~2 MiB: larger than a 1 MiB topic or NATS max_payload accepts)."""
    txs = [make_tx(pipeline, n, 10, keys=1000) for n in range(1, 101)]
    for tx in at or (100,):
        big = make_tx(pipeline, tx, 10, keys=1000, pad=pad, noise=True)
        events = txs[tx - 1].events
        txs[tx - 1] = dataclasses.replace(txs[tx - 1], events=tuple(
            big.events[i] if i in rows else ev for i, ev in enumerate(events)))
    return SubBatch(1, tuple(txs))


# Sub-batches of ROWS events hold the whole batch in memory; of 4, every transaction (10 rows) is
# past the limit and read back from disk, frame by frame (tidegate/spill.py).
SUB_BATCHES = pytest.mark.parametrize("max_events", [ROWS, 4], ids=["in_memory", "spilled"])


def run(store_url: str, name: str, sink_spec, batch: SubBatch, max_events: int = ROWS):
    store = open_store(store_url)
    try:
        sink = make_sink(pipeline_spec(name, sink_spec), sink_spec, connection(sink_spec.conn_id))
        report = run_once(store, name, "r1", [sink], BatchSpec(max_events=max_events),
                          lambda start: source_items([batch], start))
        return report, store.checkpoints.get(name, sink_spec.id)
    finally:
        store.close()


def connection(conn_id: str):
    from tidegate.connections import get_connection

    return get_connection(conn_id)


def big_event(batch: SubBatch):
    return max(batch.events, key=lambda ev: len(ev.value))


def big_key(batch: SubBatch) -> str:
    return big_event(batch).idempotency_key


# --------------------------------------------------------------------------- Kafka


@pytest.fixture()
def small_topic(kafka, kafka_bootstrap):
    """A topic whose max.message.bytes is 1 MiB (the broker allows 2 MiB)."""
    name = f"kp_{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    fut = admin.create_topics([NewTopic(f"{name}.orders", 3, 1, config={"max.message.bytes": "1048576"})])
    fut[f"{name}.orders"].result(30)
    return name


@pytest.mark.parametrize("eos", [True, False], ids=["exactly_once", "idempotent"])
def test_kafka_halt_names_the_row_and_shows_nothing_of_the_sub_batch(small_topic, kafka_bootstrap, tmp_path,
                                                                     eos):
    name = small_topic
    spec = KafkaSinkSpec(id="events", kind="kafka", conn_id="cdc_kafka", topic="{pipeline}.{table}",
                         exactly_once=eos, checkpoint_topic=f"_ck_{name}")
    batch = batch_with_one_big_row(name)
    with pytest.raises(CommitPolicyError) as err:
        run(f"sqlite:///{tmp_path}/s.sqlite", name, spec, batch)
    text = str(err.value)
    assert big_key(batch) in text and "at {'file': 'mysql-bin.000007'" in text and "on_poison is halt" in text
    assert err.value.fatal  # the same row fails the same way on every retry
    if eos:  # nothing of the sub-batch is visible to a read_committed consumer
        assert read_topic(kafka_bootstrap, f"{name}.orders") == []
    assert open_store(f"sqlite:///{tmp_path}/s.sqlite").checkpoints.get(name, "events") is None


# The big row last, or in the middle: then rows follow it on every partition of its transaction,
# whose commit waited for them (they fail on their sequence numbers and are retried) until the
# broker aborted the transaction at transaction.timeout.ms (campaign POISON=dlq, seed 6101).
BIG_ROW_AT = pytest.mark.parametrize("big_at", [100, 50], ids=["last_row", "middle_row"])


@SUB_BATCHES
@BIG_ROW_AT
@pytest.mark.parametrize("eos", [True, False], ids=["exactly_once", "idempotent"])
def test_kafka_dlq_delivers_the_rest_once_and_dead_letters_the_row(small_topic, kafka_bootstrap, tmp_path,
                                                                    eos, max_events, big_at):
    name = small_topic
    spec = KafkaSinkSpec(id="events", kind="kafka", conn_id="cdc_kafka", topic="{pipeline}.{table}",
                         exactly_once=eos, checkpoint_topic=f"_ck_{name}", on_poison="dlq")
    batch = batch_with_one_big_row(name, big_at)
    report, ckpt = run(f"sqlite:///{tmp_path}/s.sqlite", name, spec, batch, max_events)
    assert report.spilled == (100 if max_events < 10 else 0)
    rows = read_topic(kafka_bootstrap, f"{name}.orders")
    keys = [dict(m.headers())["idempotency_key"].decode() for m in rows]
    assert len(keys) == len(set(keys)) == ROWS - 1 and big_key(batch) not in keys
    # per partition, in the source's order
    order = {ev.idempotency_key: n for n, ev in enumerate(batch.events)}
    for part in {m.partition() for m in rows}:
        got = [order[dict(m.headers())["idempotency_key"].decode()] for m in rows if m.partition() == part]
        assert got == sorted(got)
    [dead] = read_topic(kafka_bootstrap, f"{name}.__dlq")
    record = json.loads(dead.value())
    assert record["idempotency_key"] == big_key(batch) and record["sink"] == "events"
    assert "MSG_SIZE_TOO_LARGE" in record["error"] and record["error_class"] == "non_retryable"
    assert record["event_size"] > 2 * 1024 * 1024 and len(record["event"]) == 64 * 1024
    assert record["position"] == big_event(batch).position
    assert ckpt.position == end_pos(100)  # past the row
    assert report.sinks["events"].dlq == 1


@SUB_BATCHES
@pytest.mark.parametrize("eos", [True, False], ids=["exactly_once", "idempotent"])
def test_kafka_dlq_dead_letters_every_big_row_of_a_sub_batch(small_topic, kafka_bootstrap, tmp_path, eos,
                                                             max_events):
    """An exactly-once transaction ends at its first refused message, so the sub-batch is sent
    again once per big row not yet known (campaign POISON=dlq, seed 6103: with two in one
    sub-batch, the second refusal failed the run, on every attempt)."""
    name = small_topic
    spec = KafkaSinkSpec(id="events", kind="kafka", conn_id="cdc_kafka", topic="{pipeline}.{table}",
                         exactly_once=eos, checkpoint_topic=f"_ck_{name}", on_poison="dlq")
    batch = batch_with_one_big_row(name, 50, rows=(3, 5, 7))
    big = [ev for ev in batch.events if len(ev.value) > 1024 * 1024]
    report, ckpt = run(f"sqlite:///{tmp_path}/s.sqlite", name, spec, batch, max_events)
    rows = read_topic(kafka_bootstrap, f"{name}.orders")
    keys = [dict(m.headers())["idempotency_key"].decode() for m in rows]
    assert len(big) == 3 and len(keys) == len(set(keys)) == ROWS - 3
    assert not {ev.idempotency_key for ev in big} & set(keys)
    dead = [json.loads(m.value()) for m in read_topic(kafka_bootstrap, f"{name}.__dlq")]
    assert sorted(r["idempotency_key"] for r in dead) == sorted(ev.idempotency_key for ev in big)
    assert ckpt.position == end_pos(100) and report.sinks["events"].dlq == 3


@SUB_BATCHES
@pytest.mark.parametrize("eos", [True, False], ids=["exactly_once", "idempotent"])
def test_kafka_dlq_in_debezium_envelope(small_topic, kafka_bootstrap, tmp_path, eos, max_events):
    """Debezium's records are not the event's bytes, so a refusal is matched to its event by the
    record's own delivery callback (campaign ENVELOPE=debezium POISON=dlq, seed 6180: the refused
    record matched no event, and every run failed on it). The dead-lettered rows leave their
    transaction's counts, and the last of them still closes it: its END is written."""
    name = small_topic
    spec = KafkaSinkSpec(id="events", kind="kafka", conn_id="cdc_kafka", topic="{pipeline}.{table}",
                         exactly_once=eos, checkpoint_topic=f"_ck_{name}", on_poison="dlq",
                         envelope="debezium", debezium=DebeziumOptions(transaction_metadata=True))
    batch = batch_with_one_big_row(name, 50, rows=(3, 9))  # row 9 ends its transaction
    big = [ev for ev in batch.events if len(ev.value) > 1024 * 1024]
    report, ckpt = run(f"sqlite:///{tmp_path}/s.sqlite", name, spec, batch, max_events)
    changes = [json.loads(m.value()) for m in read_topic(kafka_bootstrap, f"{name}.orders") if m.value()]
    ids = [(c["transaction"]["id"], c["transaction"]["total_order"]) for c in changes]
    assert len(big) == 2 and len(ids) == len(set(ids)) == ROWS - 2
    assert sorted(c["after"]["seq"] for c in changes) == sorted(
        ev.after["seq"] for ev in batch.events if ev not in big)
    dead = [json.loads(m.value()) for m in read_topic(kafka_bootstrap, f"{name}.__dlq")]
    assert sorted(r["idempotency_key"] for r in dead) == sorted(ev.idempotency_key for ev in big)
    marks = [json.loads(m.value()) for m in read_topic(kafka_bootstrap, f"{name}.transaction")]
    ends = {m["id"]: m["event_count"] for m in marks if m["status"] == "END"}
    assert sorted(m["status"] for m in marks).count("BEGIN") == len(ends) == 100
    # Exactly-once: the transaction is sent again without them, and its END counts what the data
    # topic holds. Idempotent: the records are out before the broker refuses one, the END with
    # them, so it counts the dead-lettered rows too (docs/architecture.md, "Poison events and dead
    # letters").
    assert ends["0-1-50"] == (8 if eos else 10) and all(n == 10 for tx, n in ends.items() if tx != "0-1-50")
    assert ckpt.position == end_pos(100) and report.sinks["events"].dlq == 2


@pytest.mark.parametrize("envelope", ["tidegate", "debezium"])
@pytest.mark.parametrize("eos", [True, False], ids=["exactly_once", "idempotent"])
def test_kafka_dlq_takes_a_row_the_client_itself_refuses(small_topic, kafka_bootstrap, tmp_path, eos,
                                                         envelope):
    """A row over the producer's own message.max.bytes (16 MiB) is refused by ``produce()``, before
    any broker sees it, not by a delivery report: it was not dead-lettered, and every run failed
    on it. Now it is poison like a row the broker refuses: the rows after it in its transaction
    (there are some on every partition) are delivered once, it is dead-lettered."""
    name = small_topic
    debezium = {"envelope": "debezium", "debezium": DebeziumOptions(transaction_metadata=True)}
    spec = KafkaSinkSpec(id="events", kind="kafka", conn_id="cdc_kafka", topic="{pipeline}.{table}",
                         exactly_once=eos, checkpoint_topic=f"_ck_{name}", on_poison="dlq",
                         **(debezium if envelope == "debezium" else {}))
    batch = batch_with_one_big_row(name, 50, rows=(4,), pad=17 * 1024 * 1024)
    [big] = [ev for ev in batch.events if len(ev.value) > 16 * 1024 * 1024]
    report, ckpt = run(f"sqlite:///{tmp_path}/s.sqlite", name, spec, batch)
    rows = [m for m in read_topic(kafka_bootstrap, f"{name}.orders") if m.value()]
    seqs = sorted(json.loads(m.value())["after"]["seq"] for m in rows)
    assert seqs == sorted(ev.after["seq"] for ev in batch.events if ev is not big)
    [dead] = [json.loads(m.value()) for m in read_topic(kafka_bootstrap, f"{name}.__dlq")]
    assert dead["idempotency_key"] == big.idempotency_key and "MSG_SIZE_TOO_LARGE" in dead["error"]
    assert dead["event_size"] == len(big.value) and dead["position"] == big.position
    assert ckpt.position == end_pos(100) and report.sinks["events"].dlq == 1


# --------------------------------------------------------------------------- NATS


def nats_messages(conn, stream: str, subject: str) -> list:
    import nats

    async def go():
        nc = await nats.connect(f"nats://127.0.0.1:{conn.port}", user=conn.login, password=conn.password)
        try:
            js = nc.jetstream()
            info = await js.stream_info(stream)
            out = []
            if not info.state.messages:
                return out
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                m = await js.get_msg(stream, seq)
                if m.subject == subject:
                    out.append(m)
            return out
        finally:
            await nc.close()

    return asyncio.run(go())


@pytest.mark.parametrize(("policy", "max_events"), [("halt", ROWS), ("dlq", ROWS), ("dlq", 4)],
                         ids=["halt", "dlq", "dlq-spilled"])
def test_nats_payload_over_max_payload_is_poison(nats_service, tmp_path, policy, max_events):
    name = f"np_{uuid.uuid4().hex[:8]}"
    stream = name.upper()
    spec = NatsSinkSpec(id="bus", kind="nats", conn_id="cdc_nats", stream=stream,
                        subject="{pipeline}.{table}", on_poison=policy)
    batch = batch_with_one_big_row(name)
    if policy == "halt":
        with pytest.raises(CommitPolicyError, match=big_key(batch)) as err:
            run(f"sqlite:///{tmp_path}/s.sqlite", name, spec, batch)
        assert "max_payload" in str(err.value)
        assert nats_messages(nats_service.cdc, stream, f"{name}.orders") == []  # nothing published
        return
    report, ckpt = run(f"sqlite:///{tmp_path}/s.sqlite", name, spec, batch, max_events)
    assert report.spilled == (100 if max_events < 10 else 0)
    data = nats_messages(nats_service.cdc, stream, f"{name}.orders")
    ids = [m.headers["Nats-Msg-Id"] for m in data]
    assert len(ids) == len(set(ids)) == ROWS - 1 and big_key(batch) not in ids
    [dead] = nats_messages(nats_service.cdc, stream, f"{name}.__dlq")
    record = json.loads(dead.data)
    assert record["idempotency_key"] == big_key(batch) and "max_payload" in record["error"]
    assert ckpt.position == end_pos(100) and report.sinks["bus"].dlq == 1


# --------------------------------------------------------------------------- Redis


@pytest.fixture()
def restricted_redis(redis_service):
    """A Redis ACL user that may write the pipeline's streams and checkpoints but only read
    ``forbidden:*``."""
    conn = redis_service.cdc
    admin = redis.Redis(host="127.0.0.1", port=conn.port, username=conn.login, password=conn.password)
    user, password = f"poison_{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    admin.execute_command("ACL", "SETUSER", user, "on", f">{password}", "+@all", "%RW~pz*",
                          "%RW~tidegate:*", "%R~forbidden*")
    yield dataclasses.replace(conn, conn_id="restricted", login=user, password=password)
    admin.acl_deluser(user)
    admin.close()


@pytest.mark.parametrize("policy", ["halt", "dlq"])
def test_redis_stream_the_acl_forbids_is_poison(redis_service, restricted_redis, tmp_path, monkeypatch,
                                                policy):
    name = f"pz_{uuid.uuid4().hex[:8]}"
    spec = RedisSinkSpec(id="cache", kind="redis", conn_id="restricted", stream="{schema}:{table}",
                         on_poison=policy)
    ok = [make_tx(name, n, 10, keys=1000, schema="pz", table=name) for n in range(1, 100) if n != 50]
    bad = make_tx(name, 50, 1, schema="forbidden", table="secret")
    batch = SubBatch(1, (*ok[:49], bad, *ok[49:]))
    # the sink's connection "restricted" is the ACL user, defined as any connection is
    monkeypatch.setenv("AIRFLOW_CONN_RESTRICTED", json.dumps(dataclasses.asdict(restricted_redis)))
    r = redis.Redis(host="127.0.0.1", port=restricted_redis.port, username=redis_service.cdc.login,
                    password=redis_service.cdc.password)
    bad_key = list(bad.events)[0].idempotency_key
    if policy == "halt":
        with pytest.raises(CommitPolicyError, match=bad_key) as err:
            run(f"sqlite:///{tmp_path}/s.sqlite", name, spec, batch)
        assert "may not write stream 'forbidden:secret'" in str(err.value)
        assert r.xlen(f"pz:{name}") == 0  # nothing of the sub-batch
        return
    report, ckpt = run(f"sqlite:///{tmp_path}/s.sqlite", name, spec, batch)
    ids = [f[b"idempotency_key"].decode() for _, f in r.xrange(f"pz:{name}")]
    assert len(ids) == len(set(ids)) == 980 and bad_key not in ids
    [(_, dead)] = r.xrange(f"{name}:__dlq")
    record = json.loads(dead[b"record"])
    assert record["idempotency_key"] == bad_key and "forbidden:secret" in record["error"]
    assert record["event"]["after"]["id"] == json.loads(list(bad.events)[0].value)["after"]["id"]
    assert ckpt.position == end_pos(99) and report.sinks["cache"].dlq == 1
    r.close()
