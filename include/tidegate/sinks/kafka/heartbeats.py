"""``envelope: debezium`` heartbeats (``heartbeat_interval_ms``): a record in the heartbeat
topic at the run's position when the interval has passed since the last one. The last one's
time is read back from the topic once, then kept; a queued heartbeat counts once its
transaction (or flush) succeeded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from ...positions import Position
from .readback import LastRecord
from .topics import Topics


class Heartbeats:
    """``encoder`` writes the records (None: the sink writes no heartbeats)."""

    def __init__(self, encoder: Any, interval_ms: int, topics: Topics, last: LastRecord):
        self.encoder = encoder if interval_ms > 0 else None
        self.interval_ms = interval_ms
        self.topics = topics
        self.last = last
        self.last_ms: int | None = None  # when the last heartbeat was written
        self.queued: int | None = None  # the one queued in the delivery in progress

    @property
    def kept(self) -> bool:
        return self.encoder is not None

    def due(self) -> int | None:
        """The time (ms) to write a heartbeat at, when one is due; None otherwise."""
        if self.encoder is None:
            return None
        if self.last_ms is None:
            self.last_ms = self._read_last_ms()
        now = self.encoder.clock() // 1_000_000
        return now if now - self.last_ms >= self.interval_ms else None

    def queue(self, position: Position, produce: Callable[[Any], None]) -> None:
        """Hand ``produce`` a heartbeat record at ``position`` when one is due."""
        now = self.due()
        if now is None:
            return
        produce(self.encoder.heartbeat_record(position))
        self.queued = now

    def written(self) -> bool:
        """The queued heartbeat's delivery succeeded: it is the last one now (False: none queued)."""
        if self.queued is None:
            return False
        self.last_ms, self.queued = self.queued, None
        return True

    def _read_last_ms(self) -> int:
        """The ``ts_ms`` of the last committed heartbeat of this sink's prefix (0: none yet)."""
        topic = self.encoder.heartbeat_topic
        self.topics.ensure([topic])
        key = self.encoder.heartbeat_record(None).key or b""
        raw = self.last.read(topic, 0, key, "heartbeat", window=64, grow=False)
        if raw is None:
            return 0
        value = orjson.loads(raw)
        return int((value.get("payload") or value)["ts_ms"]) if isinstance(value, dict) else 0


__all__ = ["Heartbeats"]
