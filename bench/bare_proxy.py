"""The baseline: a pass-through proxy in a few lines of the gateway's own HTTP stack.

Starlette with one aiohttp session, nothing else: no parsing, routing, metering or failover. It is
the physical limit for a Python proxy on this machine, so the gateway is judged as a ratio of it.
Served by ``bench.serve`` on the same ASGI server as the gateway it is compared with.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


def make_app(session: aiohttp.ClientSession, upstream: str) -> Starlette:
    async def proxy(request: Request) -> Response:
        body = await request.body()
        resp = await session.post(
            upstream + request.url.path, data=body, headers={"content-type": "application/json"}
        )
        if resp.headers.get("content-type", "").startswith("text/event-stream"):

            async def relay() -> AsyncIterator[bytes]:
                async for chunk in resp.content.iter_any():
                    yield chunk
                resp.release()

            return StreamingResponse(relay(), media_type="text/event-stream")
        data = await resp.read()
        return Response(data, resp.status, media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(b"ok")

    return Starlette(
        routes=[Route("/v1/{path:path}", proxy, methods=["POST"]), Route("/healthz", health)]
    )
