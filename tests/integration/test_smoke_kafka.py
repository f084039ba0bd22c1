"""The KRaft broker honours transactions: read_committed isolation and zombie fencing."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = pytest.mark.integration


def new_topic(bootstrap: str) -> str:
    name = "smoke-" + uuid.uuid4().hex[:8]
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future
    futures = admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])
    futures[name].result(timeout=30)
    return name


def tx_producer(bootstrap: str, tx_id: str) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tx_id, "linger.ms": 0})
    p.init_transactions(30)
    return p


def read_all(bootstrap: str, topic: str, isolation: str) -> list[str]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "smoke-" + uuid.uuid4().hex,
                  "isolation.level": isolation, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    try:
        tp = TopicPartition(topic, 0)
        _, high = c.get_watermark_offsets(tp, timeout=10)
        c.assign([TopicPartition(topic, 0, 0)])
        out: list[str] = []
        while True:
            msg = c.poll(2.0)
            if msg is None:
                break
            if msg.error():
                continue
            out.append(msg.value().decode())
            if msg.offset() >= high - 1:
                break
        return out
    finally:
        c.close()


def test_read_committed_never_sees_an_aborted_transaction(kafka_bootstrap):
    topic = new_topic(kafka_bootstrap)
    p = tx_producer(kafka_bootstrap, "smoke-" + uuid.uuid4().hex)
    p.begin_transaction()
    p.produce(topic, b"aborted-1")
    p.produce(topic, b"aborted-2")
    p.flush()
    p.abort_transaction(30)
    p.begin_transaction()
    p.produce(topic, b"committed-1")
    p.commit_transaction(30)

    assert read_all(kafka_bootstrap, topic, "read_committed") == ["committed-1"]
    # The aborted records were written to the log: only isolation hides them.
    assert read_all(kafka_bootstrap, topic, "read_uncommitted") == ["aborted-1", "aborted-2", "committed-1"]


def test_second_producer_with_same_transactional_id_fences_the_first(kafka_bootstrap):
    topic = new_topic(kafka_bootstrap)
    tx_id = "smoke-" + uuid.uuid4().hex
    zombie = tx_producer(kafka_bootstrap, tx_id)
    zombie.begin_transaction()
    zombie.produce(topic, b"from-zombie")
    zombie.flush()

    successor = tx_producer(kafka_bootstrap, tx_id)  # fences the zombie, aborts its open tx
    with pytest.raises(KafkaException) as err:
        zombie.commit_transaction(30)
    kerr = err.value.args[0]
    assert kerr.fatal() or "fenced" in kerr.str().lower(), kerr.str()

    successor.begin_transaction()
    successor.produce(topic, b"from-successor")
    successor.commit_transaction(30)
    assert read_all(kafka_bootstrap, topic, "read_committed") == ["from-successor"]
