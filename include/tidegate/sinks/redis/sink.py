"""Redis Streams sink (redis-py).

Each event is ``XADD <stream> * event <envelope JSON> idempotency_key <key>``; the stream key
comes from the sink's ``stream`` template. A sub-batch's XADDs and the ``SET`` of the sink-side
checkpoint (key ``tidegate:checkpoint:{pipeline}::sink::{sink_id}``, value a
:class:`~tidegate.sink_checkpoints.SinkCheckpoint`: the position and the store version it extends)
go in one MULTI/EXEC, so data and checkpoint commit together or not at all: a crash mid-way
leaves nothing of the sub-batch, and a crash after EXEC but before the checkpoint-store write
is covered by :meth:`RedisSink.committed_checkpoint` (exactly-once per stream).

Every sub-batch also WATCHes the record and checks that it is the one this run read on open or
set last: a server that lost what it acknowledged while the run delivered (restarted empty, or
from an older copy) fails the sink instead of having the next EXEC set the record over the loss
(the next run then names the rewinds, see docs/architecture.md, "A sink that lost what it
acknowledged").

Zombie writers are fenced. On open the sink claims the run's lease epoch in the key
``tidegate:fence:{pipeline}::sink::{sink_id}`` (refused when a newer epoch holds it), and every
delivery WATCHes that key, checks that no newer epoch has claimed it, and sets it again inside
its MULTI/EXEC: a run that lost its lease (a Spark driver stopped and resumed after a newer run
took over) gets a fatal "fenced" error and its EXEC writes nothing, neither data nor checkpoint.

Streams are never trimmed unless ``maxlen`` is set; then ``MAXLEN ~ maxlen`` (Redis keeps at
least ``maxlen`` entries, trimming whole radix-tree nodes).

Control messages go to the pipeline's control stream (``{pipeline}:__control``, or the sink's
``control``), in the same MULTI/EXEC as the data they sit between.

Before each sub-batch the sink checks that it can write its keys: each is a stream (or absent)
and the ACL user may write it (a no-op ``XTRIM``, once per key and run). Inside MULTI/EXEC a
command that fails at run time (WRONGTYPE) does not undo the others, the checkpoint's SET
included, and one the ACL refuses discards the whole transaction, so such keys are found first;
the sub-batch's keys are WATCHed from that check to the EXEC, so a key another client changes in
between aborts the EXEC (nothing written; the sub-batch is retried and checked again). Another
writer appending to one of the streams meanwhile does the same. Their events are poison: with
``on_poison: halt`` the sub-batch fails naming them; with ``dlq`` each goes, as a dead-letter
record, to ``{pipeline}:__dlq`` (or the sink's ``dlq``) in the same MULTI/EXEC.

Errors: NOAUTH, WRONGPASS, NOPERM (and other ACL/AUTH failures) → non-retryable; connection
errors, timeouts, LOADING, READONLY (failover), OOM, TRYAGAIN, MASTERDOWN → retryable;
other server errors → non-retryable.

Connection: host, port (6379), login = ACL user, password, schema = database number; extras
``ssl`` (true; or the ``rediss`` connection type), ``ssl_ca_certs``, ``ssl_certfile``,
``ssl_keyfile``, ``ssl_cert_reqs`` (default ``required``), ``ssl_check_hostname`` (redis-py's
default: on), ``socket_timeout`` (s, default 30). A server certificate that fails verification is
a non-retryable error naming the sink and the connection. Secrets never reach logs or
exceptions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis
import redis.exceptions as rex
from redis.backoff import NoBackoff
from redis.retry import Retry

from ...batching import SubBatch
from ...connections import Connection
from ...errors import ErrorClass, NonRetryableSinkError, OperatorSinkError, RetryableSinkError, SinkError
from ...positions import Position
from ...sink_checkpoints import SinkCheckpoint
from ...spec import PipelineSpec
from .._common import TemplateNames
from ..base import RetryPolicy, Sink, is_control
from .spec import RedisSinkSpec

log = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "tidegate:checkpoint:"
FENCE_PREFIX = "tidegate:fence:"
_RETRYABLE_REPLIES = ("LOADING", "READONLY", "OOM", "TRYAGAIN", "MASTERDOWN", "BUSY ", "CLUSTERDOWN")
_AUTH_REPLIES = ("NOAUTH", "WRONGPASS", "NOPERM", "ERR AUTH", "INVALID PASSWORD", "INVALID USERNAME")


def classify_redis_error(exc: BaseException) -> ErrorClass:
    """The error class of a redis-py exception (see the module docstring)."""
    text = str(exc).upper()
    if isinstance(exc, (rex.AuthenticationError, rex.AuthorizationError, rex.NoPermissionError,
                        rex.AuthenticationWrongNumberOfArgsError)) or any(a in text for a in _AUTH_REPLIES):
        return ErrorClass.NON_RETRYABLE
    if isinstance(exc, (rex.ConnectionError, rex.TimeoutError, ConnectionError, TimeoutError, OSError,
                        rex.BusyLoadingError, rex.ReadOnlyError, rex.OutOfMemoryError,
                        rex.TryAgainError, rex.MasterDownError, rex.ClusterDownError)):
        return ErrorClass.RETRYABLE
    if isinstance(exc, rex.ResponseError) and any(text.startswith(r) or f" {r}" in text
                                                  for r in _RETRYABLE_REPLIES):
        return ErrorClass.RETRYABLE
    return ErrorClass.NON_RETRYABLE


def _connection_lost(exc: rex.WatchError) -> bool:
    """redis-py turns a connection lost during a watched transaction into a WatchError raised
    while it handles the connection error: the EXEC may have run. A WatchError of its own means
    a watched key moved and nothing ran."""
    return isinstance(exc.__context__, (rex.ConnectionError, rex.TimeoutError, OSError))


def _call(conn: Any, *args: Any) -> Any:
    conn.send_command(*args)
    return conn.read_response()


def _queue(conn: Any, commands: list[tuple]) -> None:
    """Send ``commands`` inside MULTI in one write and read their QUEUED replies (an error reply
    raises: the server then aborts the transaction at EXEC)."""
    conn.send_packed_command(conn.pack_commands(commands))
    for _ in commands:
        conn.read_response()


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else v


def _flat(fields: dict) -> list:
    return [x for kv in fields.items() for x in kv]


def _truthy(v: Any) -> bool:
    return v is True or str(v).lower() in ("1", "true", "yes", "on")


_UNREAD = object()


class RedisSink(Sink):
    kind = "redis"
    label = "Redis"
    retry_policy = RetryPolicy(base_s=0.05, max_s=5.0, attempts=3)
    channel_separator = ":"
    record_tracks_data = True  # a key SET in every delivery's MULTI/EXEC, never trimmed

    def __init__(self, pipeline: PipelineSpec, sink: RedisSinkSpec, conn: Connection):
        super().__init__(sink_id=sink.id, pipeline=pipeline.pipeline, tenant=pipeline.tenant,
                         required=sink.required, conn=conn,
                         spec=sink)
        if not sink.stream:
            raise NonRetryableSinkError(f"Redis sink {sink.id!r} of pipeline {pipeline.pipeline!r} has no "
                                        f"stream template")
        self.spec = sink
        self.maxlen = sink.maxlen
        self.checkpoint_redis_key = CHECKPOINT_PREFIX + self.checkpoint_key
        self.fence_redis_key = FENCE_PREFIX + self.checkpoint_key
        self._stream_of = TemplateNames(sink.stream, self.pipeline)
        self._client: redis.Redis | None = None
        self._acl_refused: dict[str, str | None] = {}  # key -> why the ACL refuses it, or None
        self._uncertain = False  # an EXEC whose reply was lost may have committed
        # The checkpoint record this run knows the server holds (read on open, set by every EXEC):
        # another one there means the server lost what it acknowledged meanwhile. _UNREAD: not
        # known yet (nothing read or written), so not checked.
        self._held: str | None | object = _UNREAD

    # ------------------------------------------------------------------ connection

    def target_of(self, table: Any) -> str:
        return self._stream_of(table)

    def client_kwargs(self) -> dict[str, Any]:
        c, x = self.conn, dict(self.conn.extra or {})
        kw: dict[str, Any] = {
            "host": c.host or "127.0.0.1", "port": int(c.port or 6379),
            "db": int(c.schema) if c.schema and str(c.schema).isdigit() else int(x.get("db", 0)),
            "username": c.login or None, "password": c.password or None,
            "socket_timeout": float(x.get("socket_timeout", 30)),
            "socket_connect_timeout": float(x.get("socket_connect_timeout", 10)),
            "client_name": f"tidegate-{self.pipeline}-{self.sink_id}",
            # No resend inside redis-py: a MULTI/EXEC whose reply was lost may have run, and only
            # deliver() knows to look at the sink-side checkpoint before sending it again.
            "retry": Retry(NoBackoff(), 0),
        }
        if _truthy(x.get("ssl")) or c.conn_type in ("rediss",):
            kw["ssl"] = True
            for k in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_ca_path",
                      "ssl_check_hostname"):
                if x.get(k) is not None:
                    kw[k] = _truthy(x[k]) if k == "ssl_check_hostname" else x[k]
        return kw

    def whereabouts(self) -> str:
        return str(self.conn)

    classify_client_error = staticmethod(classify_redis_error)

    def explain(self, exc: BaseException, text: str, doing: str) -> str | None:
        up = text.upper()
        if any(a in up for a in ("NOAUTH", "WRONGPASS", "AUTHENTICATION", "INVALID PASSWORD",
                                 "INVALID USERNAME")):
            return (f"{self.where}: authentication failed while {doing} ({text}); check the user and "
                    f"password of connection {self.conn.conn_id!r}")
        if "NOPERM" in up or isinstance(exc, rex.NoPermissionError):
            return (f"{self.where}: the ACL user {self.conn.login or 'default'!r} lacks a permission while "
                    f"{doing} ({text}); it needs XADD, XTRIM, SET, GET, TYPE, WATCH, MULTI/EXEC on the "
                    f"stream keys and the tidegate:* keys")
        return None

    def open(self) -> None:
        if self._client is not None:
            return
        client = redis.Redis(**self.client_kwargs())
        try:
            client.ping()
            self._check_eviction(client)
            self._claim(client)
        except SinkError:
            client.close()
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to a SinkError without secrets
            client.close()
            raise self.error(exc, "connecting") from None
        self._client = client

    def _check_eviction(self, client: redis.Redis) -> None:
        """Refuse a server that evicts any key once its memory is full: it would drop the sink's
        streams or its record without a trace (a record dropped alone is found by the next run;
        entries dropped from a stream are not). ``INFO memory``; a user the ACL does not allow
        it is not checked."""
        try:
            info = client.info("memory")
        except rex.NoPermissionError:
            log.info("Redis sink %r: the ACL user may not run INFO, so the server's eviction policy is not "
                     "checked (docs/operations.md, \"TLS and authentication\")", self.sink_id)
            return
        policy, limit = str(info.get("maxmemory_policy", "noeviction")), int(info.get("maxmemory") or 0)
        if limit and policy.startswith("allkeys-"):
            raise OperatorSinkError(
                f"{self.where}: the server evicts any key once its memory is full (maxmemory {limit} bytes, "
                f"maxmemory-policy {policy}), so it could drop the sink's streams and its checkpoint record "
                f"and lose changes without a trace. Set maxmemory-policy to noeviction (the sink's writes "
                f"then fail while memory is full, and are retried), or to a volatile-* policy (it evicts "
                f"only keys with a TTL; the sink sets none)")

    def _claim(self, client: redis.Redis) -> None:
        """Write this run's epoch into the fence key unless a newer one is there (WATCH: a
        concurrent claim between the read and the write makes EXEC fail, and it is read again)."""
        if self.epoch is None:
            return
        with client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    self._check_fence(pipe)
                    pipe.multi()
                    pipe.set(self.fence_redis_key, self.epoch)
                    pipe.execute()
                    return
                except rex.WatchError:
                    continue

    def _check_fence(self, pipe: Any) -> None:
        """WATCH the fence key and raise the fenced error when a newer epoch holds it."""
        pipe.watch(self.fence_redis_key)
        held = pipe.get(self.fence_redis_key)
        if held is not None and int(held) > (self.epoch or 0):
            raise self.fenced_error(int(held))

    def close(self) -> None:
        c, self._client = self._client, None
        if c is not None:
            try:
                c.close()
            except Exception:  # noqa: BLE001, S110 - close must not raise
                pass

    # ------------------------------------------------------------------ delivery

    def _key_of(self, ev: Any) -> str:
        return self.control_name if is_control(ev) else self._stream_of(ev)

    def _keys_of(self, batch: SubBatch) -> list[str]:
        """Every key a sub-batch may write but the checkpoint's: its tables' streams (known
        without reading a spilled transaction back), the control stream and the DLQ."""
        return [*dict.fromkeys(map(self._stream_of, batch.table_counts)), self.control_name,
                self.dlq_name]

    def _unwritable(self, keys: list[str], call: Callable[..., Any]) -> dict[str, str]:
        """Of the stream keys, those this sink cannot write, with why: a key holding another
        type, or one the ACL user may not write (``XTRIM key MINID 0`` is a write that changes
        nothing). Inside MULTI/EXEC such a command would not undo the others (the checkpoint's
        SET included), or would discard the whole transaction: they are found before. Each key
        is WATCHed and its type read at every sub-batch through ``call``, the connection that
        then runs the EXEC: a key another client turns into another type after the check (once
        seen between two sub-batches) aborts the EXEC instead of leaving the sub-batch written
        but for that key's changes, its checkpoint moved past them. The ACL is asked once per
        key and run; a key outside the user's patterns is not watched (nothing is written to it)."""
        assert self._client is not None
        why: dict[str, str] = {}
        for k in keys:
            try:
                call("WATCH", k)
                t = _text(call("TYPE", k))
                if t not in ("none", "stream"):
                    why[k] = f"key {k!r} holds a {t}, not a stream"
                elif k not in self._acl_refused:
                    self._client.xtrim(k, minid="0")
                    self._acl_refused[k] = None
            except rex.NoPermissionError as exc:
                if "command" in str(exc).lower():  # the user may not write streams at all: sink-wide
                    raise self.error(exc, f"checking that stream {k!r} can be written") from None
                self._acl_refused[k] = (f"the ACL user {self.conn.login or 'default'!r} may not write "
                                        f"stream {k!r} ({self.redact(str(exc))})")
            if self._acl_refused.get(k):
                why[k] = self._acl_refused[k]
        return why

    def deliver(self, batch: SubBatch, extends: int | None = None) -> Position:
        if self._client is None:
            self.open()
        assert self._client is not None
        record = self.sink_record(batch, extends)
        try:
            if self._uncertain:
                raw = self._read_record()
                self._uncertain = False
                if raw is not None and _text(raw) == (done := record.dumps()):
                    self._held = done
                    log.info("Redis sink %r: sub-batch %d (to %s) was already committed by an earlier "
                             "attempt", self.sink_id, batch.seq, batch.end_position)
                    return batch.end_position
                # Else the EXEC did not run. Whether the record is still the one before is checked
                # by the delivery, after the fence: a newer run's record fences this one.
            if batch.spilled:
                poison = self._deliver_frames(batch, record)
            else:
                poison = self._deliver_whole(batch, record)
            self._held = record.dumps()
            self.dlq_count += len(poison)
        except SinkError:
            raise
        except rex.WatchError as exc:
            if _connection_lost(exc):
                self._uncertain = True  # the EXEC may have run before the connection broke
                raise RetryableSinkError(f"{self.where}: the connection was lost delivering sub-batch "
                                         f"{batch.seq}; retrying") from None
            raise self._fence_moved() from None  # a watched key moved between WATCH and EXEC
        except Exception as exc:  # noqa: BLE001 - mapped to a SinkError without secrets
            err = self.error(exc, f"delivering sub-batch {batch.seq}")
            if err.error_class is ErrorClass.RETRYABLE:
                self._uncertain = True  # the EXEC may have run before the connection broke
            raise err from None
        return batch.end_position

    def _entries(self, events: list, bad: dict[str, str]) -> tuple[list[tuple[str, dict]], list]:
        """The XADDs of ``events`` (stream, fields) and the poison among them (``bad``: the keys
        that cannot be written, with why), dead-lettered (``on_poison: dlq``) or raised."""
        keys = [self._key_of(ev) for ev in events]
        poison = [(ev, bad[k]) for ev, k in zip(events, keys, strict=True) if k in bad]
        self.halt_on_poison(poison)
        if poison and self.dlq_name in bad:
            raise NonRetryableSinkError(f"{self.where}: the dead-letter stream cannot be written: "
                                        f"{bad[self.dlq_name]}")
        out = []
        for ev, key in zip(events, keys, strict=True):
            if key in bad:
                out.append((self.dlq_name, {"record": self.dlq_record(ev, bad[key]),
                                            "idempotency_key": ev.idempotency_key}))
            else:
                fields = {"event": ev.value, "idempotency_key": ev.idempotency_key}
                if not is_control(ev) and ev.headers:  # a primary-key change: the other key
                    fields.update(ev.headers)
                out.append((key, fields))
        return out, poison

    def _closing_sets(self, record: SinkCheckpoint) -> list[tuple[str, Any]]:
        """The checkpoint, and the fence key kept present even if the server lost it."""
        sets = [(self.checkpoint_redis_key, record.dumps())]
        return sets + [(self.fence_redis_key, self.epoch)] if self.epoch is not None else sets

    def _deliver_whole(self, batch: SubBatch, record: SinkCheckpoint) -> list:
        """The sub-batch and the checkpoint in one MULTI/EXEC through redis-py's pipeline;
        returns the poison dead-lettered."""
        assert self._client is not None
        with self._client.pipeline(transaction=True) as pipe:
            if self.epoch is not None:
                self._check_fence(pipe)
            self._check_record(pipe.immediate_execute_command)
            bad = self._unwritable(self._keys_of(batch), pipe.immediate_execute_command)
            entries, poison = self._entries(list(batch.events), bad)
            pipe.multi()
            trim = {"maxlen": self.maxlen, "approximate": True} if self.maxlen else {}
            for key, fields in entries:
                pipe.xadd(key, fields, **trim)
            for key, value in self._closing_sets(record):
                pipe.set(key, value)
            self._execute(pipe)
        return poison

    def _deliver_frames(self, batch: SubBatch, record: SinkCheckpoint) -> list:
        """A sub-batch holding a transaction larger than the limits (read back from disk a frame
        at a time) in one MULTI/EXEC all the same: the commands are sent and queued by the
        server frame by frame on one connection (redis-py's pipeline would hold them all until
        EXEC). The server holds the queue; EXEC applies it at once, data and checkpoint."""
        assert self._client is not None
        pool = self._client.connection_pool
        conn = pool.get_connection()
        trim = ("MAXLEN", "~", self.maxlen) if self.maxlen else ()
        poison: list = []
        try:
            if self.epoch is not None:  # as _check_fence, on this connection
                _call(conn, "WATCH", self.fence_redis_key)
                held = _call(conn, "GET", self.fence_redis_key)
                if held is not None and int(held) > self.epoch:
                    raise self.fenced_error(int(held))
            self._check_record(lambda *cmd: _call(conn, *cmd))
            bad = self._unwritable(self._keys_of(batch), lambda *cmd: _call(conn, *cmd))
            _call(conn, "MULTI")
            for chunk in batch.chunks():
                entries, found = self._entries(chunk, bad)
                poison += found
                _queue(conn, [("XADD", key, *trim, "*", *_flat(fields)) for key, fields in entries])
            _queue(conn, [("SET", key, value) for key, value in self._closing_sets(record)])
            replies = _call(conn, "EXEC")
            if replies is None:  # a watched key moved: nothing ran
                raise rex.WatchError("a watched key changed between WATCH and EXEC")
            failed = next((r for r in replies if isinstance(r, Exception)), None)
            if failed is not None:
                raise failed
        except BaseException:
            conn.disconnect()  # never hand back a connection inside MULTI (the server discards it)
            raise
        finally:
            pool.release(conn)
        return poison

    def _check_record(self, call: Callable[..., Any]) -> None:
        """WATCH the checkpoint record (a change before the EXEC aborts it) and check that it is
        the one this run knows the server holds. A Redis that restarted empty, or from an older
        copy, while this run delivered holds another: what it acknowledged since is gone, and the
        next EXEC would set the record over that loss and hide it."""
        call("WATCH", self.checkpoint_redis_key)
        raw = call("GET", self.checkpoint_redis_key)
        if self._held is _UNREAD:
            return
        now = None if raw is None else _text(raw)
        if now != self._held:
            found = "no record" if now is None else f"the record {now}"
            raise NonRetryableSinkError(
                f"{self.where}: the server lost changes it had acknowledged during this run (restarted "
                f"empty, or from an older copy?): it holds {found}, where this run had left {self._held}. "
                f"Nothing more is written to it; the next run names the rewinds an operator chooses from")

    def _fence_moved(self) -> SinkError:
        """EXEC was refused because a watched key changed after WATCH: fenced if a newer epoch
        holds the fence key now, else (a stream written by another client, the fence key
        rewritten by the server) retryable."""
        assert self._client is not None
        held = self._client.get(self.fence_redis_key)
        if held is not None and int(held) > (self.epoch or 0):
            return self.fenced_error(int(held))
        return RetryableSinkError(f"{self.where}: the fence key or one of the sub-batch's streams changed "
                                  f"during a delivery (another client wrote it); nothing was written, "
                                  f"retrying")

    def _execute(self, pipe: Any) -> list:
        """Send MULTI, the queued commands and EXEC; raise on any error."""
        return pipe.execute()

    # ------------------------------------------------------------------ sink-side checkpoint

    def committed_checkpoint(self) -> SinkCheckpoint | None:
        if self._client is None:
            self.open()
        assert self._client is not None
        raw = self._read_record()
        self._held = None if raw is None else _text(raw)
        return SinkCheckpoint.loads(raw) if raw else None

    def _read_record(self) -> Any:
        assert self._client is not None
        try:
            return self._client.get(self.checkpoint_redis_key)
        except Exception as exc:  # noqa: BLE001
            raise self.error(exc, "reading the checkpoint key") from None


__all__ = ["RedisSink", "classify_redis_error", "CHECKPOINT_PREFIX", "FENCE_PREFIX"]
