"""Serving an ASGI app in the test's own event loop, over real loopback HTTP.

Most gateway and control-plane tests run the app in process (STYLE §6): the app's state stays at
hand (``app.state``), and still every request crosses a real socket and a real ASGI server.
`serving` is the one way tests do it, on the same primitives the shipped entry points use
(`fleet_core.shared.asgi_server`): the socket is bound to port 0 and listening before the server
starts, so the URL is known at once, nothing can take the port in between, and a request sent
before the accept loop runs waits in the backlog. hypercorn by default; ``server="uvicorn"`` for
the gateway as it ships.

``fleet_core.devtools.stub_engine.running_app`` does the same for the shipped development tools
(the stub engine's and the hub's commands, the gateway's ``--demo``), which cannot import this
harness; tests use `serving`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fleet_core.control_plane.app import ApiserverSettings, create_apiserver_app, open_resources
from fleet_core.shared.asgi_server import Server, listening_socket, serve_socket
from fleet_core.shared.http_limits import HttpLimits

__all__ = ["control_plane_app", "serving"]


@contextlib.asynccontextmanager
async def serving(
    app: object,
    *,
    server: Server = "hypercorn",
    grace_s: float = 1.0,
    limits: HttpLimits | None = None,
) -> AsyncIterator[str]:
    """Serve ``app`` on a free loopback port for the block; its base URL. On exit the server
    stops accepting and gives open requests ``grace_s`` to finish before cancelling them."""
    sock = listening_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    stop = asyncio.Event()
    task = asyncio.create_task(
        serve_socket(app, sock, grace_s=grace_s, stop=stop, server=server, limits=limits)
    )
    try:
        yield url
    finally:
        stop.set()
        await task


@contextlib.asynccontextmanager
async def control_plane_app(settings: ApiserverSettings) -> AsyncIterator[str]:
    """The control plane for ``settings``, its resources opened, served in process; its URL."""
    async with (
        open_resources(settings) as resources,
        serving(create_apiserver_app(settings, resources)) as url,
    ):
        yield url
