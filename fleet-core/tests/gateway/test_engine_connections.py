"""The gateway closes an idle engine connection before the engine would (app.ENGINE_KEEP_ALIVE_S).

vLLM's uvicorn and llama.cpp's server close a connection idle for 5 s. A client that keeps it
longer (aiohttp's default is 15 s) sometimes sends its next request just as the engine closes
it, and that request fails with "server disconnected" though the engine is healthy. Here a real
HTTP server on loopback notes who closed each connection: the gateway must, within the 5 s."""

from __future__ import annotations

import asyncio
import contextlib
import time

from fleet_core.gateway.app import ENGINE_KEEP_ALIVE_S, open_resources
from fleet_core.gateway.config import GatewayConfig
from fleet_core.gateway.settings import from_env

ENGINE_IDLE_CLOSE_S = 5.0
_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}"


class _Engine(asyncio.Protocol):
    """Answers every request, keeps the connection open, and records when the client closed it."""

    def __init__(self, closed_by_client: list[float], noticed: asyncio.Event) -> None:
        self.closed_by_client, self.noticed = closed_by_client, noticed
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if b"\r\n\r\n" in data and self.transport is not None:
            self.transport.write(_ANSWER)

    def eof_received(self) -> bool:
        self.closed_by_client.append(time.monotonic())
        self.noticed.set()
        return False


async def test_an_idle_engine_connection_is_closed_by_the_gateway_first() -> None:
    assert ENGINE_KEEP_ALIVE_S < ENGINE_IDLE_CLOSE_S
    closed: list[float] = []
    noticed = asyncio.Event()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Engine(closed, noticed), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with open_resources(from_env({}, GatewayConfig())) as resources:
            async with resources.session.get(f"http://127.0.0.1:{port}/health") as response:
                assert await response.read() == b"{}"
            answered = time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(noticed.wait(), ENGINE_IDLE_CLOSE_S + 2)
    finally:
        server.close()
    assert closed, "the gateway kept the idle connection past the engine's own limit"
    assert closed[0] - answered < ENGINE_IDLE_CLOSE_S - 0.5
