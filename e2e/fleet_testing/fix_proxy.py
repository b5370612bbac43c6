"""A TCP proxy fixture for simulating PostgreSQL and Redis outages without mocks.

psycopg's test suite puts a proxy between client and server and stops it to lose connectivity
(its ``tests/fix_proxy.py``); Fleet does the same, in process. ``tcp_proxy(host, port)`` returns a
`TcpProxy` listening on 127.0.0.1 and forwarding to the target. ``cut()`` resets every open
connection and refuses new ones (the listening socket closes); ``resume()`` listens again on the
same port. Point a client at ``proxy.url_for(url)``. ``latency_s`` delays every chunk forwarded
(both ways), to catch code that only works while its server answers at once.

The proxy runs asyncio on its own thread and loop, so it serves sync clients (which would block a
test's loop) and async tests alike, and ``cut``/``resume`` are plain calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from fleet_testing import servers

__all__ = ["ProxyFactory", "TcpProxy", "tcp_proxy"]

CHUNK = 64 * 1024
CALL_TIMEOUT_S = 10

T = TypeVar("T")


class _LoopThread:
    """An event loop running forever on a daemon thread, fed coroutines from other threads."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="tcp-proxy", daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=CALL_TIMEOUT_S)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=CALL_TIMEOUT_S)
        self.loop.close()


class TcpProxy:
    """Forwards 127.0.0.1:<port> to ``target``; can cut every connection, then resume."""

    def __init__(self, target: servers.Address, runner: _LoopThread) -> None:
        self.target = target
        self._runner = runner
        self._address = servers.Address("127.0.0.1", 0)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._links: set[asyncio.Task[Any]] = set()
        self.accepted = 0  # connections forwarded so far: proof traffic went through us
        self.latency_s = 0.0

    @property
    def address(self) -> servers.Address:
        """Where clients connect; the same port across `cut` and `resume`."""
        return self._address

    def url_for(self, url: str) -> str:
        """Return ``url`` (postgresql:// or redis://) routed through this proxy."""
        return servers.with_address(url, self._address)

    def cut(self) -> None:
        """Reset every open connection and refuse new ones until `resume`."""
        self._runner.call(self._cut())

    def resume(self) -> None:
        """Accept connections again, on the same port."""
        self._runner.call(self._listen())

    async def _listen(self) -> None:
        if self._server is None:
            host, port = self._address.host, self._address.port
            self._server = await asyncio.start_server(self._handle, host, port)
            bound: int = self._server.sockets[0].getsockname()[1]
            self._address = servers.Address(host, bound)

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        await asyncio.gather(*self._links, return_exceptions=True)
        if self._server is not None:
            # Only now: since Python 3.12 wait_closed() also waits for open connections.
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = asyncio.current_task()
        assert link is not None
        self._links.add(link)
        self._writers.add(writer)
        try:
            if self._server is not None and self._server.is_serving():
                self.accepted += 1
                await self._forward(reader, writer)
        finally:
            await _close(writer)
            self._writers.discard(writer)
            self._links.discard(link)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target.host, self.target.port)
        except OSError:
            return  # the target is down: the client sees its connection closed
        self._writers.add(up_writer)
        try:
            await _splice(reader, writer, up_reader, up_writer, lambda: self.latency_s)
        finally:
            await _close(up_writer)
            self._writers.discard(up_writer)


ProxyFactory = Callable[[str, int], TcpProxy]


@pytest.fixture
def tcp_proxy() -> Iterator[ProxyFactory]:
    """Factory: ``tcp_proxy(host, port)`` starts a `TcpProxy` to that address."""
    runner = _LoopThread()
    proxies: list[TcpProxy] = []

    def start(host: str, port: int) -> TcpProxy:
        proxy = TcpProxy(servers.Address(host, port), runner)
        proxy.resume()
        proxies.append(proxy)
        return proxy

    try:
        yield start
    finally:
        for proxy in proxies:
            proxy.cut()
        runner.close()


async def _splice(
    a_reader: asyncio.StreamReader,
    a_writer: asyncio.StreamWriter,
    b_reader: asyncio.StreamReader,
    b_writer: asyncio.StreamWriter,
    latency: Callable[[], float],
) -> None:
    """Copy both ways until either side ends; then the link is over."""
    pumps = {
        asyncio.create_task(_pump(a_reader, b_writer, latency)),
        asyncio.create_task(_pump(b_reader, a_writer, latency)),
    }
    _, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    for pump in pending:
        pump.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


async def _pump(
    source: asyncio.StreamReader, sink: asyncio.StreamWriter, latency: Callable[[], float]
) -> None:
    with contextlib.suppress(OSError):
        while chunk := await source.read(CHUNK):
            if delay := latency():
                await asyncio.sleep(delay)
            sink.write(chunk)
            await sink.drain()


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
