"""Reading the sink's own records back as a read_committed consumer: the last committed record
with a key (the sink's checkpoint in the checkpoint topic, its last heartbeat), without a
producer, so reading fences nobody. :func:`committed_records` is the partition walk itself,
which the tests' readers use too."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ...errors import RetryableSinkError
from .client import ClientSettings
from .errors import Fail, Reports


def committed_records(c: Consumer, topic: str, part: int, start: int, timeout_s: float,
                      stalled: Callable[[], BaseException]) -> Iterator[Any]:
    """Every committed record of ``topic``'s partition ``part`` from offset ``start`` to the
    partition's end (``c`` must report it: ``enable.partition.eof``). ``stalled()`` is raised
    when the end is not reached within ``timeout_s`` (an open transaction of another producer
    holds the last stable offset)."""
    c.assign([TopicPartition(topic, part, start)])
    deadline = time.monotonic() + timeout_s
    while True:
        if time.monotonic() > deadline:
            raise stalled()
        msg = c.poll(1.0)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                return
            raise KafkaException(msg.error())
        yield msg


class LastRecord:
    """The last committed value with a given key in one partition of one topic, read through a
    consumer of its own each time (``settings.reader()``)."""

    def __init__(self, settings: ClientSettings, reports: Reports, fail: Fail, sink_id: str):
        self.settings = settings
        self.reports = reports
        self.fail = fail
        self.sink_id = sink_id

    def read(self, topic: str, part: int, key: bytes, what: str, window: int = 512,
             grow: bool = True) -> bytes | None:
        """The value, or None. The partition's tail is read in a window that grows 16 times
        each round until the key is found or the window reaches the start (``grow=False``: one
        window only)."""
        try:
            c = Consumer(self.settings.reader())
        except KafkaException as exc:
            raise self.fail(exc, f"creating the {what} reader") from None
        try:
            tp = TopicPartition(topic, part)
            low, high = c.get_watermark_offsets(tp, timeout=self.settings.op_timeout_s)
            while high > low:
                start = max(low, high - window)
                found = self._scan(c, topic, part, start, key)
                if found is not None or start == low or not grow:
                    return found
                window *= 16
            return None
        except KafkaException as exc:
            lasting = self.reports.lasting_client_error()  # a refused certificate or login
            if lasting is not None:
                raise self.fail(KafkaException(lasting), "talking to the brokers") from None
            raise self.fail(exc, f"reading {what} topic {topic!r}") from None
        finally:
            c.close()

    def _scan(self, c: Consumer, topic: str, part: int, start: int, key: bytes) -> bytes | None:
        timeout = self.settings.op_timeout_s

        def stalled() -> RetryableSinkError:
            return RetryableSinkError(
                f"Kafka sink {self.sink_id!r}: could not read topic {topic!r} to its end within "
                f"{timeout:.0f}s (an open transaction of another producer holds the last stable offset)")
        last = None
        for msg in committed_records(c, topic, part, start, timeout, stalled):
            if msg.key() == key:
                last = msg.value()
        return last


__all__ = ["LastRecord", "committed_records"]
