"""Fixtures for gateway tests: stub engines and gateways served for real over loopback."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import openai
import pytest
from starlette.applications import Starlette

from fleet_core.gateway.app import create_gateway_app, open_resources
from fleet_core.gateway.config import GatewayConfig, validate
from fleet_core.settings import GatewaySettings, LogSettings
from fleet_core.stub_engine import StubSettings, create_app, running_app


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
