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
version this delivery extends, see :mod:`tidegate.checkpoints`), ``Tidegate-Checkpoint-Key``
and ``Tidegate-Epoch`` (the run's lease epoch). So the last marker names a position whose every
event is stored; :meth:`NatsSink.committed_checkpoint` reads it, and a crash between the
publish and the checkpoint-store write needs no re-publish.

Reading back: what a stream holds after the sink's last commit marker was stored by an attempt
whose marker never came (a run stalled past its ack wait, killed, cut off). Before the first
publish of a run and before every retry of a failed attempt, the sink reads the ``Nats-Msg-Id``
of every message on its subjects (data, control, DLQ) with a stream sequence after that marker
(an ephemeral headers-only consumer per subject filter) and does not publish those again; the
run report counts them (``skipped``). So a sub-batch is stored once also when its retry comes
after ``duplicate_window``. A claim carries the last commit marker's stream sequence forward in
``Tidegate-Commit-Seq``, so a run that died before committing anything does not hide what it
stored from the next. Skipping keeps per-key order when what was stored is a prefix of the
sub-batch (publishes are pipelined in order on one connection); a message refused in the middle
of an attempt (an error) and published by the retry after later ones of the same key would not
be.

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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import re
import ssl
import threading
import time
from collections.abc import Coroutine, Iterable
from typing import Any

import nats
import nats.errors as nerr
import nats.js.errors as jerr
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StreamConfig

from ...batching import SubBatch
from ...checkpoints import SinkCheckpoint
from ...connections import Connection
from ...errors import ErrorClass, NonRetryableSinkError, RetryableSinkError, SinkError
from ...positions import Position, position_from_json
from ...spec import PipelineSpec
from .._common import TemplateNames, tls_verification_failed
from ..base import RetryPolicy, Sink, is_control
from .spec import NatsSinkSpec

log = logging.getLogger(__name__)

POSITION_HEADER = "Tidegate-Position"
EXTENDS_HEADER = "Tidegate-Extends"
CHECKPOINT_KEY_HEADER = "Tidegate-Checkpoint-Key"
EPOCH_HEADER = "Tidegate-Epoch"
COMMIT_SEQ_HEADER = "Tidegate-Commit-Seq"  # on a claim: the stream sequence of the last commit marker
EXPECT_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
WRONG_LAST_SEQUENCE = 10071  # JetStream's error code for a failed expected-sequence check
HEADER_OVERHEAD = 512  # NATS/1.0 line, Nats-Msg-Id, expected-stream and position headers, roughly

_PRESETS = {"@continuous": 0.0, "@hourly": 3600.0, "@daily": 86400.0, "@weekly": 7 * 86400.0,
            "@monthly": 31 * 86400.0, "@quarterly": 92 * 86400.0, "@yearly": 366 * 86400.0,
            "@annually": 366 * 86400.0}
_NUM = re.compile(r"^\d+$")
# A subject one can publish to: dot-separated non-empty tokens, no whitespace, no wildcard.
_VALID_SUBJECT = re.compile(r"^[^\s.*>]+(\.[^\s.*>]+)*$")
_STEP = re.compile(r"^\*/(\d+)$")


# --------------------------------------------------------------------------- preflight


def schedule_interval_s(schedule: str | None) -> float | None:
    """The longest gap between two runs of a schedule, for presets and simple crons
    (``*/N * * * *``, ``M */N * * *``, ``M H * * *``); None when unknown or manual."""
    if not schedule:
        return None
    if schedule.startswith("@"):
        return _PRESETS.get(schedule)
    f = schedule.split()
    if len(f) != 5 or any(x != "*" for x in f[2:]):
        return None
    minute, hour = f[0], f[1]
    if hour == "*":
        if minute == "*":
            return 60.0
        if (m := _STEP.match(minute)) and 60 % int(m.group(1)) == 0:
            return 60.0 * int(m.group(1))
        return 3600.0 if _NUM.match(minute) else None
    if _NUM.match(minute):
        if (m := _STEP.match(hour)) and 24 % int(m.group(1)) == 0:
            return 3600.0 * int(m.group(1))
        if _NUM.match(hour):
            return 86400.0
    return None


def retry_budget_s(policy: RetryPolicy, attempt_timeout_s: float) -> float:
    """The longest a sub-batch can keep being retried within one run: every attempt timing out
    plus the largest backoff before each retry."""
    sleeps = sum(min(policy.max_s, policy.base_s * 2 ** i) for i in range(max(0, policy.attempts - 1)))
    return policy.attempts * attempt_timeout_s + sleeps


def check_duplicate_window(window_s: float, interval_s: float, retry_budget: float, *,
                           stream: str = "?") -> None:
    """Raise a NonRetryableSinkError when ``window_s`` < ``interval_s`` + ``retry_budget``."""
    need = interval_s + retry_budget
    if window_s < need:
        raise NonRetryableSinkError(
            f"NATS stream {stream!r}: duplicate_window {window_s:g}s is shorter than the schedule "
            f"interval {interval_s:g}s plus the retry budget {retry_budget:g}s (= {need:g}s): a "
            f"sub-batch re-sent after the window would be stored twice. Set duplicate_window to at "
            f"least {need:g}s (the sink's duplicate_window, or the existing stream's setting).")


# --------------------------------------------------------------------------- subjects


def subject_filter(template: str, pipeline: str) -> str:
    """The subjects a template can produce, as a NATS filter: ``{pipeline}`` filled in, a token
    that is one placeholder → ``*``, a token with a placeholder inside → ``>`` (and stop)."""
    out = []
    for tok in template.replace("{pipeline}", pipeline).split("."):
        if "{" not in tok:
            out.append(tok)
        elif re.fullmatch(r"\{(db|schema|table)\}", tok):
            out.append("*")
        else:
            out.append(">")
            break
    return ".".join(out)


def subject_covers(pattern: str, subject: str) -> bool:
    """Does stream subject ``pattern`` capture every subject matching filter ``subject``?"""
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return i < len(s)
        if i >= len(s) or s[i] == ">":
            return False
        if tok != "*" and tok != s[i]:
            return False
    return len(p) == len(s)


# --------------------------------------------------------------------------- errors


def classify_nats_error(exc: BaseException) -> ErrorClass:
    """The error class of a nats-py exception (see the module docstring)."""
    text = str(exc).lower()
    if any(w in text for w in ("authorization", "authentication", "permissions violation", "user jwt")):
        return ErrorClass.NON_RETRYABLE
    if tls_verification_failed(exc):  # an OSError, but waiting does not heal it
        return ErrorClass.NON_RETRYABLE
    if isinstance(exc, nerr.MaxPayloadError) or "maximum payload" in text:
        return ErrorClass.NON_RETRYABLE
    if isinstance(exc, jerr.ServiceUnavailableError):
        return ErrorClass.RETRYABLE
    if isinstance(exc, jerr.APIError):
        return ErrorClass.RETRYABLE if exc.code in (408, 503) else ErrorClass.NON_RETRYABLE
    if isinstance(exc, (jerr.NoStreamResponseError, nerr.NoRespondersError, jerr.TooManyStalledMsgsError,
                        nerr.ConnectionClosedError, nerr.NoServersError, nerr.ConnectionReconnectingError,
                        nerr.OutboundBufferLimitError, nerr.StaleConnectionError, nerr.UnexpectedEOF,
                        nerr.FlushTimeoutError, nerr.ConnectionDrainingError, nerr.SlowConsumerError,
                        asyncio.TimeoutError, concurrent.futures.TimeoutError, TimeoutError,
                        ConnectionError, OSError)):
        return ErrorClass.RETRYABLE
    return ErrorClass.NON_RETRYABLE


# --------------------------------------------------------------------------- markers


def commit_seq_of(last: Any) -> int:
    """The stream sequence of the last commit marker, given the checkpoint subject's last
    message: a commit marker (it has a ``Nats-Msg-Id``) is its own; a claim carries it in
    ``Tidegate-Commit-Seq`` (a claim written before that header: its own sequence, where the
    read-back then starts); no message: 0."""
    if last is None:
        return 0
    h = last.headers or {}
    if "Nats-Msg-Id" in h:
        return int(last.seq)
    carried = h.get(COMMIT_SEQ_HEADER, "")
    return int(carried) if carried.isdigit() else int(last.seq)


# --------------------------------------------------------------------------- the sink


def _publish_timeout(conn: Connection) -> float:
    """Seconds to wait for an ack: the connection's extra ``publish_timeout`` (default 10)."""
    raw = (conn.extra or {}).get("publish_timeout", NatsSink.publish_timeout_s)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if value <= 0:
        raise NonRetryableSinkError(f"NATS connection {conn.conn_id!r}: extra publish_timeout {raw!r} is "
                                    f"not a positive number of seconds; set it to e.g. 10 or remove it")
    return value



class NatsSink(Sink):
    kind = "nats"
    label = "NATS"
    retry_policy = RetryPolicy(base_s=0.05, max_s=5.0, attempts=3)
    publish_timeout_s: float = 10.0  # per ack (and for the whole sub-batch's acks, scaled)

    def __init__(self, pipeline: PipelineSpec, sink: NatsSinkSpec, conn: Connection):
        super().__init__(sink_id=sink.id, pipeline=pipeline.pipeline, tenant=pipeline.tenant,
                         required=sink.required, conn=conn,
                         spec=sink)
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
        self.duplicates = 0  # messages the server reported as already stored (this sink's life)
        self.published = 0
        self.publish_timeout_s = _publish_timeout(conn)
        self._subject_of = TemplateNames(sink.subject, self.pipeline)
        self.checkpoint_subject = f"{self.pipeline}.__checkpoint.{self.sink_id}"
        self._marker_seq: int | None = None  # the stream sequence of this sink's last marker/claim
        self._commit_seq = 0  # the stream sequence of the sink's last commit marker (0: none)
        self._read_back_due = True  # read what the stream holds after _commit_seq before publishing
        self._stored_ids: set[str] = set()  # Nats-Msg-Ids found after the last commit marker
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._nc: Any = None
        self._js: Any = None
        self._max_payload: int | None = None
        self._async_errors: list[BaseException] = []
        self._refused: asyncio.Event | None = None  # set by the error callback on a lasting refusal

    # ------------------------------------------------------------------ event loop

    def target_of(self, table: Any) -> str:
        return self._subject_of(table)

    def _run(self, coro: Coroutine, timeout: float | None = None) -> Any:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            t = threading.Thread(target=loop.run_forever, name=f"nats-{self.pipeline}-{self.sink_id}",
                                 daemon=True)
            t.start()
            self._loop, self._thread = loop, t
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise RetryableSinkError(f"NATS sink {self.sink_id!r}: no answer within {timeout:g}s") from None

    # ------------------------------------------------------------------ connection

    def connect_options(self) -> dict[str, Any]:
        c, x = self.conn, dict(self.conn.extra or {})
        servers = x.get("servers")
        if isinstance(servers, str):
            servers = [s.strip() for s in servers.split(",") if s.strip()]
        if not servers:
            scheme = "tls" if str(x.get("tls", "")).lower() in ("1", "true", "yes") else "nats"
            servers = [f"{scheme}://{c.host or '127.0.0.1'}:{c.port or 4222}"]
        opts: dict[str, Any] = {
            "servers": servers, "name": f"tidegate-{self.pipeline}-{self.sink_id}",
            "connect_timeout": float(x.get("connect_timeout", 5)), "allow_reconnect": True,
            "max_reconnect_attempts": int(x.get("max_reconnect_attempts", 3)),
            "reconnect_time_wait": float(x.get("reconnect_time_wait", 0.5)),
            "error_cb": self._on_error, "disconnected_cb": self._on_disconnect,
        }
        if c.login:
            opts["user"] = c.login
            if c.password:
                opts["password"] = c.password
        elif c.password:
            opts["token"] = c.password
        if x.get("token"):
            opts["token"] = x["token"]
        if x.get("user_credentials"):
            opts["user_credentials"] = x["user_credentials"]
        if x.get("nkeys_seed"):
            opts["nkeys_seed"] = x["nkeys_seed"]
        if any(x.get(k) for k in ("tls_ca", "tls_cert")) or str(x.get("tls", "")).lower() in ("1", "true"):
            ctx = ssl.create_default_context(cafile=x.get("tls_ca"))
            if x.get("tls_cert"):
                ctx.load_cert_chain(x["tls_cert"], x.get("tls_key"))
            opts["tls"] = ctx
            if x.get("tls_hostname"):
                opts["tls_hostname"] = x["tls_hostname"]
        return opts

    async def _connect(self, opts: dict[str, Any], timeout: float) -> Any:
        """nats.connect, given up as soon as the error callback reports a refusal that retrying
        cannot mend (a server certificate that failed verification, an authorization
        violation): the client would otherwise try again until its timeout."""
        self._refused = asyncio.Event()
        connecting = asyncio.ensure_future(nats.connect(**opts))
        refused = asyncio.ensure_future(self._refused.wait())
        try:
            await asyncio.wait({connecting, refused}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            refused.cancel()
        if connecting.done():
            return connecting.result()
        connecting.cancel()
        try:
            await connecting
        except BaseException:  # noqa: BLE001, S110 - the refusal is what is reported
            pass
        raise TimeoutError(f"no connection within {timeout:g}s")

    async def _on_error(self, exc: Exception) -> None:
        self._async_errors.append(exc)
        del self._async_errors[:-20]
        if classify_nats_error(exc) is ErrorClass.NON_RETRYABLE and self._refused is not None:
            self._refused.set()
        log.warning("NATS sink %r: %s", self.sink_id, self.redact(f"{type(exc).__name__}: {exc}"))

    async def _on_disconnect(self) -> None:
        log.info("NATS sink %r: disconnected", self.sink_id)

    @property
    def where(self) -> str:
        return f"NATS sink {self.sink_id!r} (pipeline {self.pipeline!r}, {self.conn})"

    def classify_client_error(self, exc: BaseException) -> ErrorClass:
        return classify_nats_error(exc)

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
        if self._nc is None:
            opts = self.connect_options()
            timeout = opts["connect_timeout"] * (1 + len(opts["servers"])) + 5
            self._async_errors.clear()
            try:
                self._nc = self._run(self._connect(opts, timeout), timeout + 1)
            except Exception as exc:  # noqa: BLE001 - mapped to a SinkError without secrets
                # The client retries servers and ends with "no servers"; the cause (an
                # authorization violation, say) went to the error callback: report the worst.
                causes = [e for e in self._async_errors if classify_nats_error(e) is ErrorClass.NON_RETRYABLE]
                raise self.error(causes[0] if causes else exc, "connecting") from None
            self._js = self._nc.jetstream(timeout=self.publish_timeout_s,
                                          publish_async_max_pending=self.max_in_flight)
            self._max_payload = self._nc.max_payload
        if self.stream_duplicate_window_s is None:
            self._ensure_stream()
        if self.epoch is not None and self._marker_seq is None:
            self._claim()
        interval = schedule_interval_s(self.schedule)
        if interval is not None:
            self.preflight(interval)

    def close(self) -> None:
        nc, self._nc, self._js, self._marker_seq = self._nc, None, None, None
        self._read_back_due, self._stored_ids = True, set()
        loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None:
            return
        try:
            if nc is not None:
                asyncio.run_coroutine_threadsafe(nc.close(), loop).result(5)
        except Exception:  # noqa: BLE001, S110 - close must not raise
            pass
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(5)
        if not loop.is_running():
            loop.close()

    def _ensure_stream(self) -> None:
        try:
            window = self._run(self._ensure_stream_async(), self.publish_timeout_s * 3)
            self.stream_duplicate_window_s = window
        except SinkError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self.error(exc, f"checking stream {self.stream!r}") from None

    async def _ensure_stream_async(self) -> float:
        js = self._js
        try:
            info = await js.stream_info(self.stream)
        except jerr.NotFoundError:
            interval = schedule_interval_s(self.schedule)
            if interval is not None:  # never create a stream the preflight would refuse
                self.preflight(interval)
            try:
                subjects = [self.subjects] + [c for c in self._channels()
                                              if not subject_covers(self.subjects, c)]
                info = await js.add_stream(StreamConfig(name=self.stream, subjects=subjects,
                                                        duplicate_window=self.duplicate_window_s))
                log.info("NATS sink %r: created stream %r (subjects %r, duplicate_window %gs)",
                         self.sink_id, self.stream, self.subjects, self.duplicate_window_s)
            except jerr.BadRequestError:  # created concurrently by another run
                info = await js.stream_info(self.stream)
        have = list(info.config.subjects or [])
        if not any(subject_covers(p, self.subjects) for p in have):
            raise NonRetryableSinkError(
                f"NATS sink {self.sink_id!r}: stream {self.stream!r} does not capture the sink's subjects "
                f"{self.subjects!r} (its subjects: {have}); add them to the stream or change the sink's "
                f"subject template")
        missing = [c for c in self._channels() if not any(subject_covers(p, c) for p in have)]
        if missing:  # a stream made before the control channel existed: add the pipeline's channels
            info.config.subjects = have + missing
            info = await js.update_stream(info.config)
            log.info("NATS sink %r: stream %r now also captures %s", self.sink_id, self.stream, missing)
        return float(info.config.duplicate_window or 0.0)

    def _channels(self) -> tuple[str, ...]:
        """The pipeline's own subjects the stream must capture besides the data subjects."""
        return (self.control_name, self.dlq_name, self.checkpoint_subject)

    def retry_budget_s(self) -> float:
        from ...retry import policy_for  # late: tidegate.retry imports the sink base

        return retry_budget_s(policy_for(self), self.publish_timeout_s)

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
        if self._nc is None:
            self.open()
        poison: dict[str, tuple[Any, str]] = {}
        frames = (self._messages(chunk, poison) for chunk in batch.chunks())
        n = batch.event_count
        timeout = self.publish_timeout_s * (2 + n / max(1, self.max_in_flight))
        if self._read_back_due:  # reading back is bounded by what follows the last marker
            timeout += self.publish_timeout_s * (2 + n / max(1, self.max_in_flight))
        try:
            dups, skipped = self._run(self._publish(frames, self.sink_record(batch, extends)), timeout + 5)
        except SinkError:
            self._read_back_due = True
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to a SinkError without secrets
            # Some of the sub-batch may be stored without its marker: read back before the retry.
            self._read_back_due = True
            raise self.error(exc, f"publishing sub-batch {batch.seq}") from None
        self.published += n - len(skipped)
        self.skipped += len(skipped)
        self._stored_ids.difference_update(skipped)
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

    def _messages(self, events: list, poison: dict[str, tuple[Any, str]]
                  ) -> list[tuple[str, bytes, str, dict | None]]:
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
        limit = self._max_payload or 1024 * 1024
        bad: dict[str, tuple[Any, str]] = {}
        for ev, subj in out:
            size = len(ev.value) + len(ev.idempotency_key) + HEADER_OVERHEAD
            if size > limit:
                bad[ev.idempotency_key] = (ev, f"{len(ev.value)} bytes for subject {subj!r}, over the "
                                               f"server's max_payload of {limit} bytes (with headers)")
            elif not _VALID_SUBJECT.match(subj):
                bad[ev.idempotency_key] = (ev, f"{subj!r} is not a valid NATS subject to publish to")
        return bad

    async def _publish(self, frames: Iterable[list[tuple[str, bytes, str, dict | None]]],
                       record: SinkCheckpoint) -> tuple[int, list[str]]:
        """Publish (subject, payload, Nats-Msg-Id, extra headers) in order, then, once every one
        was acknowledged, the commit marker: its presence proves the whole sub-batch. What the
        stream already holds after the sink's last commit marker is skipped (read back first
        when an earlier attempt or run may have left some): returns (duplicates the server
        reported, the ids skipped). ``frames``: the messages in lists, each acknowledged before
        the next is built (one list, or a spilled transaction's frames read back from disk)."""
        if self._read_back_due:
            self._stored_ids |= await self._read_back()
            self._read_back_due = False
        await self._check_claim()
        clock = [time.monotonic()]  # when the claim was last checked
        dups, skipped = 0, []
        for messages in frames:
            if self._stored_ids:
                skipped += [m[2] for m in messages if m[2] in self._stored_ids]
                messages = [m for m in messages if m[2] not in self._stored_ids]
            dups += await self._publish_frame(messages, clock)
        await self._publish_marker(record)
        return dups, skipped

    async def _publish_frame(self, messages: list[tuple[str, bytes, str, dict | None]], clock: list[float]
                             ) -> int:
        """Publish ``messages`` and wait for their acks; the duplicates the server reported."""
        timeout, fresh_s = self.publish_timeout_s, self._claim_fresh_s()
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
                    await self._check_claim()
                    clock[0] = time.monotonic()
                headers = {"Nats-Msg-Id": msg_id}
                if extra:  # a primary-key change: each event names the other's key
                    headers.update((k, v.decode()) for k, v in extra.items())
                # No wait_stall: it wraps every publish in a timed task (7x slower); the whole
                # sub-batch is bounded by the caller's timeout instead.
                futs.append(await self._js.publish_async(subj, payload, stream=self.stream, headers=headers))
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

    # ------------------------------------------------------------------ reading back

    def _read_back_filters(self) -> list[str]:
        """The subjects this sink publishes to, as few filters as cover them (NATS 2.9: one
        filter per consumer)."""
        return [self.subjects] + [c for c in (self.control_name, self.dlq_name)
                                  if not subject_covers(self.subjects, c)]

    async def _read_back(self) -> set[str]:
        """The Nats-Msg-Ids of the messages on this sink's subjects with a stream sequence
        after its last commit marker: what an attempt (of this run or an earlier one) stored
        without the marker that would have proved it. Checkpoint subjects are not data."""
        if self._marker_seq is None:  # unfenced (no epoch, so no claim): from the last marker
            self._commit_seq = commit_seq_of(await self._last_marker())
        ids: set[str] = set()
        markers = f"{self.pipeline}.__checkpoint."
        for subject in self._read_back_filters():
            for msg_subject, msg_id in await self._headers_after(subject, self._commit_seq):
                if msg_id and not msg_subject.startswith(markers):
                    ids.add(msg_id)
        if ids:
            log.info("NATS sink %r: stream %r holds %d message(s) after the sink's last commit marker "
                     "(sequence %d); they are skipped, not published again", self.sink_id, self.stream,
                     len(ids), self._commit_seq)
        return ids

    async def _headers_after(self, subject: str, seq: int) -> list[tuple[str, str | None]]:
        """(subject, Nats-Msg-Id) of every message on ``subject`` (a filter) after stream
        sequence ``seq``, through an ephemeral headers-only push consumer (about twice as fast
        as fetching from a pull consumer with nats-py)."""
        out: list[tuple[str, str | None]] = []
        progress = asyncio.Event()

        async def take(m: Any) -> None:
            out.append((m.subject, (m.headers or {}).get("Nats-Msg-Id")))
            progress.set()

        inbox = self._nc.new_inbox()
        # Headers only: ~200 bytes a message, so no sub-batch's worth can make this a slow consumer.
        sub = await self._nc.subscribe(inbox, cb=take, pending_msgs_limit=1 << 22,
                                       pending_bytes_limit=1 << 31)
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=seq + 1,
                                ack_policy=AckPolicy.NONE, headers_only=True, filter_subject=subject,
                                deliver_subject=inbox,
                                inactive_threshold=max(30.0, self.publish_timeout_s * 3))
        info = None
        try:
            info = await self._js.add_consumer(self.stream, config)
            total = info.delivered.consumer_seq + info.num_pending  # delivered already + still to come
            while len(out) < total:
                progress.clear()
                try:
                    await asyncio.wait_for(progress.wait(), self.publish_timeout_s)
                except TimeoutError:
                    raise TimeoutError(f"reading back {subject!r} after sequence {seq}: {len(out)} of "
                                       f"{total} messages within {self.publish_timeout_s:g}s") from None
        finally:
            await sub.unsubscribe()
            if info is not None:
                try:
                    await self._js.delete_consumer(self.stream, info.name)
                except Exception:  # noqa: BLE001, S110 - an ephemeral consumer goes away by itself
                    pass
        return out

    # ------------------------------------------------------------------ markers and fencing

    def _marker_headers(self, record: SinkCheckpoint | None, epoch: int | None) -> dict[str, str]:
        headers = {CHECKPOINT_KEY_HEADER: self.checkpoint_key}
        if record is not None:
            headers[POSITION_HEADER] = json.dumps(record.position.to_json(), sort_keys=True,
                                                  separators=(",", ":"))
            if record.extends is not None:
                headers[EXTENDS_HEADER] = str(record.extends)
        if epoch is not None:
            headers[EPOCH_HEADER] = str(epoch)
        return headers

    async def _check_claim(self) -> None:
        """Before publishing anything: is this sink's last marker still the subject's last? A
        zombie learns it was fenced here, before any data goes out (the marker's expected
        sequence is what makes it certain)."""
        if self._marker_seq is None:
            return
        last = await self._last_marker()
        if last is not None and last.seq != self._marker_seq:
            held = (last.headers or {}).get(EPOCH_HEADER)
            if held and held.isdigit() and int(held) > (self.epoch or 0):
                raise self.fenced_error(int(held))

    async def _publish_marker(self, record: SinkCheckpoint) -> None:
        """The commit marker of a sub-batch, refused by the server if another writer has
        written the checkpoint subject since this sink's previous marker (fencing)."""
        headers = self._marker_headers(record, self.epoch)
        # Replay-stable: a retry of the same sub-batch by the same run is a duplicate.
        headers["Nats-Msg-Id"] = "|".join((self.checkpoint_key, f"e{self.epoch}", headers[POSITION_HEADER],
                                           f"x{record.extends}"))
        if self._marker_seq is not None:
            headers[EXPECT_LAST_SUBJECT_SEQ] = str(self._marker_seq)
        try:
            ack = await self._js.publish(self.checkpoint_subject, self._marker_body(headers),
                                         timeout=self.publish_timeout_s, stream=self.stream, headers=headers)
        except jerr.APIError as exc:
            if exc.err_code != WRONG_LAST_SEQUENCE:
                raise
            ack = await self._after_refused_marker(headers["Nats-Msg-Id"])
        self._marker_seq = self._commit_seq = ack.seq

    async def _after_refused_marker(self, msg_id: str) -> Any:
        """The marker was refused: the subject's last message is not our previous marker. It is
        this very marker when an earlier attempt was stored but its ack lost; anything else was
        written by another run."""
        last = await self._last_marker()
        h = (last.headers or {}) if last is not None else {}
        if last is not None and h.get("Nats-Msg-Id") == msg_id:
            return last
        held = h.get(EPOCH_HEADER)
        raise self.fenced_error(int(held) if held and held.isdigit() else None)

    @staticmethod
    def _marker_body(headers: dict[str, str]) -> bytes:
        """A marker's payload says what it is, for whoever reads ``{pipeline}.>``."""
        return json.dumps({"type": "checkpoint", "checkpoint_key": headers[CHECKPOINT_KEY_HEADER],
                           "epoch": headers.get(EPOCH_HEADER)}, separators=(",", ":")).encode()

    def _claim(self) -> None:
        try:
            self._run(self._claim_async(), self.publish_timeout_s * 3 + 5)
        except SinkError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to a SinkError without secrets
            raise self.error(exc, f"claiming {self.checkpoint_subject!r}") from None

    async def _claim_async(self) -> None:
        """Publish this run's claim on the checkpoint subject, the last record carried forward,
        expecting the subject's last message to be the one read (a concurrent claim: read again)."""
        while True:
            last = await self._last_marker()
            h = (last.headers or {}) if last is not None else {}
            held = h.get(EPOCH_HEADER)
            if held and held.isdigit() and int(held) > (self.epoch or 0):
                raise self.fenced_error(int(held))
            commit_seq = commit_seq_of(last)
            headers = {**{k: v for k, v in h.items() if k in (POSITION_HEADER, EXTENDS_HEADER)},
                       **self._marker_headers(None, self.epoch), COMMIT_SEQ_HEADER: str(commit_seq),
                       EXPECT_LAST_SUBJECT_SEQ: str(last.seq if last is not None else 0)}
            try:
                ack = await self._js.publish(self.checkpoint_subject, self._marker_body(headers),
                                             timeout=self.publish_timeout_s, stream=self.stream,
                                             headers=headers)
            except jerr.APIError as exc:
                if exc.err_code == WRONG_LAST_SEQUENCE:
                    continue
                raise
            self._marker_seq, self._commit_seq, self._read_back_due = ack.seq, commit_seq, True
            return

    async def _last_marker(self) -> Any:
        try:
            return await self._js.get_last_msg(self.stream, self.checkpoint_subject)
        except jerr.NotFoundError:
            return None

    # ------------------------------------------------------------------ sink-side checkpoint

    def committed_checkpoint(self) -> SinkCheckpoint | None:
        """The position and version headers of the last marker on the sink's checkpoint subject;
        None when there is none or the stream cannot be read."""
        if self._nc is None:
            self.open()
        try:
            msg = self._run(self._last_marker(), self.publish_timeout_s + 5)
        except Exception as exc:  # noqa: BLE001
            err = self.error(exc, f"reading the last message of {self.checkpoint_subject!r}")
            if err.error_class is ErrorClass.RETRYABLE:
                raise err from None
            log.warning("NATS sink %r: cannot read the sink-side position (%s); using the checkpoint store",
                        self.sink_id, err)
            return None
        h = msg.headers if msg is not None else None
        if not h or h.get(CHECKPOINT_KEY_HEADER) != self.checkpoint_key or POSITION_HEADER not in h:
            return None
        extends = h.get(EXTENDS_HEADER)
        return SinkCheckpoint(position_from_json(h[POSITION_HEADER]),
                              int(extends) if extends is not None and extends.isdigit() else None)


__all__ = ["NatsSink", "check_duplicate_window", "classify_nats_error", "retry_budget_s",
           "schedule_interval_s", "subject_covers", "subject_filter", "POSITION_HEADER",
           "EXTENDS_HEADER", "CHECKPOINT_KEY_HEADER", "EPOCH_HEADER"]
