"""The baseline: a pass-through proxy in a few lines of the gateway's own HTTP stack.

Starlette on hypercorn with one aiohttp session, nothing else: no parsing, routing, metering or
failover. It is the physical limit for a Python proxy on this machine, so the gateway is judged
as a ratio of it. Usage: python -m bench.bare_proxy PORT UPSTREAM_URL
"""

from __future__ import annotations

import sys

import aiohttp
import uvloop
from hypercorn.asyncio import serve
from hypercorn.config import Config
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


async def main(port: int, upstream: str) -> None:
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def proxy(request: Request) -> Response:
        body = await request.body()
        resp = await session.post(
            upstream + request.url.path, data=body, headers={"content-type": "application/json"}
        )
        if resp.headers.get("content-type", "").startswith("text/event-stream"):

            async def relay():  # type: ignore[no-untyped-def]
                async for chunk in resp.content.iter_any():
                    yield chunk
                resp.release()

            return StreamingResponse(relay(), media_type="text/event-stream")
        data = await resp.read()
        return Response(data, resp.status, media_type="application/json")

    app = Starlette(routes=[Route("/v1/{path:path}", proxy, methods=["POST"])])
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    await serve(app, config)  # type: ignore[arg-type]


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1]), sys.argv[2]))
