"""The delivery coordinator: one run's sub-batches → every sink → commit policy → checkpoints.

Per run (docs/architecture.md, "One run"):

1. ``open()``: open every sink and compute its *effective* start: the store's checkpoint, or
   the sink's own ``committed_checkpoint()`` when that record extends the store's current
   version and lies ahead of it (a sink that committed its data but crashed before the store
   write is not sent that data again; see :mod:`tidegate.sink_checkpoints`). An adopted record is
   written to the store at once, so the store stays the authority, and the adopted stretch is
   credited to the journaled attempt that delivered it, in the same store transaction
   (:func:`~tidegate.sink_checkpoints.delivering_attempt`).
2. ``run(items)``: cut the source stream into sub-batches; for each one, deliver to all sinks
   concurrently, each sink getting only ``batch.after(its position)`` (nothing at all when it
   needs nothing); retry per the sink's policy; evaluate the commit policy *before* any
   checkpoint write; then write the checkpoints of the sinks that acknowledged, in one store
   transaction under the run's fencing epoch.

A sink that fails a sub-batch gets no further sub-batches in this run: delivering later data
would leave a gap behind its checkpoint. It catches up from its own checkpoint next run.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from .batching import SubBatch, Transaction, cut_sub_batches
from .collector import fewer_collections
from .errors import (
    CommitPolicyError,
    ErrorClass,
    FatalRunError,
    OperatorSinkError,
    SinkTimedOutError,
    TimedOutTransactionError,
)
from .events import ControlMessage
from .positions import Position, later, lowest_start, position_to_json
from .retry import RetryFailure, call_with_retry, policy_for
from .sink_checkpoints import (
    Adoption,
    RunStart,
    SinkCheckpoint,
    adopt,
    delivering_attempt,
    lost_by_sink,
    rewind_command,
)
from .sinks.base import Sink
from .sources.base import SourceItem
from .spec import BatchSpec
from .store.base import CheckpointStore
from .store.records import CheckpointRecord

MAX_ERROR_CHARS = 500
log = logging.getLogger(__name__)


@dataclass
class SinkReport:
    """What one sink got in a run: it started at ``start`` (its effective start) and ended at
    ``end``; ``checkpoint``/``version`` are its stored checkpoint now (behind ``end`` only in a
    replay, which never moves checkpoints back)."""

    sink_id: str
    kind: str
    required: bool
    start: Position | None
    end: Position | None
    checkpoint: Position | None = None
    version: int | None = None
    events: int = 0
    bytes: int = 0
    deliveries: int = 0  # deliver() calls that succeeded
    dlq: int = 0  # events the sink dead-lettered (on_poison: dlq)
    duplicates: int = 0  # NATS: messages the server had already stored
    skipped: int = 0  # NATS: messages read back as stored by an earlier attempt, not published again
    status: str = "ok"  # ok | failed
    # The sink holds less than the store says it received (its own record is missing or older):
    # what it lost and the rewind that delivers it again (_may_deliver).
    lost: str | None = None
    error: str | None = None
    error_class: str | None = None
    # Per target (topic, subject, stream, table path: Sink.target_of) that got events in this run:
    # {"events": n, "tables": ["schema.table", ...]}, the source tables it got them from. What the
    # deliver task's asset events and lineage report.
    targets: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    def to_json(self) -> dict[str, Any]:
        return {"id": self.sink_id, "kind": self.kind, "required": self.required,
                "start": position_to_json(self.start), "end": position_to_json(self.end),
                "checkpoint": position_to_json(self.checkpoint), "version": self.version,
                "events": self.events, "bytes": self.bytes, "deliveries": self.deliveries,
                "dlq": self.dlq, "duplicates": self.duplicates, "skipped": self.skipped,
                "status": self.status, "error": self.error, "error_class": self.error_class,
                "lost": self.lost, "targets": {k: dict(v) for k, v in self.targets.items()}}


@dataclass
class RunReport:
    pipeline: str
    run_id: str
    epoch: int
    sinks: dict[str, SinkReport]
    sub_batches: int = 0
    events: int = 0  # events read from the source (each counted once, not per sink)
    bytes: int = 0
    end_position: Position | None = None  # end of the last sub-batch
    spilled: int = 0  # sub-batches whose transaction passed the limits: read back from local disk

    def to_json(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "run_id": self.run_id, "epoch": self.epoch,
                "sub_batches": self.sub_batches, "events": self.events, "bytes": self.bytes,
                "spilled_sub_batches": self.spilled,
                "end_position": position_to_json(self.end_position),
                "sinks": [s.to_json() for s in self.sinks.values()]}


def policy_holds(policy: BatchSpec, sinks: Sequence[Sink], acked: set[str]) -> bool:
    """The commit policy (docs/architecture.md), for one sub-batch."""
    if policy.commit_policy == "required":
        return all(s.sink_id in acked for s in sinks if s.required)
    if policy.commit_policy == "all":
        return all(s.sink_id in acked for s in sinks)
    if policy.commit_policy == "quorum":
        return len(acked & {s.sink_id for s in sinks}) >= quorum_of(policy, sinks)
    raise ValueError(f"unknown commit policy {policy.commit_policy!r}")


def quorum_of(policy: BatchSpec, sinks: Sequence[Sink]) -> int:
    """The sinks a quorum policy needs in this run: ``quorum``, or every sink the run delivers
    to when it delivers to fewer (a replay to one sink, ``sinks: [a]``): the quorum could
    never be met otherwise."""
    return min(policy.quorum or 0, len(sinks))


def _count_targets(targets: dict[str, dict[str, Any]], sink: Sink, part: SubBatch) -> None:
    for table, n in part.table_counts.items():
        name = sink.target_of(table)
        if name is None:
            continue
        entry = targets.setdefault(name, {"events": 0, "tables": []})
        entry["events"] += n
        if (spelled := f"{table.schema}.{table.table}") not in entry["tables"]:
            entry["tables"].append(spelled)


def _describe(exc: BaseException) -> str:
    cause = exc.cause if isinstance(exc, RetryFailure) else exc
    text = f"{type(cause).__name__}: {cause}"
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "..."


class Coordinator:
    def __init__(self, store: CheckpointStore, pipeline: str, run_id: str, epoch: int,
                 sinks: Sequence[Sink], policy: BatchSpec, *, journal_id: int | None = None,
                 sleep: Callable[[float], object] | None = None, rng: random.Random | None = None,
                 starts: Mapping[str, Position | None] | None = None,
                 ends: Mapping[str, Position] | None = None, tenant: str = "default"):
        """``starts``/``ends`` (replay): deliver each listed sink exactly (start, end], whatever
        its checkpoint says; checkpoints still only move forward."""
        if not sinks:
            raise ValueError("a run needs at least one sink")
        if len({s.sink_id for s in sinks}) != len(sinks):
            raise ValueError("sink ids must be unique")
        if policy.commit_policy == "quorum" and not policy.quorum:
            raise ValueError("commit_policy quorum needs quorum >= 1")
        self.store, self.pipeline, self.run_id, self.epoch = store, pipeline, run_id, epoch
        self.tenant = tenant
        self.sinks, self.policy, self.journal_id = list(sinks), policy, journal_id
        self._stop = threading.Event()  # set on a fatal error: retries in other sinks give up
        self._sleep = sleep or self._stop.wait
        self._rng = rng
        self._opened = False
        self._starts, self._ends = dict(starts or {}), dict(ends or {})
        # Control messages a sink's checkpoint version owes it (an accepted gap, a failover):
        # delivered before anything after that checkpoint, then settled by a new version.
        self._owed: dict[str, ControlMessage] = {}
        # Where the store had a sink before this run adopted the sink's own record, when no
        # journaled attempt could be credited with the adopted stretch (delivering_attempt): the
        # stretch is journaled as this run's, so every stored version lies in some run's range.
        self._adopted_from: dict[str, Position | None] = {}
        # Sinks that cannot refuse a zombie's writes themselves: the lease is checked before
        # each sub-batch for them (a run stopped after the check still writes one sub-batch).
        self._unfenced = [s.sink_id for s in sinks if not s.fences_zombies]
        # Sinks failed on what only an operator clears (errors.OperatorSinkError): a run the
        # commit policy fails for them alone is fatal, since a retry would fail the same way.
        self._awaiting_operator: set[str] = set()
        self.report = RunReport(pipeline, run_id, epoch, {
            s.sink_id: SinkReport(s.sink_id, s.kind, s.required, None, None) for s in sinks})

    # ------------------------------------------------------------------ life cycle

    def __enter__(self) -> Coordinator:
        try:
            self.open()
        except BaseException:
            # __exit__ does not run when __enter__ raises: close the sinks opened so far here
            # (a Spark Connect session left open hangs the process's exit in gRPC's close).
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> dict[str, Position | None]:
        """Open the sinks and compute each one's effective start (idempotent)."""
        if not self._opened:
            self._opened = True
            with ThreadPoolExecutor(max_workers=len(self.sinks)) as pool:
                futures = {pool.submit(self._open_one, s): s for s in self.sinks}
                for fut in as_completed(futures):
                    self._opened_one(futures[fut], fut)
        return self.effective_positions()

    def _open_one(self, sink: Sink) -> SinkCheckpoint | None:
        def go() -> SinkCheckpoint | None:
            sink.epoch = self.epoch  # the sink claims it on open (fencing older runs' writers)
            sink.open()
            return sink.committed_checkpoint()

        return self._retry(sink, go)

    def _opened_one(self, sink: Sink, fut: Future) -> None:
        rep = self.report.sinks[sink.sink_id]
        rec = self.store.checkpoints.get(self.pipeline, sink.sink_id)
        rep.checkpoint, rep.version = (rec.position, rec.version) if rec else (None, None)
        if fut.exception() is not None:
            self._fail(sink, fut.exception())
            rep.start = rep.end = rep.checkpoint
            return
        if sink.keeps_record and not _may_deliver(self, sink, rec, fut.result()):
            rep.start = rep.end = rep.checkpoint
            return
        adoption = adopt(rec, fut.result())
        if adoption.adopted:
            self._record_adoption(sink, adoption)
        elif rec is not None and rec.control:
            self._owed[sink.sink_id] = ControlMessage.from_json(rec.control, tenant=self.tenant)
        if sink.sink_id in self._starts:
            rep.start = rep.end = self._starts[sink.sink_id]
        else:
            rep.start = rep.end = rep.checkpoint
        if sink.reads_run_start:  # (after an adoption, its version is the current one)
            history = tuple(self.store.checkpoints.history(self.pipeline, sink.sink_id))
            sink.run_start = RunStart(rep.start, history[-1] if history else None, history)

    def _record_adoption(self, sink: Sink, adoption: Adoption) -> None:
        """The sink committed a sub-batch whose store write was lost (a crash in between): the
        store takes the sink's record as a new version before anything else happens."""
        rep = self.report.sinks[sink.sink_id]
        was = rep.checkpoint
        # The stretch is credited to the attempt that delivered it, in the adoption's transaction.
        credited = delivering_attempt(self.store, self.pipeline, sink.sink_id, was, before=self.journal_id)
        journal = None if credited is None else (credited, {sink.sink_id: (was, adoption.position)})
        written = self.store.checkpoints.write_many(self.pipeline, {sink.sink_id: adoption.position},
                                                    run_id=self.run_id, epoch=self.epoch, kind="adopt",
                                                    reason=adoption.why, journal=journal)[sink.sink_id]
        log.warning("pipeline %s: sink %s: %s; the store now holds it as version %d%s", self.pipeline,
                    sink.sink_id, adoption.why, written.version,
                    "" if credited is None else f", credited to journal entry {credited}")
        rep.checkpoint, rep.version = written.position, written.version
        if credited is None:
            self._adopted_from[sink.sink_id] = was

    def close(self) -> None:
        for s in self.sinks:
            try:
                s.close()
            except Exception:  # noqa: BLE001, S110 - close must not mask the run's outcome
                pass

    def effective_positions(self) -> dict[str, Position | None]:
        return {sid: r.start for sid, r in self.report.sinks.items()}

    def lowest_start(self) -> Position | None:
        """Where the source read starts: the lowest effective position of the sinks that can
        receive (a sink that failed to open is behind anyway and catches up next run)."""
        live = [r.start for r in self.report.sinks.values() if not r.failed]
        return lowest_start(live or [r.start for r in self.report.sinks.values()])

    # ------------------------------------------------------------------ the run

    def run(self, items: Iterable[SourceItem]) -> RunReport:
        """Deliver the stream; raises CommitPolicyError / FatalRunError / StaleEpochError.

        Reading overlaps delivery: a reader thread cuts the next sub-batch while this one is
        delivered (at most two sub-batches in memory); sub-batches are still delivered and
        committed one after the other, in source order."""
        self.open()
        status = "failed"
        try:
            with fewer_collections(), \
                    ThreadPoolExecutor(max_workers=len(self.sinks), thread_name_prefix="deliver") as pool:
                for batch in read_ahead(cut_sub_batches(items, max_events=self.policy.max_events,
                                                        max_bytes=self.policy.max_bytes,
                                                        respect_source_tx=self.policy.respect_source_tx)):
                    self._sub_batch(pool, batch)
                self._settle_owed(pool)
            status = "success"
            return self.report
        finally:
            self._stop.set()
            self._count_sink_tallies()
            self._journal_after(status)

    def _journal_after(self, status: str) -> None:
        """Journal the run's end. When the run failed, a journal write that fails too (the
        store's server gone or hung: the likely cause of the failure itself) is logged and
        the run's own error propagates, not this second one."""
        try:
            self._journal(status)
        except Exception as exc:  # noqa: BLE001 - re-raised below unless the run failed anyway
            if status == "success":
                raise
            log.warning("pipeline %s run %s: cannot journal the failed run: %s", self.pipeline,
                        self.run_id, exc)

    def _count_sink_tallies(self) -> None:
        for sink in self.sinks:
            rep = self.report.sinks[sink.sink_id]
            rep.dlq, rep.duplicates, rep.skipped = sink.dlq_count, sink.duplicates, sink.skipped

    def _settle_owed(self, pool: ThreadPoolExecutor) -> None:
        """Owed control messages of sinks that received nothing in this run: delivered alone,
        at the sink's checkpoint."""
        owed = {sid for sid in self._owed if not self.report.sinks[sid].failed}
        if not owed:
            return
        at = {sid: self.report.sinks[sid].end for sid in owed if self.report.sinks[sid].end is not None}
        parts = {sid: SubBatch(0, (Transaction(None, pos, (self._owed[sid],)),)) for sid, pos in at.items()}
        acked = self._deliver_parts(pool, parts)
        self._write(sink_positions={sid: at[sid] for sid in acked}, kind="control")

    def _sub_batch(self, pool: ThreadPoolExecutor, batch: SubBatch) -> None:
        self.report.sub_batches += 1
        self.report.events += batch.event_count
        self.report.bytes += batch.byte_size
        if batch.spilled:
            self.report.spilled += 1
            log.info("%s run %s: sub-batch %d is a transaction of %d events (%d bytes), past the "
                     "sub-batch limits: kept on local disk, each sink reads it back in frames",
                     self.pipeline, self.run_id, batch.seq, batch.event_count, batch.byte_size)
        if self._unfenced:
            _check_lease(self, batch)
        acked = self._deliver_all(pool, batch)
        if not policy_holds(self.policy, self.sinks, acked):
            raise _policy_error(self, batch, acked)
        self._commit(batch, acked)
        self.report.end_position = batch.end_position

    def _deliver_all(self, pool: ThreadPoolExecutor, batch: SubBatch) -> set[str]:
        """Deliver to every live sink at once; returns the ids of the sinks that have the batch."""
        acked: set[str] = set()
        parts: dict[str, SubBatch] = {}
        for sink in self.sinks:
            rep = self.report.sinks[sink.sink_id]
            if rep.failed:
                continue
            limit = self._ends.get(sink.sink_id)
            part = batch.after(rep.end).until(limit)
            owed = self._owed.get(sink.sink_id)
            if owed is not None and rep.end is not None:  # first what the checkpoint owes
                part = SubBatch(part.seq, (Transaction(None, rep.end, (owed,)), *part.transactions))
            if part.event_count or (sink.record_tracks_data and _moves(part, rep.end, limit)):
                parts[sink.sink_id] = part
            else:  # already has it all, or only positions: no call
                acked.add(sink.sink_id)
        return acked | self._deliver_parts(pool, parts)

    def _deliver_parts(self, pool: ThreadPoolExecutor, parts: Mapping[str, SubBatch]) -> set[str]:
        """Deliver each sink its part, concurrently, with retries; the ids of those that took it."""
        futures: dict[Future, tuple[Sink, SubBatch]] = {}
        for sink in self.sinks:
            part = parts.get(sink.sink_id)
            if part is not None:
                extends = self.report.sinks[sink.sink_id].version or 0
                futures[pool.submit(self._retry, sink, lambda s=sink, p=part, v=extends: s.deliver(p, v))
                        ] = (sink, part)
        return {futures[f][0].sink_id for f in as_completed(futures) if self._delivered(*futures[f], f)}

    def _delivered(self, sink: Sink, part: SubBatch, fut: Future) -> bool:
        exc = fut.exception()
        if exc is None:
            rep = self.report.sinks[sink.sink_id]
            rep.events += part.event_count
            rep.bytes += part.byte_size
            rep.deliveries += 1
            _count_targets(rep.targets, sink, part)
            return True
        self._fail(sink, exc)
        return False

    def _fail(self, sink: Sink, exc: BaseException) -> None:
        rep = self.report.sinks[sink.sink_id]
        cls = exc.error_class if isinstance(exc, RetryFailure) else ErrorClass.NON_RETRYABLE
        rep.status, rep.error, rep.error_class = "failed", _describe(exc), cls.value
        cause = exc.cause if isinstance(exc, RetryFailure) else exc
        if isinstance(cause, OperatorSinkError):
            self._awaiting_operator.add(sink.sink_id)
        if cls is ErrorClass.FATAL:
            self._stop.set()  # other sinks stop retrying; the run ends now
            holds, note = _lease_note(self.store, self.pipeline, self.epoch)
            if isinstance(cause, TimedOutTransactionError) and holds:
                # Nothing took over: a new attempt (a new producer) delivers what was aborted.
                raise SinkTimedOutError(f"pipeline {self.pipeline!r}: sink {sink.sink_id!r} failed "
                                        f"({rep.error}){note}; a new attempt of the run "
                                        f"delivers it") from exc
            raise FatalRunError(f"pipeline {self.pipeline!r}: sink {sink.sink_id!r} failed fatally "
                                f"({rep.error}){note}; the run stops and must not be "
                                f"retried") from exc

    def _retry(self, sink: Sink, fn: Callable[[], Any]) -> Any:
        return call_with_retry(fn, policy_for(sink), sink.classify, sleep=self._sleep, rng=self._rng,
                               should_stop=self._stop.is_set)

    def _commit(self, batch: SubBatch, acked: set[str]) -> None:
        """Advance, in one store transaction, the checkpoints of the sinks that have the batch
        and whose stored checkpoint is behind its end (never backwards)."""
        moves = {}
        for sid in sorted(acked):
            rep = self.report.sinks[sid]
            end = self._reached(sid, batch)
            rep.end = later(rep.end, end)
            # An owed control message was delivered: a new version settles it, even in place.
            if rep.checkpoint is None or end > rep.checkpoint or sid in self._owed:
                moves[sid] = later(rep.checkpoint, end)
        self._write(moves)

    def _reached(self, sink_id: str, batch: SubBatch) -> Position:
        """Where a sink that has ``batch`` stands: its end, or, in a replay, no further than the
        end of the sink's range (the part of the batch past it was not given to that sink: a
        sink whose past run stopped short, an optional sink that failed, must not be moved over
        changes it never got)."""
        end, limit = batch.end_position, self._ends.get(sink_id)
        return end if limit is None or end <= limit else limit

    def _write(self, sink_positions: Mapping[str, Position], kind: str = "write") -> None:
        if not sink_positions:
            return
        # The journal follows every move, in the same store transaction: an attempt killed before
        # its end has journaled what it gave each sink, so a clear of the run re-sends it.
        journal = None if self.journal_id is None else (self.journal_id, {
            sid: (self._journal_start(sid), self.report.sinks[sid].end) for sid in sink_positions})
        written = self.store.checkpoints.write_many(self.pipeline, sink_positions, run_id=self.run_id,
                                                    epoch=self.epoch, kind=kind, journal=journal)
        for sid, rec in written.items():
            self.report.sinks[sid].checkpoint = rec.position
            self.report.sinks[sid].version = rec.version
            self._owed.pop(sid, None)

    def _journal_start(self, sink_id: str) -> Position | None:
        """Where this run's journaled range for the sink starts: its start, or, where this run
        took an adopted stretch as its own, where the store had the sink before."""
        rep = self.report.sinks[sink_id]
        replay = sink_id in self._starts
        return rep.start if replay else self._adopted_from.get(sink_id, rep.start)

    def _journal(self, status: str) -> None:
        if self.journal_id is None:
            return
        for rep in self.report.sinks.values():
            start = self._journal_start(rep.sink_id)
            self.store.runs.sink(self.journal_id, rep.sink_id, start=start, end=rep.end,
                                 events=rep.events, bytes=rep.bytes, status=rep.status, error=rep.error,
                                 dlq=rep.dlq)
        self.store.runs.finish(self.journal_id, status)


def _may_deliver(co: Coordinator, sink: Sink, rec: CheckpointRecord | None,
                 side: SinkCheckpoint | None) -> bool:
    """Whether the sink may be delivered to: False when its own record proves it lost changes
    it acknowledged (:func:`lost_by_sink`) and the record goes only with its data
    (``Sink.record_tracks_data``): the sink fails naming the two rewinds (deliver them again,
    or go on without them), and nothing is delivered to it or moves its checkpoint. Any other
    sink whose record says so is named in a warning and gets what follows the store's
    checkpoint. Either way the run's report carries what was said."""
    if rec is None or rec.kind not in ("write", "adopt", "rewind"):
        return True
    found = lost_by_sink(rec, side, co.store.checkpoints.history(co.pipeline, sink.sink_id),
                         exact=sink.record_tracks_data)
    if found is None:
        return True
    what, target = found
    again = rewind_command(co.pipeline, sink.sink_id, target)
    if not sink.record_tracks_data:
        said = (f"{what}. It gets what follows the store's checkpoint only; to deliver the missing "
                f"changes again: {again}")
        log.warning("pipeline %s: %s", co.pipeline, said)
        co.report.sinks[sink.sink_id].lost = said
        return True
    on = rewind_command(co.pipeline, sink.sink_id, rec.version)
    said = (f"{what}. Nothing is delivered to it until an operator chooses: to deliver the missing "
            f"changes again, {again}; to go on without them, {on}")
    co.report.sinks[sink.sink_id].lost = said
    log.error("pipeline %s: %s", co.pipeline, said)
    # The commands first: a sink's error is cut short in the run's report and one-line error.
    co._fail(sink, OperatorSinkError(
        f"pipeline {co.pipeline!r}: sink {sink.sink_id} lost changes it had acknowledged, or holds "
        f"no record of them; nothing is delivered to it until an operator runs `{again}` (delivers "
        f"them again) or `{on}` (goes on without them); the log and the run report's 'lost' say what "
        f"it holds"))
    return False


def _moves(part: SubBatch, end: Position | None, limit: Position | None) -> bool:
    """Whether a part of positions only takes the sink past ``end`` within its range: a
    sink whose record follows every version its store checkpoint takes is called for it
    (Sink.record_tracks_data). Not for the positioned tail a part keeps when the sink already
    has it all, or when a replay's range ends before it: a record set there would move back,
    or past changes the sink never got."""
    return (end is None or part.end_position > end) and (limit is None or part.end_position <= limit)


def _check_lease(co: Coordinator, batch: SubBatch) -> None:
    """Before ``batch``, for sinks that would take a zombie's writes: the run must still hold the
    lease, or it stops (fatal: a newer run took over) before it writes anything of ``batch``."""
    lease = co.store.leases.get(co.pipeline)  # a store that does not answer fails the run (retried)
    holds, note = _holder_note(lease, co.epoch)
    if not holds:
        raise FatalRunError(f"pipeline {co.pipeline!r}: fenced before sub-batch {batch.seq}{note}: "
                            f"{', '.join(co._unfenced)} cannot refuse this run's writes themselves, so "
                            f"it writes nothing more; the run stops and must not be retried")


def _lease_note(store: CheckpointStore, pipeline: str, epoch: int) -> tuple[bool, str]:
    """(does the run still hold the pipeline's lease, a note saying who holds it): tells a sink
    fenced by a run that took over from one that failed on its own (e.g. a Kafka transaction
    that timed out). (False, "") when the store cannot say: treated as taken over, the safe
    answer; the sink's error is what is reported."""
    try:
        lease = store.leases.get(pipeline)
    except Exception:  # noqa: BLE001 - cannot tell
        return False, ""
    return _holder_note(lease, epoch)


def _holder_note(lease: Mapping[str, Any] | None, epoch: int) -> tuple[bool, str]:
    """(is ``lease`` this run's, a note saying who holds it) for the lease the store returned."""
    if lease is None:
        return False, ""
    if lease["epoch"] == epoch:
        return True, f"; the pipeline's lease is still this run's (epoch {epoch}): no other run took over"
    return False, (f"; run {lease['run_id']!r} took the pipeline's lease (epoch {lease['epoch']}, this run's "
                   f"{epoch}) at {lease['acquired_at']}")


def _policy_error(co: Coordinator, batch: SubBatch, acked: set[str]) -> CommitPolicyError:
    """The run's error for a sub-batch the policy did not let commit. Fatal (a scheduler must
    not retry the run) when the policy fails even if every sink but those awaiting an operator
    took it: a retry would fail the same way within seconds. Any other failure (a server away,
    an error no rule knows) leaves the scheduler's retries to it."""
    message = _policy_message(co.pipeline, co.policy, co.sinks, co.report, batch, acked)
    could = {s.sink_id for s in co.sinks} - co._awaiting_operator
    if policy_holds(co.policy, co.sinks, could):
        return CommitPolicyError(message)
    return CommitPolicyError(f"{message}. Not worth a retry: only an operator clears the failures above",
                             fatal=True)


def _policy_message(pipeline: str, policy: BatchSpec, sinks: Sequence[Sink], report: RunReport,
                    batch: SubBatch, acked: set[str]) -> str:
    failed = [f"{s.sink_id} ({'required' if s.required else 'optional'}): "
              f"{report.sinks[s.sink_id].error or 'failed earlier in this run'}"
              for s in sinks if s.sink_id not in acked]
    need = {"required": "every required sink", "all": "every sink",
            "quorum": f"at least {quorum_of(policy, sinks)} sinks"}[policy.commit_policy]
    return (f"pipeline {pipeline!r}: sub-batch {batch.seq} (ending at {batch.end_position}) "
            f"reached {len(acked)} of {len(sinks)} sinks; commit policy "
            f"{policy.commit_policy!r} needs {need}. No checkpoint moved for it. "
            f"Failed: " + "; ".join(failed))


_END = object()


def read_ahead(batches: Iterator[SubBatch], depth: int = 1) -> Iterator[SubBatch]:
    """Cut the next sub-batch in a thread while the caller delivers this one: reading (binlog
    decoding, Spark partitions) overlaps delivery. ``depth`` sub-batches wait at most, so memory
    holds about two; an error in the reader is raised here, in order."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = threading.Event()

    def offer(item: object) -> bool:
        while not done.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False  # the consumer is gone

    def produce() -> None:
        try:
            for b in batches:
                if not offer(b):
                    return
            offer(_END)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            offer(exc)
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()  # the source's reader ends here, whoever stopped first

    reader = threading.Thread(target=produce, name="read-ahead", daemon=True)
    reader.start()
    try:
        while True:
            item = q.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        done.set()  # the consumer stopped (an error, a halt): the reader stops at its next put
        reader.join(timeout=5)


def run_once(store: CheckpointStore, pipeline: str, run_id: str, sinks: Sequence[Sink],
             policy: BatchSpec, read: Callable[[Position | None], Iterable[SourceItem]], *,
             journal_id: int | None = None) -> RunReport:
    """Convenience for callers without Airflow: take the lease, open the sinks, read from the
    lowest effective start with ``read(start)`` and deliver."""
    epoch = store.leases.acquire(pipeline, run_id)
    with Coordinator(store, pipeline, run_id, epoch, sinks, policy, journal_id=journal_id) as co:
        return co.run(read(co.lowest_start()))


__all__ = ["Coordinator", "RunReport", "SinkReport", "policy_holds", "run_once"]
