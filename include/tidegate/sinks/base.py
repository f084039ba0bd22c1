"""The sink interface. Kafka, NATS and Redis sinks implement it; the coordinator drives it.

Life cycle per run: ``open()`` once, ``committed_checkpoint()`` once (sinks that keep their
own checkpoint record next to the data), ``deliver(sub_batch, extends)`` per sub-batch,
``close()`` once. ``deliver`` receives only what the sink still needs (the coordinator has
already dropped the transactions at or before the sink's effective position) and returns the
position it acknowledged, which is ``sub_batch.end_position`` on success. ``extends`` is the
store version of the sink's checkpoint this delivery builds on; a sink that records its own
checkpoint writes it into that record (see :mod:`tidegate.checkpoints`). ``deliver`` raises
:class:`SinkError` (or any exception, which ``classify`` maps to an :class:`ErrorClass`) on
failure.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from ..batching import SubBatch
from ..checkpoints import SinkCheckpoint
from ..errors import ErrorClass, SinkError
from ..positions import Position


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter: sleep uniform(0, min(max, base * 2**attempt))."""

    base_s: float
    max_s: float
    attempts: int


class Sink(abc.ABC):
    kind: str = ""
    retry_policy: RetryPolicy = RetryPolicy(0.05, 5.0, 3)

    def __init__(self, *, sink_id: str, pipeline: str, required: bool = True):
        self.sink_id = sink_id
        self.pipeline = pipeline
        self.required = required

    @property
    def checkpoint_key(self) -> str:
        return f"{self.pipeline}::sink::{self.sink_id}"

    def open(self) -> None:  # noqa: B027 - optional hook
        """Connect, create what is missing (topics, streams), fence older producers."""

    @abc.abstractmethod
    def deliver(self, batch: SubBatch, extends: int | None = None) -> Position:
        """Deliver the sub-batch durably; return the acknowledged position. ``extends``: the
        store version of this sink's checkpoint when the delivery began (0: none yet)."""

    def committed_checkpoint(self) -> SinkCheckpoint | None:
        """The record this sink wrote itself, atomically with its data; None if it keeps none.
        The coordinator adopts it only when it extends the store's current version."""
        return None

    def sink_record(self, batch: SubBatch, extends: int | None) -> SinkCheckpoint:
        return SinkCheckpoint(batch.end_position, extends)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Must not raise."""

    def classify(self, exc: BaseException) -> ErrorClass:
        """Map an exception from deliver() to an error class; sinks refine this."""
        if isinstance(exc, SinkError):
            return exc.error_class
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return ErrorClass.RETRYABLE
        return ErrorClass.NON_RETRYABLE
