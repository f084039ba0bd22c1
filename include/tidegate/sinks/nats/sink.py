"""NATS JetStream sink (nats-py): exactly once per stream, by server-side dedup within the
window and by reading back what an earlier attempt stored.

Each event is published to the subject from the sink's ``subject`` template with header
``Nats-Msg-Id`` = its ``idempotency_key``: JetStream stores a message once per id within the
stream's ``duplicate_window``, so a re-delivered sub-batch is not stored twice. Acks are awaited
with at most ``max_in_flight`` publishes outstanding (each ack for up to the connection's extra
``publish_timeout``, 10 s by default); duplicates the server reports are counted
(:attr:`NatsSink.duplicates`) and logged.

Control messages go to ``{pipeline}.__control`` (or the sink's ``control``) with their own
stable ``Nats-Msg-Id``; the stream captures that subject and the DLQ subject too (added to a
stream created before them). An event the server cannot take whatever is retried (over
``max_payload``, a subject that is not valid) is poison: ``on_poison: halt`` fails the sub-batch
before anything is published; ``dlq`` publishes its dead-letter record to ``{pipeline}.__dlq``
(or the sink's ``dlq``) in its place, with ``Nats-Msg-Id`` ``dlq|<idempotency_key>``.

Each sink has a checkpoint subject, ``{pipeline}.__checkpoint.{sink_id}``, in the same stream.
Once every message of a sub-batch is acknowledged, a commit marker is published there carrying
``Tidegate-Position`` (the sub-batch's end position, JSON), ``Tidegate-Extends`` (the store
version this delivery extends, see :mod:`tidegate.sink_checkpoints`), ``Tidegate-Checkpoint-Key``
and ``Tidegate-Epoch`` (the run's lease epoch). So the last marker names a position whose every
event is stored; :meth:`NatsSink.committed_checkpoint` reads it, and a crash between the
publish and the checkpoint-store write needs no re-publish.

Reading back: what a stream holds after the sink's last commit marker was stored by an attempt
whose marker never came (a run stalled past its ack wait, killed, cut off). Before the first
publish of a run and before every retry of a failed attempt, the sink reads the ``Nats-Msg-Id``
of every message on its subjects (data, control, DLQ) with a stream sequence after that marker
(an ephemeral headers-only consumer per subject filter) and does not publish those again; the
run report counts them (``skipped``). So a sub-batch is stored once also when its retry comes
after ``duplicate_window``, and when the next run reads the other server of a GTID pair (a
change is then known by its transaction and place there, a schema change by its DDL's GTID and
table: :mod:`.read_back`). A claim carries the
last commit marker's stream sequence forward in ``Tidegate-Commit-Seq``, so a run that died
before committing anything does not hide what it stored from the next. Skipping keeps per-key
order when what was stored is a prefix of the sub-batch (publishes are pipelined in order on one
connection); a message refused in the middle of an attempt (an error) and published by the retry
after later ones of the same key would not be.

Zombie writers are fenced with JetStream's per-subject optimistic concurrency. On open the
sink claims the checkpoint subject: it reads the last marker (refusing when a newer epoch
wrote it) and publishes a claim (the last record carried forward, with its own epoch) with
``Nats-Expected-Last-Subject-Sequence`` set to the marker it read. Every commit marker then
expects the subject's last sequence to be this sink's own previous marker: once a newer run has
claimed the subject, the old run's marker is refused by the server and the old run stops with a
fatal "fenced" error. Data publishes cannot be made conditional on the checkpoint subject, so
the claim is checked before a sub-batch's data and again before any publish once that check is
older than half the window (room for the publish is awaited first): a newer run claims after
the check and stores its copies after its claim, so what the old run publishes within the
window after its check carries the same ``Nats-Msg-Id`` (ids are replay-stable) and is
deduplicated, and what it would publish later meets the fence first. What a zombie can still
store twice: messages its client had already handed to the connection when it stalled (at most
``max_in_flight`` of one sub-batch, sent when it resumes), if the newer run stored them more
than ``duplicate_window`` earlier.

The stream is created when missing (subjects derived from the template: ``{pipeline}`` filled
in, other placeholders as wildcards; ``duplicate_window`` from the spec). An existing stream must
capture the sink's subjects. The preflight (:meth:`NatsSink.preflight`,
:func:`check_duplicate_window`) refuses a ``duplicate_window`` shorter than the schedule
interval plus the retry budget: a sub-batch re-sent after the window would be stored twice.
``open()`` runs it when the schedule's interval is known (presets and simple crons).

nats-py is asyncio-only: each sink runs its client on a private event loop in a daemon thread,
so the :class:`Sink` interface stays synchronous (and pings are answered between sub-batches).

Errors: authorization/authentication failures, payload over the server's ``max_payload`` and
JetStream API errors other than 503 → non-retryable; timeouts, connection loss, no responders,
503 → retryable.

Connection: ``host``/``port`` (or extra ``servers``: list or comma-separated URLs), ``login`` /
``password`` (user/password), extras ``token``, ``user_credentials`` (a .creds file: user JWT
and seed, for servers run with an operator), ``nkeys_seed`` (a file holding a user's nkey seed,
for servers whose users are nkeys; both need the ``nkeys`` package), ``tls`` (true) with
``tls_ca``, ``tls_cert``, ``tls_key``, ``tls_hostname`` (the name to check instead of the
host), ``connect_timeout`` (s) and ``publish_timeout`` (s, the ack wait). With TLS the
server's certificate is verified against ``tls_ca`` (or the system's CAs) and the host name is
checked. A refused certificate or an authorization violation ends the connection attempt at
once (the client would retry until its timeout) with a non-retryable error naming the sink and
the connection. Secrets never reach logs or exceptions.

The sink's parts, one role each: ``client.py`` (the connection on its loop, error classes, the
connection's options), ``stream.py`` (the stream), ``markers.py`` (the checkpoint subject:
claims, commit markers, fencing), ``read_back.py``, ``subjects.py`` and ``preflight.py`` (pure).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

from ...batching import SubBatch
from ...connections import Connection
from ...errors import ErrorClass, NonRetryableSinkError, SinkError
from ...positions import Position
from ...sink_checkpoints import SinkCheckpoint
from ...spec import PipelineSpec
from .._common import TemplateNames
from ..base import RetryPolicy, Sink, is_control
from . import read_back
from .client import Client, classify_nats_error, publish_timeout
from .markers import CheckpointSubject, commit_seq_of
from .preflight import check_duplicate_window, retry_budget_s, schedule_interval_s
from .spec import NatsSinkSpec
from .stream import ensure_stream
from .subjects import fewest_filters, publishable, subject_filter

log = logging.getLogger(__name__)

HEADER_OVERHEAD = 512  # NATS/1.0 line, Nats-Msg-Id, expected-stream and position headers, roughly
Message = tuple[str, bytes, str, "dict | None"]  # subject, payload, Nats-Msg-Id, extra headers


class NatsSink(Sink):
    kind = "nats"
    label = "NATS"
    retry_policy = RetryPolicy(base_s=0.05, max_s=5.0, attempts=3)

    def __init__(self, pipeline: PipelineSpec, sink: NatsSinkSpec, conn: Connection):
        super().__init__(sink_id=sink.id, pipeline=pipeline.pipeline, tenant=pipeline.tenant,
                         required=sink.required, conn=conn, spec=sink)
        if not sink.stream or not sink.subject:
            raise NonRetryableSinkError(f"NATS sink {sink.id!r} of pipeline {pipeline.pipeline!r} needs "
                                        f"stream and subject")
        self.spec = sink
        self.stream = sink.stream
        self.schedule = pipeline.schedule
        self.subjects = subject_filter(sink.subject, self.pipeline)
        self.duplicate_window_s = float(sink.duplicate_window_s)
        self.max_in_flight = max(1, int(sink.max_in_flight))
        self.stream_duplicate_window_s: float | None = None  # the existing stream's, once known
        self.published = 0
        self.publish_timeout_s = publish_timeout(conn)  # per ack (and for a sub-batch's acks, scaled)
        self._subject_of = TemplateNames(sink.subject, self.pipeline)
        self.checkpoint_subject = f"{self.pipeline}.__checkpoint.{self.sink_id}"
        self.client = Client(conn, f"tidegate-{self.pipeline}-{self.sink_id}", self.sink_id, self.redact,
                             self.publish_timeout_s, self.max_in_flight)
        self.markers = CheckpointSubject(self.client, self.stream, self.checkpoint_subject,
                                         self.checkpoint_key, self.fenced_error)
        self._read_back_due = True  # read what the stream holds after the last commit before publishing
        self._stored = self._new_stored()  # what the stream holds after the last commit marker

    def target_of(self, table: Any) -> str:
        return self._subject_of(table)

    def whereabouts(self) -> str:
        return str(self.conn)

    classify_client_error = staticmethod(classify_nats_error)

    def explain(self, exc: BaseException, text: str, doing: str) -> str | None:
        low = text.lower()
        if "authorization" in low or "authentication" in low:
            return (f"{self.where}: authentication failed while {doing} ({text}); check the credentials "
                    f"of connection {self.conn.conn_id!r}")
        if "permissions violation" in low:
            return (f"{self.where}: permission denied while {doing} ({text}); the user needs publish "
                    f"rights on {self.subjects!r} and $JS.API.>")
        return None

    # ------------------------------------------------------------------ life cycle

    def open(self) -> None:
        if self.client.nc is None:
            self.client.connect(self.error)
        if self.stream_duplicate_window_s is None:
            self._ensure_stream()
        if self.epoch is not None and self.markers.marker_seq is None:
            self._sync(self._claim(), self.publish_timeout_s * 3 + 5, f"claiming {self.checkpoint_subject!r}")
        interval = schedule_interval_s(self.schedule)
        if interval is not None:
            self.preflight(interval)

    def close(self) -> None:
        self.markers.marker_seq = None
        self._read_back_due, self._stored = True, self._new_stored()
        self.client.close()

    def _sync(self, coro: Any, timeout: float, doing: str) -> Any:
        """Run ``coro`` on the client's loop; an error other than the sink's own becomes one."""
        try:
            return self.client.run(coro, timeout)
        except SinkError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to a SinkError without secrets
            raise self.error(exc, doing) from None

    def _ensure_stream(self) -> None:
        def preflight() -> None:  # never create a stream the preflight would refuse
            interval = schedule_interval_s(self.schedule)
            if interval is not None:
                self.preflight(interval)
        channels = (self.control_name, self.dlq_name, self.checkpoint_subject)
        self.stream_duplicate_window_s = self._sync(
            ensure_stream(self.client, self.sink_id, self.stream, self.subjects, channels,
                          self.duplicate_window_s, preflight),
            self.publish_timeout_s * 3, f"checking stream {self.stream!r}")

    def retry_budget_s(self) -> float:
        return retry_budget_s(type(self).retry_policy, self.publish_timeout_s)

    def preflight(self, interval_s: float, retry_budget: float | None = None) -> None:
        """Refuse a duplicate window shorter than ``interval_s`` (the schedule interval) plus
        the retry budget (default: :meth:`retry_budget_s`). Uses the existing stream's window
        once the sink is open, else the configured one."""
        window = self.stream_duplicate_window_s
        if window is None:
            window = self.duplicate_window_s
        budget = self.retry_budget_s() if retry_budget is None else retry_budget
        check_duplicate_window(window, interval_s, budget, stream=self.stream)

    # ------------------------------------------------------------------ delivery

    def deliver(self, batch: SubBatch, extends: int | None = None) -> Position:
        if self.client.nc is None:
            self.open()
        poison: dict[str, tuple[Any, str]] = {}
        frames = (self._messages(chunk, poison) for chunk in batch.chunks())
        n = batch.event_count
        timeout = self.publish_timeout_s * (2 + n / max(1, self.max_in_flight))
        if self._read_back_due:  # reading back is bounded by what follows the last marker
            timeout += self.publish_timeout_s * (2 + n / max(1, self.max_in_flight))
        try:
            dups, skipped = self.client.run(self._publish(frames, self.sink_record(batch, extends)),
                                            timeout + 5)
        except SinkError:
            self._read_back_due = True
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to a SinkError without secrets
            # Some of the sub-batch may be stored without its marker: read back before the retry.
            self._read_back_due = True
            raise self.error(exc, f"publishing sub-batch {batch.seq}") from None
        self.published += n - len(skipped)
        self.skipped += len(skipped)
        self._stored.forget(skipped)
        self.duplicates += dups
        self.dlq_count += len(poison)
        if skipped:
            log.info("NATS sink %r: %d of %d messages of sub-batch %d were already in stream %r after the "
                     "sink's last commit marker (an earlier attempt stored them); not published again",
                     self.sink_id, len(skipped), n, batch.seq, self.stream)
        if dups:
            log.info("NATS sink %r: %d of %d messages of sub-batch %d were duplicates already stored in "
                     "stream %r (same Nats-Msg-Id within duplicate_window); %d so far", self.sink_id, dups,
                     n, batch.seq, self.stream, self.duplicates)
        return batch.end_position

    def _messages(self, events: list, poison: dict[str, tuple[Any, str]]) -> list[Message]:
        """(subject, payload, Nats-Msg-Id, extra headers) of ``events``; what the server cannot
        take halts the run, or goes to the dead-letter subject (and into ``poison``)."""
        out = [(ev, self.control_name if is_control(ev) else self._subject_of(ev)) for ev in events]
        found = self._poison(out)
        self.halt_on_poison(found.values())
        poison.update(found)
        return [(subj, ev.value, ev.idempotency_key, None if is_control(ev) else ev.headers)
                if ev.idempotency_key not in found
                else (self.dlq_name, self.dlq_record(ev, found[ev.idempotency_key][1]),
                      "dlq|" + ev.idempotency_key, None) for ev, subj in out]

    def _poison(self, out: list[tuple[Any, str]]) -> dict[str, tuple[Any, str]]:
        """Events this server cannot take whatever is retried, by idempotency key: over
        ``max_payload`` (with headers), or a subject that is not a valid one (a table name with
        a space, ``*``, ...)."""
        limit = self.client.max_payload or 1024 * 1024
        bad: dict[str, tuple[Any, str]] = {}
        for ev, subj in out:
            size = len(ev.value) + len(ev.idempotency_key) + HEADER_OVERHEAD
            if size > limit:
                bad[ev.idempotency_key] = (ev, f"{len(ev.value)} bytes for subject {subj!r}, over the "
                                               f"server's max_payload of {limit} bytes (with headers)")
            elif not publishable(subj):
                bad[ev.idempotency_key] = (ev, f"{subj!r} is not a valid NATS subject to publish to")
        return bad

    async def _publish(self, frames: Iterable[list[Message]], record: SinkCheckpoint
                       ) -> tuple[int, list[str]]:
        """Publish (subject, payload, Nats-Msg-Id, extra headers) in order, then, once every one
        was acknowledged, the commit marker: its presence proves the whole sub-batch. What the
        stream already holds after the sink's last commit marker is skipped (read back first
        when an earlier attempt or run may have left some): returns (duplicates the server
        reported, the ids skipped). ``frames``: the messages in lists, each acknowledged before
        the next is built (one list, or a spilled transaction's frames read back from disk)."""
        if self._read_back_due:
            ids = await self._read_back()  # sets markers.commit_seq, where it read from
            self._stored.add(ids, self.markers.commit_seq)
            self._read_back_due = False
        await self.markers.check_claim(self.epoch)
        clock = [time.monotonic()]  # when the claim was last checked
        dups, skipped = 0, []
        for messages in frames:
            if self._stored:
                messages = await self._unstored(messages, skipped)
            dups += await self._publish_frame(messages, clock)
        await self.markers.commit(record, self.epoch)
        return dups, skipped

    async def _unstored(self, messages: list[Message], skipped: list[str]) -> list[Message]:
        """``messages`` but those the stream holds after the last commit marker, whose ids go to
        ``skipped``: by id, or by transaction and place when read from the other server of a
        GTID pair (:class:`read_back.Stored`)."""
        kept = []
        for m in messages:
            if await self._stored.holds(m[2], m[1]):
                skipped.append(m[2])
            else:
                kept.append(m)
        return kept

    async def _publish_frame(self, messages: list[Message], clock: list[float]) -> int:
        """Publish ``messages`` and wait for their acks; the duplicates the server reported."""
        timeout, fresh_s, js = self.publish_timeout_s, self._claim_fresh_s(), self.client.js
        futs: list[asyncio.Future] = []
        oldest = 0  # futs before this one are acknowledged (acks come in publish order)
        try:
            for subj, payload, msg_id, extra in messages:
                # Room for the next publish is waited for here, not inside publish_async (its own
                # limit is the same), so the freshness check runs after any wait.
                while len(futs) - oldest >= self.max_in_flight:
                    if not futs[oldest].done():
                        await asyncio.wait((futs[oldest],))
                    oldest += 1
                if time.monotonic() - clock[0] > fresh_s:
                    # Stalled since the check (a stopped process, a long wait for acks): a newer
                    # run may have stored these ids longer than the window ago. Ask again.
                    await self.markers.check_claim(self.epoch)
                    clock[0] = time.monotonic()
                headers = {"Nats-Msg-Id": msg_id}
                if extra:  # a primary-key change: each event names the other's key
                    headers.update((k, v.decode()) for k, v in extra.items())
                # No wait_stall: it wraps every publish in a timed task (7x slower); the whole
                # sub-batch is bounded by the caller's timeout instead.
                futs.append(await js.publish_async(subj, payload, stream=self.stream, headers=headers))
            acks = await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True),
                                          timeout * (1 + len(futs) / self.max_in_flight))
        except BaseException:
            for f in futs:
                f.cancel()
            raise
        errors = [a for a in acks if isinstance(a, BaseException)]
        if errors:
            worst = min(errors, key=lambda e: 0 if classify_nats_error(e) is ErrorClass.NON_RETRYABLE else 1)
            raise worst
        return sum(1 for a in acks if a.duplicate)

    def _claim_fresh_s(self) -> float:
        """How long a passed claim check covers publishing: half the stream's duplicate window.
        A newer run claims after the check and stores its copies after its claim; what this
        run publishes within the window after its check is then deduplicated against them."""
        window = self.stream_duplicate_window_s or self.duplicate_window_s
        return max(0.05, window / 2)

    # ------------------------------------------------------------------ claims and reading back

    async def _claim(self) -> None:
        await self.markers.claim(self.epoch)
        self._read_back_due = True  # what the run before stored after its last commit is skipped

    def read_back_filters(self) -> list[str]:
        """The subjects this sink publishes to, as few filters as cover them."""
        return fewest_filters(self.subjects, (self.control_name, self.dlq_name))

    def _new_stored(self) -> read_back.Stored:
        return read_back.Stored(lambda after_seq: read_back.stored_changes(
            self.client, self.stream, self.read_back_filters(), after_seq))

    async def _read_back(self) -> set[str]:
        """What an attempt (of this run or an earlier one) stored after the sink's last commit
        marker without the marker that would have proved it. Checkpoint subjects are not data."""
        markers = self.markers
        if markers.marker_seq is None:  # unfenced (no epoch, so no claim): from the last marker
            markers.commit_seq = commit_seq_of(await markers.last())
        ids = await read_back.stored_ids(self.client, self.stream, self.read_back_filters(),
                                         markers.commit_seq, f"{self.pipeline}.__checkpoint.")
        if ids:
            log.info("NATS sink %r: stream %r holds %d message(s) after the sink's last commit marker "
                     "(sequence %d); they are skipped, not published again", self.sink_id, self.stream,
                     len(ids), markers.commit_seq)
        return ids

    def committed_checkpoint(self) -> SinkCheckpoint | None:
        """The position and version headers of the last marker on the sink's checkpoint subject;
        None when there is none or the stream cannot be read."""
        if self.client.nc is None:
            self.open()
        try:
            msg = self.client.run(self.markers.last(), self.publish_timeout_s + 5)
        except Exception as exc:  # noqa: BLE001
            err = self.error(exc, f"reading the last message of {self.checkpoint_subject!r}")
            if err.error_class is ErrorClass.RETRYABLE:
                raise err from None
            log.warning("NATS sink %r: cannot read the sink-side position (%s); using the checkpoint store",
                        self.sink_id, err)
            return None
        return self.markers.record_of(msg)


__all__ = ["NatsSink"]
