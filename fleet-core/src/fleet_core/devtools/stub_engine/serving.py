"""Serve a stub with hypercorn inside an event loop that is already running.

Tests and the gateway's ``--demo`` mode need a stub on a free port without a subprocess. The
listening socket is bound here, before hypercorn starts, and handed over as ``fd://``: the port is
known at once (no probe-then-bind race), and connections made before hypercorn's accept loop runs
wait in the backlog instead of failing. Leaving the ``async with`` block shuts the server down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from typing import cast

from hypercorn.asyncio import serve
from hypercorn.config import Config
from hypercorn.typing import ASGIFramework
from starlette.types import ASGIApp

from fleet_core.devtools.stub_engine.app import create_app
from fleet_core.devtools.stub_engine.settings import StubSettings

__all__ = ["running_app", "running_stub"]

_BACKLOG = 1024


@contextlib.asynccontextmanager
async def running_stub(
    settings: StubSettings, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[str]:
    """Serve a new stub for ``settings``; yields its base URL, e.g. ``http://127.0.0.1:54321``."""
    async with running_app(create_app(settings), host, port) as url:
        yield url


@contextlib.asynccontextmanager
async def running_app(
    app: ASGIApp, host: str = "127.0.0.1", port: int = 0, *, graceful_timeout: float = 1.0
) -> AsyncIterator[str]:
    """Serve ``app`` (e.g. from `create_app`, to keep a handle on ``app.state``); yields the URL.

    ``graceful_timeout``: how long shutdown waits for open requests before cancelling them.
    """
    sock = _listen(host, port)
    url = _url(sock)
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]  # hypercorn owns (and closes) the socket from here
    config.errorlog = logging.getLogger("hypercorn.error")  # a Logger: hypercorn adds no handler
    config.graceful_timeout = graceful_timeout
    stop = asyncio.Event()
    # Starlette types scopes as plain mappings, hypercorn as TypedDicts: the same ASGI, spelt twice.
    framework = cast(ASGIFramework, app)
    server = asyncio.create_task(serve(framework, config, shutdown_trigger=stop.wait))
    try:
        yield url
    finally:
        stop.set()
        await server


def _listen(host: str, port: int) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if sock.family == socket.AF_INET6 else f"http://{host}:{port}"
