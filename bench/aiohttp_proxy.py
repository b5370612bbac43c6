"""The floor: a pass-through proxy on aiohttp's own server and client, nothing else.

No ASGI layer, no parsing, routing, metering or failover: the fastest a Python proxy written with
the gateway's HTTP client gets on this machine, so every gateway ratio is stated against it.
(The Starlette bare proxy on hypercorn, ``bare_proxy.py``, stays as a second row: it shows what the
ASGI server alone costs.)

Usage: python -m bench.aiohttp_proxy PORT UPSTREAM
"""

from __future__ import annotations

import sys

import aiohttp
import uvloop
from aiohttp import web


def make_app(upstream: str) -> web.Application:
    async def start(app: web.Application) -> None:
        app["session"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
        )

    async def stop(app: web.Application) -> None:
        await app["session"].close()

    async def proxy(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        session: aiohttp.ClientSession = request.app["session"]
        headers = {"content-type": "application/json"}
        async with session.post(upstream + request.path, data=body, headers=headers) as resp:
            if not resp.headers.get("content-type", "").startswith("text/event-stream"):
                data = await resp.read()
                return web.Response(body=data, status=resp.status, content_type="application/json")
            out = web.StreamResponse(status=resp.status)
            out.content_type = "text/event-stream"
            await out.prepare(request)
            async for chunk in resp.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/{path:.*}", proxy)
    app.router.add_get("/healthz", health)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app


if __name__ == "__main__":
    web.run_app(
        make_app(sys.argv[2]),
        host="127.0.0.1",
        port=int(sys.argv[1]),
        access_log=None,
        print=None,
        loop=uvloop.new_event_loop(),
    )
