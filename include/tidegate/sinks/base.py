"""The sink interface. Kafka, NATS and Redis sinks implement it; the coordinator drives it.

Life cycle per run: ``open()`` once, ``committed_checkpoint()`` once (sinks that keep their
own checkpoint record next to the data), ``deliver(sub_batch, extends)`` per sub-batch,
``close()`` once. ``deliver`` receives only what the sink still needs (the coordinator has
already dropped the transactions at or before the sink's effective position) and returns the
position it acknowledged, which is ``sub_batch.end_position`` on success. ``extends`` is the
store version of the sink's checkpoint this delivery builds on; a sink that records its own
checkpoint writes it into that record (see :mod:`tidegate.sink_checkpoints`). ``deliver`` raises
:class:`SinkError` (or any exception, which ``classify`` maps to an :class:`ErrorClass`) on
failure.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from ..batching import SubBatch
from ..connections import Connection
from ..errors import (
    ErrorClass,
    FatalSinkError,
    NonRetryableSinkError,
    PoisonEventError,
    RetryableSinkError,
    SinkError,
)
from ..events import ControlMessage
from ..positions import Position
from ..sink_checkpoints import RunStart, SinkCheckpoint
from ..spec import SinkSpec
from ._common import redact, secrets_of, tls_verification_failed


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter: sleep uniform(0, min(max, base * 2**attempt))."""

    base_s: float
    max_s: float
    attempts: int


DLQ_EVENT_BYTES = 64 * 1024  # a dead-lettered event larger than this keeps its head and its size


class Sink(abc.ABC):
    kind: str = ""
    label: str = ""  # how messages name the kind: "Kafka", "NATS", "Redis"
    retry_policy: RetryPolicy = RetryPolicy(0.05, 5.0, 3)
    # The per-pipeline channels' default names (``control`` / ``dlq`` in the spec override them).
    channel_separator: str = "."
    # Whether the sink is given its RunStart (run_start, below): one that can find, while it
    # delivers, that a part of its data went back (a Delta table restored) needs it to tell so.
    reads_run_start: bool = False

    def __init__(self, *, sink_id: str, pipeline: str, required: bool = True,
                 conn: Connection | None = None, secrets: list[str] | None = None,
                 spec: SinkSpec | None = None, tenant: str = "default"):
        self.sink_id = sink_id
        self.pipeline = pipeline
        self.tenant = tenant
        self.required = required
        self.conn = conn
        # Every secret the connection holds: replaced by *** in any text this sink lets out.
        self._secrets = secrets if secrets is not None else (secrets_of(conn) if conn else [])
        self.on_poison = spec.on_poison if spec is not None else "halt"
        sep = self.channel_separator
        self.control_name = (spec.control if spec is not None and spec.control
                             else "{pipeline}" + sep + "__control").format(pipeline=pipeline)
        self.dlq_name = (spec.dlq if spec is not None and spec.dlq
                         else "{pipeline}" + sep + "__dlq").format(pipeline=pipeline)
        # The run's lease epoch, set by the coordinator before open(). Sinks that fence zombie
        # writers themselves (Redis, NATS) claim it on open and write only while no newer epoch
        # has claimed the sink; Kafka is fenced by its transactional.id instead. None: unfenced.
        self.epoch: int | None = None
        # Whether the sink refuses a zombie's data writes itself (above). One that does not (Kafka
        # without transactions) has the coordinator check the lease before each sub-batch.
        self.fences_zombies = True
        # Whether the sink writes a checkpoint record with its data (its kind reads one back;
        # Kafka's only with exactly_once).
        self.keeps_record = type(self).committed_checkpoint is not Sink.committed_checkpoint
        # Where this run delivers the sink from, set by the coordinator once the sink is open when
        # reads_run_start. None outside a run: a loss the sink finds is then told, never written over.
        self.run_start: RunStart | None = None
        self.dlq_count = 0  # events dead-lettered by committed deliveries (this sink's life)
        self.duplicates = 0  # messages the server reported as already stored (NATS)
        self.skipped = 0  # messages found stored by an earlier attempt, not sent again (NATS)

    def use_run(self, *, column_types: Any, spark: Any) -> None:
        """What the run lends its sinks, before they open: ``column_types``, where the source's
        column types can be asked for (a callable; ``envelope: debezium`` needs them), and
        ``spark``, the run's Spark Connect session when a Connect client delivers it (None
        otherwise; a sink that writes through Spark uses it). A sink needing neither ignores it."""
        return None

    @property
    def checkpoint_key(self) -> str:
        """The key of this sink's own records (Kafka checkpoint topic, Redis keys, NATS headers):
        with the tenant, so deployments of two tenants sharing a broker never read each other's."""
        return f"{self.tenant}/{self.pipeline}::sink::{self.sink_id}"

    def open(self) -> None:  # noqa: B027 - optional hook
        """Connect, create what is missing (topics, streams), fence older producers."""

    def heartbeat(self, position: Position) -> bool:
        """A run whose source had nothing for this sink (an idle run): write a heartbeat at
        ``position`` if the sink keeps heartbeats and one is due; True when one was written.
        Only sinks whose spec sets a heartbeat interval are asked (runner.py)."""
        return False

    @abc.abstractmethod
    def deliver(self, batch: SubBatch, extends: int | None = None) -> Position:
        """Deliver the sub-batch durably; return the acknowledged position. ``extends``: the
        store version of this sink's checkpoint when the delivery began (0: none yet)."""

    def target_of(self, table: Any) -> str | None:
        """The name of what this sink writes a source table's rows to (a topic, subject, stream or
        table path); ``table`` has ``db``, ``schema`` and ``table`` (a ``batching.TableRef``).
        The run report counts delivered events per target under this name; None: the kind names
        no target per table."""
        return None

    # Whether the sink's own record can go missing, or back, only with the data written beside
    # it (a Redis key, never trimmed), so that such a record proves the sink lost changes it
    # acknowledged: the sink then fails instead of receiving what follows the store's checkpoint
    # (coordinator._may_deliver). A NATS marker can age out under the stream's limits, a Kafka
    # checkpoint topic be renamed in the spec: those sinks are named in a warning only.
    record_tracks_data: bool = False

    def committed_checkpoint(self) -> SinkCheckpoint | None:
        """The record this sink wrote itself, atomically with its data; None if it keeps none.
        The coordinator adopts it only when it extends the store's current version."""
        return None


    def sink_record(self, batch: SubBatch, extends: int | None) -> SinkCheckpoint:
        return SinkCheckpoint(batch.end_position, extends)

    def fenced_error(self, newer: int | None) -> FatalSinkError:
        """The error of a zombie writer: a run with a newer lease epoch has claimed this sink."""
        by = f"a newer run (lease epoch {newer})" if newer is not None else "a newer run"
        return FatalSinkError(
            f"{self.where}: fenced: {by} has taken over this sink, so this run (lease epoch "
            f"{self.epoch}) lost its lease; it wrote nothing of the refused sub-batch, stops now and "
            f"must not be retried")

    # ------------------------------------------------------------------ poison events

    def poison_error(self, events: list, why: str) -> PoisonEventError:
        """The error of ``on_poison: halt``: says why, then names each event by idempotency key and
        position (why first: a run's one-line error cuts a sink's error short, campaign seed 8602)."""
        named = "; ".join(f"{ev.idempotency_key} at {_position_of(ev)}" for ev in events[:5])
        more = f" (and {len(events) - 5} more)" if len(events) > 5 else ""
        return PoisonEventError(
            f"{self.where}: {len(events)} event(s) this sink cannot take ({why}): {named}{more}. "
            f"on_poison is halt, so nothing of the sub-batch was delivered; fix the row or the sink's "
            f"limit, or set on_poison: dlq to send such events to {self.dlq_name!r}", events=events)

    def halt_on_poison(self, poison: Iterable[tuple[Any, str]]) -> None:
        """``on_poison: halt``: raise the poison error of ``poison`` ((event, why) pairs), if any."""
        poison = list(poison)
        if poison and self.on_poison != "dlq":
            why = "; ".join(dict.fromkeys(why for _, why in poison))
            raise self.poison_error([ev for ev, _ in poison], why)

    def dlq_record(self, event: Any, error: str, error_class: ErrorClass = ErrorClass.NON_RETRYABLE) -> bytes:
        """The dead-letter record of one event (docs/architecture.md, "Poison events")."""
        value = bytes(event.value)
        record: dict[str, Any] = {"error": self.redact(error), "error_class": error_class.value,
                                  "sink": self.sink_id, "idempotency_key": event.idempotency_key,
                                  "position": _position_of(event)}
        if len(value) <= DLQ_EVENT_BYTES:
            record["event"] = orjson.loads(value)
        else:
            record["event"] = value[:DLQ_EVENT_BYTES].decode("utf-8", "replace")
            record["event_size"] = len(value)
        return orjson.dumps(record)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Must not raise."""

    # ------------------------------------------------------------------ errors

    def classify(self, exc: BaseException) -> ErrorClass:
        """The error class of an exception from this sink (a SinkError carries its own)."""
        if isinstance(exc, SinkError):
            return exc.error_class
        if tls_verification_failed(exc):
            return ErrorClass.NON_RETRYABLE
        return self.classify_client_error(exc)

    def classify_client_error(self, exc: BaseException) -> ErrorClass:
        """The error class of a client library's exception; sinks refine this."""
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return ErrorClass.RETRYABLE
        return ErrorClass.NON_RETRYABLE

    def redact(self, text: str) -> str:
        return redact(text, self._secrets)

    @property
    def where(self) -> str:
        """The sink in messages: kind, id, pipeline and what :meth:`whereabouts` adds."""
        more = self.whereabouts()
        return (f"{self.label or self.kind} sink {self.sink_id!r} (pipeline {self.pipeline!r}"
                f"{more and ', ' + more})")

    def whereabouts(self) -> str:
        """What a sink's messages add to name it (its connection, never a secret; its mode)."""
        return ""

    def error(self, exc: BaseException, doing: str) -> SinkError:
        """A SinkError of the right class for ``exc``, whose message says what the sink was
        doing and, where the sink knows it, what to fix; never a secret."""
        if isinstance(exc, SinkError):
            return exc
        text = self.redact(self.describe_client_error(exc))
        msg = (self.explain_tls(exc, text, doing) or self.explain(exc, text, doing)
               or f"{self.where}: {text} while {doing}")
        return ERROR_TYPES[self.classify(exc)](msg)

    def describe_client_error(self, exc: BaseException) -> str:
        return f"{type(exc).__name__}: {exc}"

    def explain(self, exc: BaseException, text: str, doing: str) -> str | None:
        """A message with the fix for errors this sink recognises (authentication, ACLs)."""
        return None

    def explain_tls(self, exc: BaseException, text: str, doing: str) -> str | None:
        """The message of a server certificate the client refused: which sink, which
        connection, and the two things to check."""
        if not tls_verification_failed(exc):
            return None
        conn = self.conn.conn_id if self.conn is not None else "?"
        # The fix first: reports cut long messages, and the client's own text can be long.
        return (f"{self.where}: TLS verification of the server failed while {doing}: connection {conn!r} "
                f"must trust the CA that signed the server's certificate (its CA file setting) and name the "
                f"server by a host name the certificate carries. Nothing was sent to this sink; not retried "
                f"(it does not heal by waiting). The client said: {text}")


def _position_of(event: Any) -> Any:
    """An event's own place in the source log (a control message: where it sits)."""
    return event.position


def is_control(event: Any) -> bool:
    return type(event) is ControlMessage


ERROR_TYPES = {ErrorClass.RETRYABLE: RetryableSinkError, ErrorClass.NON_RETRYABLE: NonRetryableSinkError,
               ErrorClass.FATAL: FatalSinkError}
