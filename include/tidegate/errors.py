"""Error classes shared by sources, sinks and the coordinator.

Each sink failure carries an :class:`ErrorClass` that decides what happens next: retryable →
backoff, then the sink fails for the sub-batch; non-retryable → the sink fails at once; fatal →
the whole run stops and must not be retried. Engine errors that a retry cannot fix say so with
``fatal`` (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import enum
from typing import Any


class ErrorClass(enum.Enum):
    RETRYABLE = "retryable"
    NON_RETRYABLE = "non_retryable"
    FATAL = "fatal"


class TidegateError(Exception):
    """Base of every error the engine raises on purpose. ``fatal``: a retry cannot fix it (a
    wrong spec or setting, lost changes, a fenced writer), so a scheduler must not retry."""

    fatal: bool = False

    def __reduce__(self):
        # Rebuilt as the same class with the same attributes (subclasses take keyword-only
        # arguments, which the default reduction loses): errors cross process boundaries (a
        # reader process, reader_process.py) and must still be themselves on the other side.
        return (_rebuild_error, (type(self), self.args, self.__dict__))


class IncomparablePositionsError(TidegateError, TypeError):
    """Two positions of different source identities (servers, clusters, timelines) were
    ordered. ``a`` and ``b`` are the positions."""

    fatal = True

    def __init__(self, message: str, *, a: object = None, b: object = None):
        super().__init__(message)
        self.a = a
        self.b = b


class SpecError(TidegateError):
    """A pipeline spec is invalid; ``problems`` holds one line per problem."""

    fatal = True

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class ConnectionConfigError(TidegateError):
    """A connection is missing or malformed (never includes the secret)."""

    fatal = True


class TlsVerificationError(ConnectionConfigError):
    """The server's TLS certificate did not verify: it is not signed by the CA the connection
    trusts, or it does not carry the host name the connection names. The server may not be the
    one configured, so nothing is sent to it (not even the password) and nothing is retried: the
    same certificate would fail again. The message names the connection and the fix."""

    fatal = True


class SinkError(TidegateError):
    """A sink failed; ``error_class`` says whether to retry, fail or stop the run."""

    error_class: ErrorClass = ErrorClass.NON_RETRYABLE

    def __init__(self, message: str, *, error_class: ErrorClass | None = None):
        super().__init__(message)
        if error_class is not None:
            self.error_class = error_class

    @property
    def fatal(self) -> bool:  # type: ignore[override]
        return self.error_class is ErrorClass.FATAL


class RetryableSinkError(SinkError):
    error_class = ErrorClass.RETRYABLE


class NonRetryableSinkError(SinkError):
    error_class = ErrorClass.NON_RETRYABLE


class OperatorSinkError(NonRetryableSinkError):
    """A sink failure only an operator clears: changes the sink lost, to choose a rewind for; an
    event it refuses under ``on_poison: halt``; a server set to evict any key (Redis). Every run
    fails the same way until then, so a run the commit policy fails for such sinks alone is fatal
    (:class:`CommitPolicyError`)."""


class PoisonEventError(OperatorSinkError):
    """One event this sink rejects on its own (too large, a name it cannot take), not a sink-wide
    failure; with ``on_poison: halt`` the run fails naming it. ``events`` are the events."""

    def __init__(self, message: str, *, events: list | None = None):
        super().__init__(message)
        self.events = list(events or [])


class FatalSinkError(SinkError):
    error_class = ErrorClass.FATAL


class TimedOutTransactionError(FatalSinkError):
    """The sink's transaction outlived its timeout and the server aborted it (a Kafka producer
    fenced by its own transaction.timeout.ms): the sink cannot go on in this process, but nothing
    else took over, so a new attempt of the run can deliver it (the coordinator fails the run
    as retryable while the run still holds the lease)."""


class SinkTimedOutError(TidegateError):
    """A sink's transaction timed out (a stall, a sub-batch too slow) while the run still held
    the lease: the run fails and a new attempt delivers it; Airflow retries it."""


class SourceError(TidegateError):
    """A source cannot be read as configured (settings, privileges, connection)."""


class SourceSettingError(SourceError):
    """A server setting CDC needs is wrong; the message names the setting and the fix."""

    fatal = True


class ForeignPositionError(SourceError):
    """A position of another server than the one the connection reaches now (it moved since
    the position was taken, e.g. a failover after a run's bounds step): a retry of the same run
    reads it there again and fails the same way; the next run's failover guard places the
    checkpoints on this server."""

    fatal = True


class ChangesLostError(SourceError):
    """The log no longer holds changes a checkpoint needs. ``kind`` names the incident
    (``binlog_purged``, ``slot_dropped``, ``slot_invalidated``), ``requested`` the position the
    caller needed, ``earliest_available`` where the log can be read from now (when known)."""

    fatal = True

    kind = "changes_lost"

    def __init__(self, message: str, *, requested=None, earliest_available=None):
        super().__init__(message)
        self.requested = requested
        self.earliest_available = earliest_available


class PositionPurgedError(ChangesLostError):
    """The requested position is no longer on the server (purged binlog, recycled WAL)."""

    kind = "binlog_purged"


class SlotMissingError(ChangesLostError):
    """The Postgres replication slot does not exist."""

    kind = "slot_dropped"


class SlotInvalidatedError(ChangesLostError):
    """The Postgres replication slot lost WAL it needs (wal_status = lost)."""

    kind = "slot_invalidated"


class CannotTranslateError(SourceError):
    """A checkpoint of one server cannot be placed on another (no GTIDs, another kind of log)."""

    fatal = True


class SnapshotError(SourceError):
    """A snapshot cannot be taken as asked (a table without a primary key, a table the pipeline
    does not capture, a source that cannot snapshot); the message names the table and the fix."""

    fatal = True


class StaleEpochError(TidegateError):
    """A checkpoint write came from a run whose lease epoch is no longer current (a zombie)."""

    fatal = True


class ContinuityHalt(TidegateError):
    """The pipeline must not run: changes may have been lost, or a schema change waits for an
    operator (an incident records where)."""

    fatal = True

    def __init__(self, incident: Any, message: str | None = None):
        self.incident = incident
        super().__init__(message or halt_message(incident))


def halt_message(inc: Any) -> str:
    def at(p: Any) -> str:
        return "the beginning" if p is None else str(p)

    if inc.kind == "schema_change":
        return (f"pipeline {inc.pipeline!r} is halted by incident #{inc.id} (schema_change, detected "
                f"{inc.detected_at}) at {at(inc.from_position)}: {inc.detail}. The rows before it were "
                f"delivered; trigger the DAG with resolve=continue and a reason to go on past it.")
    return (f"pipeline {inc.pipeline!r} is halted by incident #{inc.id} ({inc.kind}, detected "
            f"{inc.detected_at}): changes from {at(inc.from_position)} to {at(inc.to_position)} "
            f"may be missing{': ' + inc.detail if inc.detail else ''}. Resolve it by triggering "
            f"the DAG with resolve=resnapshot (re-load the tables) or resolve=accept_gap, and a reason.")


class CommitPolicyError(TidegateError):
    """A sub-batch was not delivered to enough sinks; no checkpoint moved. ``fatal`` when only
    an operator can make the policy hold again (:class:`OperatorSinkError`)."""

    def __init__(self, message: str, *, fatal: bool = False):
        super().__init__(message)
        self.fatal = fatal


class RunError(TidegateError):
    """A run was asked for something it cannot do (unknown sink, replay of an unknown run)."""

    fatal = True


class FatalRunError(TidegateError):
    """A fatal sink error stopped the run; Airflow must not retry it."""

    fatal = True


class DeliveryTaskError(TidegateError):
    """The Spark task delivering a run failed on every attempt Spark made, on an engine error
    a retry may fix (the source or the store away): Airflow retries the run."""


def _rebuild_error(cls: type, args: tuple, attrs: dict) -> TidegateError:
    exc = cls.__new__(cls)
    exc.args = args
    for name, value in attrs.items():
        setattr(exc, name, value)
    return exc
