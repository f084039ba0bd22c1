"""The NATS sink's client: nats-py is asyncio-only, so each sink runs its connection on a
private event loop in a daemon thread and the :class:`~tidegate.sinks.base.Sink` interface
stays synchronous (pings are answered between sub-batches). Also what its errors mean and the
connection's settings as nats-py options (the sink module's docstring lists them)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import ssl
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import nats
import nats.errors as nerr
import nats.js.errors as jerr

from ...connections import Connection
from ...errors import ErrorClass, NonRetryableSinkError, RetryableSinkError, SinkError
from .._common import tls_verification_failed

log = logging.getLogger("tidegate.sinks.nats.sink")

DEFAULT_PUBLISH_TIMEOUT_S = 10.0  # per ack (and for the whole sub-batch's acks, scaled)


def classify_nats_error(exc: BaseException) -> ErrorClass:
    """The error class of a nats-py exception (see the sink module's docstring)."""
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


def publish_timeout(conn: Connection) -> float:
    """Seconds to wait for an ack: the connection's extra ``publish_timeout`` (default 10)."""
    raw = (conn.extra or {}).get("publish_timeout", DEFAULT_PUBLISH_TIMEOUT_S)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if value <= 0:
        raise NonRetryableSinkError(f"NATS connection {conn.conn_id!r}: extra publish_timeout {raw!r} is "
                                    f"not a positive number of seconds; set it to e.g. 10 or remove it")
    return value


def connect_options(conn: Connection, name: str) -> dict[str, Any]:
    """nats.connect's options from a connection (credentials never in a URL)."""
    c, x = conn, dict(conn.extra or {})
    servers = x.get("servers")
    if isinstance(servers, str):
        servers = [s.strip() for s in servers.split(",") if s.strip()]
    if not servers:
        scheme = "tls" if str(x.get("tls", "")).lower() in ("1", "true", "yes") else "nats"
        servers = [f"{scheme}://{c.host or '127.0.0.1'}:{c.port or 4222}"]
    opts: dict[str, Any] = {
        "servers": servers, "name": name,
        "connect_timeout": float(x.get("connect_timeout", 5)), "allow_reconnect": True,
        "max_reconnect_attempts": int(x.get("max_reconnect_attempts", 3)),
        "reconnect_time_wait": float(x.get("reconnect_time_wait", 0.5)),
    }
    if c.login:
        opts["user"] = c.login
        if c.password:
            opts["password"] = c.password
    elif c.password:
        opts["token"] = c.password
    for key in ("token", "user_credentials", "nkeys_seed"):
        if x.get(key):
            opts[key] = x[key]
    if any(x.get(k) for k in ("tls_ca", "tls_cert")) or str(x.get("tls", "")).lower() in ("1", "true"):
        ctx = ssl.create_default_context(cafile=x.get("tls_ca"))
        if x.get("tls_cert"):
            ctx.load_cert_chain(x["tls_cert"], x.get("tls_key"))
        opts["tls"] = ctx
        if x.get("tls_hostname"):
            opts["tls_hostname"] = x["tls_hostname"]
    return opts


@dataclasses.dataclass(eq=False, repr=False)  # repr: the default; the fields hold connection settings
class Client:
    """One sink's connection (``nc``) and JetStream context (``js``) on a loop of its own.
    ``redact`` keeps secrets out of what the error callback logs."""

    conn: Connection
    name: str
    sink_id: str
    redact: Callable[[str], str]
    publish_timeout_s: float
    max_in_flight: int
    nc: Any = dataclasses.field(default=None, init=False)
    js: Any = dataclasses.field(default=None, init=False)
    max_payload: int | None = dataclasses.field(default=None, init=False)
    _loop: asyncio.AbstractEventLoop | None = dataclasses.field(default=None, init=False)
    _thread: threading.Thread | None = dataclasses.field(default=None, init=False)
    _async_errors: list[BaseException] = dataclasses.field(default_factory=list, init=False)
    # set by the error callback on a lasting refusal
    _refused: asyncio.Event | None = dataclasses.field(default=None, init=False)

    def options(self) -> dict[str, Any]:
        return {**connect_options(self.conn, self.name), "error_cb": self._on_error,
                "disconnected_cb": self._on_disconnect}

    def run(self, coro: Coroutine, timeout: float | None = None) -> Any:
        """Run ``coro`` on the sink's loop (started on first use) and wait for it."""
        if self._loop is None:
            loop = asyncio.new_event_loop()
            t = threading.Thread(target=loop.run_forever, name=self.name, daemon=True)
            t.start()
            self._loop, self._thread = loop, t
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise RetryableSinkError(f"NATS sink {self.sink_id!r}: no answer within {timeout:g}s") from None

    def connect(self, fail: Callable[[BaseException, str], SinkError]) -> None:
        """Connect; ``fail`` maps the worst cause to the sink's error."""
        opts = self.options()
        timeout = opts["connect_timeout"] * (1 + len(opts["servers"])) + 5
        self._async_errors.clear()
        try:
            self.nc = self.run(self._connect(opts, timeout), timeout + 1)
        except Exception as exc:  # noqa: BLE001 - mapped to a SinkError without secrets
            # The client retries servers and ends with "no servers"; the cause (an
            # authorization violation, say) went to the error callback: report the worst.
            causes = [e for e in self._async_errors if classify_nats_error(e) is ErrorClass.NON_RETRYABLE]
            raise fail(causes[0] if causes else exc, "connecting") from None
        self.js = self.nc.jetstream(timeout=self.publish_timeout_s,
                                    publish_async_max_pending=self.max_in_flight)
        self.max_payload = self.nc.max_payload

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

    def close(self) -> None:
        """Close the connection and stop the loop. Never raises."""
        nc, self.nc, self.js = self.nc, None, None
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


__all__ = ["Client", "classify_nats_error", "connect_options", "publish_timeout"]
