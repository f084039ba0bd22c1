"""A TCP relay between a run and the NATS server (or another server: Redis) that can hold the
server's answers.

Tests use it to freeze a run at one exact point of the NATS protocol: once armed, the first
data publish the run sends (an ``HPUB`` on the data subjects) makes the relay keep every byte
the server sends back on that connection (the publish acks among them) instead of passing it
on. The server stores what it was sent; the run waits for acks that do not come, so it
cannot have published its commit marker. ``cut()`` then breaks the held connections, as a
network that drops them would: the held bytes are lost and the client reconnects;
``release()`` passes them on instead, late, as a slow network would; ``cut_and_refuse()``
breaks them and refuses every later connection (a Redis EXEC whose reply is lost and a server
that cannot be reached again: the run never learns that the sink committed).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class NatsGate:
    def __init__(self, upstream_port: int, hold_on: bytes):
        self.upstream_port = upstream_port
        self.hold_on = hold_on  # e.g. b"HPUB pipe.public." : the first data publish
        self.port = 0
        self.armed = False
        self.holding = threading.Event()
        self.held_bytes = 0
        self._refusing = False
        self._conns: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter, dict]] = []
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="nats-gate", daemon=True)

    def __enter__(self) -> NatsGate:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            self._server.close()
            for client, server, _ in self._conns:
                client.close()
                server.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def release(self) -> None:
        """Pass on what the held connections held, and everything from now on (a network that
        was slow, not broken)."""
        async def go() -> None:
            self.armed = False
            for client, _, state in list(self._conns):
                if state["hold"]:
                    state["hold"] = False
                    client.write(b"".join(state["held"]))
                    state["held"].clear()
            self.holding.clear()

        asyncio.run_coroutine_threadsafe(go(), self._loop).result(10)

    def cut(self) -> None:
        """Break every connection whose answers are held (what they held is lost); pass
        everything on again from now on."""
        async def go() -> None:
            self.armed = False
            for client, server, state in list(self._conns):
                if state["hold"]:
                    client.transport.abort()
                    server.transport.abort()
            self.holding.clear()

        asyncio.run_coroutine_threadsafe(go(), self._loop).result(10)

    def cut_and_refuse(self) -> None:
        """Break the held connections (what they held is lost) and refuse every connection
        from now on: a server whose answer was lost and that cannot be reached again."""
        async def go() -> None:
            self._server.close()
            self._refusing = True

        asyncio.run_coroutine_threadsafe(go(), self._loop).result(10)
        self.cut()

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            c_writer.transport.abort()
            return
        s_reader, s_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        state: dict = {"hold": False, "held": []}
        self._conns.append((c_writer, s_writer, state))
        await asyncio.gather(self._to_server(c_reader, s_writer, state),
                             self._to_client(s_reader, c_writer, state), return_exceptions=True)
        for w in (c_writer, s_writer):
            with contextlib.suppress(Exception):
                w.close()

    async def _to_server(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         state: dict) -> None:
        tail = b""
        while data := await reader.read(65536):
            if self.armed and not state["hold"] and self.hold_on in tail + data:
                state["hold"] = True  # from here on the server's answers stay here
                self.holding.set()
            tail = data[-len(self.hold_on):]
            writer.write(data)
            await writer.drain()
        writer.close()

    async def _to_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         state: dict) -> None:
        while data := await reader.read(65536):
            if state["hold"]:
                self.held_bytes += len(data)
                state["held"].append(data)
                continue
            writer.write(data)
            await writer.drain()
        writer.close()
