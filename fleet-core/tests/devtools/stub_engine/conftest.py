"""Stubs served in-process over real loopback HTTP, one fresh stub per test.

``launch(**fields)`` starts a stub with ``StubSettings(model=MODEL, **fields)`` and returns its
app (``app.state.base_url`` holds the URL); every stub started in a test stops when it ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from fleet_core.devtools.stub_engine import StubSettings, create_app
from fleet_testing.asgi import serving

MODEL = "stub-model"

Launch = Callable[..., Awaitable[Starlette]]


@pytest.fixture
async def launch() -> AsyncIterator[Launch]:
    async with contextlib.AsyncExitStack() as stack:

        async def start(**fields: Any) -> Starlette:
            app = create_app(StubSettings(model=MODEL, **fields))
            app.state.base_url = await stack.enter_async_context(serving(app))
            return app

        yield start


@pytest.fixture
async def stub(launch: Launch) -> Starlette:
    """A default vLLM-profile stub."""
    return await launch()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as client:
        yield client
