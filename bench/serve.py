"""Serve the gateway or the bare proxy on a chosen ASGI server, for like-for-like comparisons.

Usage: python -m bench.serve uvicorn|hypercorn|granian gateway|bare PORT UPSTREAM_OR_CONFIG
The gateway is built exactly as ``fleet-gateway`` builds it (same settings, resources and app
factory); only the server around it changes. uvicorn and hypercorn are started by
``fleet_core.shared.asgi_server.serve_app``, as ``fleet-gateway --server`` starts them (uvicorn with
httptools); granian, which Fleet does not ship, by its embeddable server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from bench import bare_proxy
from fleet_core.gateway.app import create_gateway_app, open_resources
from fleet_core.gateway.config import load_config
from fleet_core.gateway.settings import from_env
from fleet_core.shared.asgi_server import SERVERS, serve_app, settle_heap


@contextlib.asynccontextmanager
async def build(kind: str, target: str) -> AsyncIterator[Any]:
    if kind == "bare":
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            yield bare_proxy.make_app(session, target)
        return
    settings = from_env(os.environ, load_config(Path(target)))
    async with open_resources(settings) as resources:
        app = create_gateway_app(settings, resources)
        settle_heap()  # as fleet-gateway does before serving
        yield app


async def run(server: str, app: Any, port: int, stop: asyncio.Event) -> None:
    if (
        server in SERVERS
    ):  # exactly as fleet-gateway --server runs it (fleet_core/shared/asgi_server.py)
        await serve_app(app, f"127.0.0.1:{port}", grace_s=1, stop=stop, server=server)
        return
    from granian.constants import Interfaces
    from granian.server.embed import Server

    instance = Server(
        app, address="127.0.0.1", port=port, interface=Interfaces.ASGI, log_enabled=False
    )
    task = asyncio.create_task(instance.serve())
    await stop.wait()
    instance.stop()  # type: ignore[no-untyped-call]
    await task


async def main(server: str, kind: str, port: int, target: str) -> None:
    logging.basicConfig(level=logging.WARNING)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with build(kind, target) as app:
        await run(server, app, port, stop)


if __name__ == "__main__":
    uvloop.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
