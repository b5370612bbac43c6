"""Fixtures for gateway tests: stub engines and gateways served for real over loopback."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import openai
import pytest
from starlette.applications import Starlette

from fleet_core.gateway.app import create_gateway_app, open_resources
from fleet_core.gateway.config import GatewayConfig, validate
from fleet_core.settings import GatewaySettings, LogSettings, admission_from_env
from fleet_core.stub_engine import StubSettings, create_app, running_app
from fleet_testing.fix_fault_engine import FaultEngine, FaultEngineFactory

from .money import Books

TPM = 6000
"""The anonymous tenant's tokens per minute in a `Rig`: 100 a second of refill."""
READ_TIMEOUT_S = 0.5
MSG = [{"role": "user", "content": "hello there"}]


@dataclass
class Served:
    url: str
    app: Starlette
    stack: contextlib.AsyncExitStack | None = None

    def stats(self) -> Any:
        return self.app.state.stats

    def client(self) -> openai.AsyncOpenAI:
        """An SDK client for this server, closed with the test however the test ends."""
        assert self.stack is not None
        client = openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)
        self.stack.push_async_callback(client.close)
        return client


StubFactory = Callable[..., Awaitable[Served]]
GatewayFactory = Callable[..., Awaitable[Served]]


@pytest.fixture
async def stack() -> AsyncIterator[contextlib.AsyncExitStack]:
    async with contextlib.AsyncExitStack() as stack:
        yield stack


@pytest.fixture
def start_stub(stack: contextlib.AsyncExitStack) -> StubFactory:
    async def start(**fields: Any) -> Served:
        app = create_app(StubSettings(**fields))
        url = await stack.enter_async_context(running_app(app))
        return Served(url, app)

    return start


@pytest.fixture
def serve_app(stack: contextlib.AsyncExitStack) -> Callable[[Any], Awaitable[str]]:
    async def serve(app: Any) -> str:
        return await stack.enter_async_context(running_app(app))

    return serve


@pytest.fixture
def start_gateway(stack: contextlib.AsyncExitStack) -> GatewayFactory:
    async def start(config: dict[str, Any], **settings: Any) -> Served:
        parsed = msgspec.convert(config, GatewayConfig)
        validate(parsed)
        full = GatewaySettings(config=parsed, log=LogSettings(access=False), **settings)
        resources = await stack.enter_async_context(open_resources(full))
        app = create_gateway_app(full, resources)
        url = await stack.enter_async_context(running_app(app))
        return Served(url, app, stack)

    return start


@dataclass
class Rig:
    gw: Served
    engine: FaultEngine
    spare: FaultEngine
    books: Books

    async def send(
        self, *, stream: bool = False, path: str = "/v1/chat/completions", **body: Any
    ) -> httpx.Response:
        """One request (chat by default; a None in ``body`` drops that field)."""
        payload = {"model": "m", "messages": MSG, "max_tokens": 1000, "stream": stream, **body}
        payload = {name: value for name, value in payload.items() if value is not None}
        async with httpx.AsyncClient(timeout=30) as http:
            response = await http.post(f"{self.gw.url}{path}", json=payload)
        self.books.statuses.append(response.status_code)
        return response


RigFactory = Callable[..., Awaitable[Rig]]


@pytest.fixture
def start_rig(
    start_gateway: GatewayFactory,
    fault_engine: FaultEngineFactory,
    redis_url: str,
    redis_prefix: str,
) -> RigFactory:
    """``await start_rig(**upstream)``: a gateway on Redis (anonymous tpm=`TPM`) whose model
    ``m`` is a `FaultEngine` (``upstream`` adds to its config), with another as its fallback."""

    async def start(env: dict[str, str] | None = None, **upstream: Any) -> Rig:
        engine = await fault_engine()
        spare = await fault_engine()
        full = {"FLEET_RATE_TPM": str(TPM), "FLEET_REDIS_URL": redis_url, **(env or {})}
        admission = admission_from_env({**full, "FLEET_REDIS_PREFIX": redis_prefix})
        first = {"id": "m", "model": "m", "base_url": engine.url, "fallbacks": ["s"], **upstream}
        config = {
            "read_timeout_s": READ_TIMEOUT_S,
            "queue_timeout_s": 0.2,
            "health": {"interval_s": 60, "eject_after": 2},
            "upstreams": [first, {"id": "s", "model": "s", "base_url": spare.url}],
        }
        gw = await start_gateway(config, admission=admission)
        key = f"{redis_prefix}fleet:rl:{{anonymous}}:tenant:tpm"
        return Rig(gw, engine, spare, Books(gw.url, redis_url, key, TPM))

    return start
