"""Kafka sink against the real KRaft broker: exactly-once across SIGKILLs, zombie fencing,
idempotent mode, topic creation and error classes (docs/architecture.md, "Guarantees")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource
from test_sink_support import (
    all_events,
    make_batches,
    pipeline_spec,
    seq_of,
    source_items,
    unique,
)
from tidegate.connections import Connection
from tidegate.coordinator import Coordinator, run_once
from tidegate.errors import (
    ErrorClass,
    FatalRunError,
    FatalSinkError,
    NonRetryableSinkError,
    RetryableSinkError,
)
from tidegate.sink_checkpoints import SinkCheckpoint
from tidegate.sinks import make_sink
from tidegate.sinks.kafka.partition import murmur2_partition
from tidegate.sinks.kafka.sink import KafkaSink
from tidegate.sinks.kafka.spec import KafkaSinkSpec
from tidegate.spec import BatchSpec
from tidegate.store import open_store

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

# Kill scenario shape: 10 transactions of 4 rows, 8 events per sub-batch → 5 sub-batches.
N_TX, ROWS, MAX_EVENTS = 10, 4, 8


def ksink(name: str, *, eos: bool, create: bool = True, partitions: int = 3, topic: str | None = None,
          ckpt: str | None = None) -> KafkaSinkSpec:
    return KafkaSinkSpec(id="events", kind="kafka", conn_id="cdc_kafka",
                    topic=topic or ("t_" + name + ".{schema}.{table}"), exactly_once=eos,
                    partitions=partitions, create_topics=create,
                    checkpoint_topic=ckpt or f"_tidegate_ckpt_{name}")


def new_sink(conn: Connection, name: str, **kw) -> KafkaSink:
    spec = ksink(name, **kw)
    return make_sink(pipeline_spec(name, spec), spec, conn)


def read_topic(bootstrap: str, topic: str, isolation: str = "read_committed") -> list:
    """Every record of every partition (up to the end visible under ``isolation``)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("reader"), "enable.auto.commit": False,
                  "isolation.level": isolation, "enable.partition.eof": True,
                  "auto.offset.reset": "earliest"})
    try:
        md = c.list_topics(topic, timeout=10)
        parts = sorted(md.topics[topic].partitions)
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        out, eof, deadline = [], set(), time.monotonic() + 30
        while len(eof) < len(parts) and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                continue
            out.append(m)
        assert len(eof) == len(parts), f"did not reach the end of {topic}"
        return out
    finally:
        c.close()


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("wm")})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
    finally:
        c.close()


def assert_exactly_once_in_order(msgs: list, events: list) -> None:
    keys = [dict(m.headers())["idempotency_key"].decode() for m in msgs]
    assert sorted(keys) == sorted(e.idempotency_key for e in events), "not every event exactly once"
    last: dict[int, int] = {}
    for m in sorted(msgs, key=lambda m: (m.partition(), m.offset())):
        k, seq = seq_of(m.value())
        assert seq > last.get(k, -1), f"key {k} out of order"
        last[k] = seq


# --------------------------------------------------------------------------- idempotent mode


def test_idempotent_mode_keys_headers_murmur2_partitions_and_created_topic(kafka, kafka_bootstrap):
    name = unique("kidem")
    sink = new_sink(kafka.cdc, name, eos=False, partitions=3)
    batches = make_batches(name, 6, 5, 2)
    try:
        sink.open()
        assert sink.committed_checkpoint() is None  # no sink-side checkpoint in this mode
        for b in batches:
            assert sink.deliver(b) == b.end_position
    finally:
        sink.close()
    topic = f"t_{name}.shop.orders"
    msgs = read_topic(kafka_bootstrap, topic)
    events = {e.idempotency_key: e for e in all_events(batches)}
    assert_exactly_once_in_order(msgs, list(events.values()))
    assert {m.partition() for m in msgs} == {0, 1, 2} or len({m.key() for m in msgs}) < 3
    for m in msgs:
        h = dict(m.headers())
        ev = events[h["idempotency_key"].decode()]
        assert m.key() == ev.key_bytes and m.value() == ev.value
        assert h["op"] == ev.op.encode() and h["table"] == b"shop.orders"
        assert m.partition() == murmur2_partition(m.key(), 3), "not where a Java producer puts the key"


# --------------------------------------------------------------------------- exactly once


def test_exactly_once_writes_checkpoint_record_in_the_same_transaction(kafka, kafka_bootstrap):
    name = unique("keos")
    sink = new_sink(kafka.cdc, name, eos=True)
    batches = make_batches(name, 6, 3, 2)
    try:
        sink.open()
        assert sink.committed_checkpoint() is None
        for b in batches:
            sink.deliver(b)
        assert sink.committed_checkpoint().position == batches[-1].end_position
    finally:
        sink.close()
    fresh = new_sink(kafka.cdc, name, eos=True)
    try:
        fresh.open()
        assert fresh.committed_checkpoint().position == batches[-1].end_position
    finally:
        fresh.close()
    assert_exactly_once_in_order(read_topic(kafka_bootstrap, f"t_{name}.shop.orders"), all_events(batches))
    ck = read_topic(kafka_bootstrap, f"_tidegate_ckpt_{name}")
    assert [m.key() for m in ck] == [f"acme/{name}::sink::events".encode()] * 3
    assert SinkCheckpoint.loads(ck[-1].value()).position == batches[-1].end_position
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, f"_tidegate_ckpt_{name}")
    cfg = admin.describe_configs([res])[res].result(timeout=30)
    assert cfg["cleanup.policy"].value == "compact"


# --------------------------------------------------------------------------- kills (child process)

CHILD = r"""
import json, sys, time
sys.path[:0] = [{here!r}]
from test_sink_kafka import child_main
child_main(json.loads(sys.argv[1]))
"""


def child_main(args: dict) -> None:
    """Run one delivery in this (child) process and hang at the requested point, announcing it
    with a line ``KILLME`` on stdout; the parent then SIGKILLs us."""
    from tidegate.connections import get_connection

    def hang():
        print("KILLME", flush=True)
        time.sleep(600)

    name, at = args["name"], args["kill_at"]

    class HangBeforeCommit(KafkaSink):
        calls = 0

        def _commit_transaction(self):
            HangBeforeCommit.calls += 1
            if HangBeforeCommit.calls == at:
                self.writer.producer.flush(30)  # the transaction's records are in the log, uncommitted
                hang()
            super()._commit_transaction()

    spec = ksink(name, eos=True)
    cls = HangBeforeCommit if args["where"] == "mid_transaction" else KafkaSink
    sink = cls(pipeline_spec(name, spec), spec, get_connection("cdc_kafka"))
    store = open_store(args["store"])
    if args["where"] == "after_commit":
        real, n = store.checkpoints.write_many, [0]

        def write_checkpoints(*a, **kw):  # the Kafka transaction has committed; the store write not yet
            n[0] += 1
            if n[0] == at:
                hang()
            return real(*a, **kw)

        store.checkpoints.write_many = write_checkpoints
    batches = make_batches(name, N_TX, ROWS, 1)
    run_once(store, name, "child", [sink], BatchSpec(max_events=MAX_EVENTS),
             lambda start: source_items(batches, start))
    print("DONE", flush=True)


def run_child_until_kill(args: dict, timeout: float = 90) -> None:
    proc = subprocess.Popen([sys.executable, "-c", CHILD.format(here=str(HERE)), json.dumps(args)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout
        for line in proc.stdout:
            if line.strip() == "KILLME":
                os.kill(proc.pid, signal.SIGKILL)
                break
            assert time.monotonic() < deadline
        else:
            pytest.fail(f"child ended (rc={proc.wait()}) without reaching the kill point")
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def rerun(conn: Connection, name: str, store_url: str):
    spec = ksink(name, eos=True)
    sink = make_sink(pipeline_spec(name, spec), spec, conn)
    batches = make_batches(name, N_TX, ROWS, 1)
    store = open_store(store_url)
    try:
        report = run_once(store, name, "rerun", [sink], BatchSpec(max_events=MAX_EVENTS),
                          lambda start: source_items(batches, start))
        return report, store.checkpoints.get(name, "events")
    finally:
        store.close()


@pytest.mark.chaos
@pytest.mark.parametrize("kill_at", [3, 5], ids=["middle_sub_batch", "last_sub_batch"])
def test_kill_after_kafka_commit_before_store_write_causes_no_duplicate(kafka, kafka_bootstrap, tmp_path,
                                                                         kill_at):
    name = unique("kkill")
    url = f"sqlite:///{tmp_path}/ck.sqlite"
    run_child_until_kill({"name": name, "kill_at": kill_at, "where": "after_commit", "store": url})
    batches = make_batches(name, N_TX, ROWS, 2)  # = the sub-batches the coordinator cut
    store = open_store(url)
    rec = store.checkpoints.get(name, "events")
    store.close()
    assert rec.position == batches[kill_at - 2].end_position, "the store write of the killed batch happened"
    topic = f"t_{name}.shop.orders"
    before = end_offsets(kafka_bootstrap, topic)

    report, rec = rerun(kafka.cdc, name, url)

    assert report.sinks["events"].start == batches[kill_at - 1].end_position  # the sink's own record
    assert rec.position == batches[-1].end_position or kill_at == len(batches)
    if kill_at == len(batches):
        assert end_offsets(kafka_bootstrap, topic) == before, "the rerun wrote to the topic"
    events = all_events(batches)
    assert_exactly_once_in_order(read_topic(kafka_bootstrap, topic), events)
    # Not even an aborted copy: the killed batch was never sent twice.
    assert len(read_topic(kafka_bootstrap, topic, "read_uncommitted")) == len(events)


@pytest.mark.chaos
def test_kill_in_the_middle_of_a_transaction_shows_nothing_and_rerun_delivers_once(kafka, kafka_bootstrap,
                                                                                    tmp_path):
    name = unique("kmid")
    url = f"sqlite:///{tmp_path}/ck.sqlite"
    run_child_until_kill({"name": name, "kill_at": 3, "where": "mid_transaction", "store": url})
    batches = make_batches(name, N_TX, ROWS, 2)
    topic = f"t_{name}.shop.orders"
    # The killed transaction's records are in the log, but a read_committed reader stops before them.
    assert len(read_topic(kafka_bootstrap, topic, "read_uncommitted")) == 3 * MAX_EVENTS
    visible = read_topic(kafka_bootstrap, topic)
    assert_exactly_once_in_order(visible, all_events(batches[:2]))

    report, rec = rerun(kafka.cdc, name, url)

    assert report.sinks["events"].start == batches[1].end_position
    assert rec.position == batches[-1].end_position
    assert_exactly_once_in_order(read_topic(kafka_bootstrap, topic), all_events(batches))
    n_log = len(read_topic(kafka_bootstrap, topic, "read_uncommitted"))
    assert n_log == len(all_events(batches)) + MAX_EVENTS  # the aborted transaction, never visible


# --------------------------------------------------------------------------- zombie fencing


def test_zombie_producer_is_fenced_fatally_and_none_of_its_data_is_visible(kafka, kafka_bootstrap):
    name = unique("kzombie")
    spec = ksink(name, eos=True)
    pspec = pipeline_spec(name, spec)
    successor: list[KafkaSink] = []

    class Zombie(KafkaSink):
        def _commit_transaction(self):
            self.writer.producer.flush(30)  # its records reach the log...
            nxt = KafkaSink(pspec, spec, kafka.cdc)
            nxt.open()  # ...then a new run opens the same pipeline+sink and fences it
            successor.append(nxt)
            super()._commit_transaction()

    zombie = Zombie(pspec, spec, kafka.cdc)
    batches = make_batches(name, 4, 3, 2)
    try:
        zombie.open()
        with pytest.raises(FatalSinkError) as err:
            zombie.deliver(batches[0])
        assert zombie.classify(err.value) is ErrorClass.FATAL
        assert "fenced" in str(err.value) and f"tidegate-acme.{name}.events" in str(err.value)
        with pytest.raises(FatalSinkError):  # stays dead; never re-initialises (would fence the successor)
            zombie.deliver(batches[1])
        for b in batches:
            successor[0].deliver(b)
        assert successor[0].committed_checkpoint().position == batches[-1].end_position
    finally:
        zombie.close()
        for s in successor:
            s.close()
    topic = f"t_{name}.shop.orders"
    assert len(read_topic(kafka_bootstrap, topic, "read_uncommitted")) > len(all_events(batches))
    assert_exactly_once_in_order(read_topic(kafka_bootstrap, topic), all_events(batches))


def test_an_idempotent_zombie_run_writes_nothing_after_a_takeover(kafka, kafka_bootstrap, tmp_path):
    """An idempotent producer is fenced by nothing, so a run that lost the lease checks it before
    each sub-batch (campaign KAFKA=idempotent, seed 6225: a zombie woken after a takeover wrote its
    next sub-batch, stale changes after newer ones, before another sink fenced it). The zombie
    opened its sink, then a newer run took the lease and delivered everything."""
    name = unique("kidzombie")
    store = open_store(f"sqlite:///{tmp_path}/s.sqlite")
    batches = make_batches(name, N_TX, ROWS, 2)
    zombie_sink, newer_sink = (new_sink(kafka.cdc, name, eos=False) for _ in range(2))
    try:
        zombie = Coordinator(store, name, "zombie", store.leases.acquire(name, "zombie"), [zombie_sink],
                             BatchSpec(max_events=MAX_EVENTS))
        with zombie:
            report = run_once(store, name, "newer", [newer_sink], BatchSpec(max_events=MAX_EVENTS),
                              lambda start: source_items(batches, start))
            assert report.events == len(all_events(batches))
            with pytest.raises(FatalRunError) as err:
                zombie.run(source_items(batches))
    finally:
        store.close()
    said = str(err.value)
    assert "fenced before sub-batch 1" in said and "run 'newer' took the pipeline's lease" in said
    assert_exactly_once_in_order(read_topic(kafka_bootstrap, f"t_{name}.shop.orders"), all_events(batches))


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("eos", [False, True], ids=["idempotent", "exactly_once"])
def test_unknown_topic_with_creation_off_is_non_retryable_and_names_topic_and_setting(kafka, eos):
    name = unique("knotopic")
    sink = new_sink(kafka.cdc, name, eos=eos, create=False)
    try:
        sink.open()
        with pytest.raises(NonRetryableSinkError) as err:
            sink.deliver(make_batches(name, 1, 2, 1)[0])
    finally:
        sink.close()
    assert sink.classify(err.value) is ErrorClass.NON_RETRYABLE
    msg = str(err.value)
    assert f"t_{name}.shop.orders" in msg and "create_topics" in msg


@pytest.mark.parametrize("eos", [False, True], ids=["idempotent", "exactly_once"])
def test_oversized_message_is_non_retryable_and_nothing_of_the_batch_is_visible(kafka, kafka_bootstrap, eos):
    name = unique("kbig")
    sink = new_sink(kafka.cdc, name, eos=eos, partitions=1)
    small = make_batches(name, 1, 3, 1)[0]
    big = make_batches(name, 1, 3, 1, first_tx=2, pad=3 * 1024 * 1024, noise=True)[0]  # broker takes 2 MiB
    try:
        sink.open()
        sink.deliver(small)
        with pytest.raises(NonRetryableSinkError) as err:
            sink.deliver(big)
        assert sink.classify(err.value) is ErrorClass.NON_RETRYABLE
        if eos:  # its checkpoint did not move, and the sink delivers again at the first try: the
            # refused transaction's producer is replaced (the same one fails the next
            # transaction with OUT_OF_ORDER_SEQUENCE_NUMBER, whose abort can then hang)
            assert sink.committed_checkpoint().position == small.end_position
            nxt = make_batches(name, 1, 2, 1, first_tx=3)[0]
            sink.deliver(nxt)
            assert sink.committed_checkpoint().position == nxt.end_position
    finally:
        sink.close()
    msg = str(err.value)
    assert "Kafka refused it" in msg and "MSG_SIZE_TOO_LARGE" in msg and "on_poison is halt" in msg
    assert "max.message.bytes" in msg
    if eos:
        visible = read_topic(kafka_bootstrap, f"t_{name}.shop.orders")
        assert all(seq_of(m.value())[1] // 10_000 != 2 for m in visible)  # nothing of tx 2
        assert len(visible) == 5


def test_broker_down_is_retryable(kafka):
    name = unique("kdown")
    conn = Connection("down", "kafka", extra={"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": 1500,
                                              "socket.connection.setup.timeout.ms": 1000})
    spec = ksink(name, eos=False)
    sink = KafkaSink(pipeline_spec(name, spec), spec, conn)
    sink.settings.op_timeout_s = 2
    try:
        with pytest.raises(RetryableSinkError) as err:
            sink.open()
            sink.deliver(make_batches(name, 1, 2, 1)[0])
    finally:
        sink.close()
    assert sink.classify(err.value) is ErrorClass.RETRYABLE


def test_secrets_never_reach_error_messages(kafka):
    name = unique("ksecret")
    conn = Connection("sasl", "kafka", login="bob", password="s3cr3t-Pa55",
                      extra={"bootstrap.servers": "127.0.0.1:1", "security.protocol": "SASL_PLAINTEXT",
                             "message.timeout.ms": 1500})
    spec = ksink(name, eos=False)
    sink = KafkaSink(pipeline_spec(name, spec), spec, conn)
    sink.settings.op_timeout_s = 2
    assert "s3cr3t" not in repr(conn) and "s3cr3t" not in str(conn)
    try:
        with pytest.raises(RetryableSinkError) as err:
            sink.open()
            sink.deliver(make_batches(name, 1, 2, 1)[0])
    finally:
        sink.close()
    assert "s3cr3t" not in str(err.value) and "s3cr3t" not in repr(err.value)
