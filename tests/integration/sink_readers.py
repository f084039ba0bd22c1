"""Read back what the sinks hold, for tests: Kafka as a read_committed consumer sees it, the
Nats-Msg-Id of every message of a JetStream stream, the idempotency keys of a Redis stream.
The NATS readers leave out the sinks' commit markers (``{pipeline}.__checkpoint.{sink}``):
bookkeeping, as the checkpoint topic is on Kafka."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from confluent_kafka import Consumer, TopicPartition
from tidegate.sinks.kafka.readback import committed_records


def kafka_changes(bootstrap: str, topic: str) -> list[dict]:
    """Every committed envelope of the topic, as a read_committed consumer sees it."""
    # fetch.wait.max.ms: a fetch at the partition's end returns at once rather than after the
    # broker's 500 ms wait for more data (the read ends there; nothing more is expected)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "e2e-" + uuid.uuid4().hex,
                  "isolation.level": "read_committed", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 10})
    out = []
    try:
        meta = c.list_topics(topic, timeout=10).topics[topic]
        for p in meta.partitions:
            tp = TopicPartition(topic, p)
            low, high = c.get_watermark_offsets(tp, timeout=10)
            if high <= low:  # an empty partition (a dead-letter topic's, often): no position to reach
                continue
            c.assign([TopicPartition(topic, p, low)])
            stalled = time.monotonic() + 30  # a bound on a read that makes no progress, not on its length
            while True:
                # A short poll: the partition's last offset is often no message (an exactly-once
                # topic ends with a commit marker, which a read_committed consumer never returns),
                # so the read ends on a poll that returns nothing once the position has passed it;
                # a 1 s poll made every such partition wait a second for nothing.
                msg = c.poll(0.05)
                if msg is None:
                    if c.position([tp])[0].offset >= high:
                        break
                    assert time.monotonic() < stalled, f"{topic}[{p}]: no message for 30s, read {len(out)}"
                    continue
                stalled = time.monotonic() + 30
                if not msg.error():
                    out.append(json.loads(msg.value()))
                if msg.offset() >= high - 1:
                    break
    finally:
        c.close()
    return out


def kafka_records(bootstrap: str, topic: str, partitions: int = 1
                  ) -> list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]]]]:
    """(partition, key, value, headers) of every committed record, as a read_committed consumer
    sees them, per partition in offset order, each partition read to its end (its last offset
    may be a transaction's commit marker)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "records-" + uuid.uuid4().hex,
                  "isolation.level": "read_committed", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    out = []
    try:
        for p in range(partitions):
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high <= low:
                continue

            def stuck(p: int = p) -> AssertionError:
                return AssertionError(f"{topic}[{p}] not read to its end in 60 s")
            # the sink's own read-back of its checkpoints: one walk of a partition to its end
            out += [(p, m.key(), m.value(), list(m.headers() or []))
                    for m in committed_records(c, topic, p, low, 60, stuck)]
    finally:
        c.close()
    return out


def is_marker(subject: str) -> bool:
    return ".__checkpoint." in subject


def stored_messages(conn, stream: str) -> list:
    """Every message of a JetStream stream in stream order, the sinks' commit markers left out."""
    return [m for m in all_messages(conn, stream) if not is_marker(m.subject)]


def all_messages(conn, stream: str) -> list:
    """Every message of a JetStream stream in stream order, commit markers and claims too."""
    import nats

    async def go():
        nc = await nats.connect(f"nats://127.0.0.1:{conn.port}", user=conn.login, password=conn.password)
        try:
            js = nc.jetstream()
            info = await js.stream_info(stream)
            if not info.state.messages:
                return []
            seqs = range(info.state.first_seq, info.state.last_seq + 1)
            return [await js.get_msg(stream, seq) for seq in seqs]
        finally:
            await nc.close()

    return asyncio.run(go())


def nats_count(conn, stream: str, subject: str) -> int:
    """How many messages of ``subject`` a JetStream stream holds (the server's own count)."""
    import nats
    from nats.js.errors import NotFoundError

    async def go():
        nc = await nats.connect(f"nats://127.0.0.1:{conn.port}", user=conn.login, password=conn.password)
        try:
            info = await nc.jetstream().stream_info(stream, subjects_filter=subject)
            return (info.state.subjects or {}).get(subject, 0)
        except NotFoundError:  # not created yet: the sink creates it on first use
            return 0
        finally:
            await nc.close()

    return asyncio.run(go())


def nats_ids(conn, stream: str) -> list[str]:
    return [m.headers["Nats-Msg-Id"] for m in stored_messages(conn, stream)]


def nats_messages(conn, stream: str, subject: str) -> list[tuple[dict, dict]]:
    """(JSON payload, headers) of every message of ``subject``, in stream order."""
    msgs = stored_messages(conn, stream)
    return [(json.loads(m.data), header_texts(m.headers)) for m in msgs if m.subject == subject]


def header_texts(headers: dict | None) -> dict[str, str]:
    """A message's headers as text. nats-py parses them with the e-mail parser, which gives a
    value with bytes past ASCII (a snapshot row's Nats-Msg-Id names its key: text of any
    language) as an ``email.header.Header``; its bytes are the UTF-8 the sink sent."""
    from email.header import decode_header

    return {k: v if isinstance(v, str) else
            "".join(p.decode() if isinstance(p, bytes) else p for p, _ in decode_header(v))
            for k, v in (headers or {}).items()}


@contextmanager
def redis_client(conn) -> Iterator[redis.Redis]:
    r = redis.Redis(host="127.0.0.1", port=conn.port, username=conn.login, password=conn.password)
    try:
        yield r
    finally:
        r.close()


def redis_ids(conn, key: str) -> list[str]:
    with redis_client(conn) as r:
        return [f[b"idempotency_key"].decode() for _, f in r.xrange(key)]


def redis_events(conn, key: str) -> list[bytes]:
    """The `event` field (the envelope) of every entry of a Redis stream, in stream order."""
    with redis_client(conn) as r:
        return [f[b"event"] for _, f in r.xrange(key)]


def redis_length(conn, key: str) -> int:
    """Entries of a Redis stream (a Redis sink adds a sub-batch's entries at once: MULTI/EXEC)."""
    with redis_client(conn) as r:
        return r.xlen(key)


def nats_payloads(conn, stream: str, subject: str) -> list[dict]:
    """The JSON payload of every message of ``subject`` in a JetStream stream, in stream order."""
    return [payload for payload, _ in nats_messages(conn, stream, subject)]


def nats_stream(conn, stream: str) -> list[tuple[str, dict]]:
    """(subject, JSON payload) of every message of a JetStream stream, in stream order (the
    one order across the data subjects and the control subject)."""
    return [(m.subject, json.loads(m.data)) for m in stored_messages(conn, stream)]
