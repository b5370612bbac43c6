"""The gateway's HTTP edge: decode, one service call, encode. No routing or metering logic here."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from fleet_core import web
from fleet_core.admission.keys import Principal
from fleet_core.admission.service import Admission
from fleet_core.errors import InvalidRequest, PayloadTooLarge
from fleet_core.gateway.responses import SSE_HEADERS, ClientGone, until_disconnect, watch_start
from fleet_core.gateway.router import Router
from fleet_core.gateway.service import ClientLeft, Exchange, GatewayService
from fleet_core.gateway.viewers import Viewers
from fleet_core.gateway.wire import Kind, parse_request
from fleet_core.metering.metrics import GatewayMetrics
from fleet_core.metering.records import RingSink

__all__ = ["gateway_routes"]

_DRAIN_FACTOR = 4


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, or 413 once it is known to exceed ``limit``.

    An oversized body is still read (and dropped) up to ``_DRAIN_FACTOR`` times the limit before
    answering: closing a socket with unread data makes the kernel send RST, and the client would
    see a reset instead of the 413 that explains it.
    """
    declared = request.headers.get("content-length")
    too_big = bool(declared and declared.isdigit() and int(declared) > limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            too_big = True
        if too_big:
            if size > limit * _DRAIN_FACTOR:
                break
            continue
        chunks.append(chunk)
    if too_big:
        shown = declared if declared and declared.isdigit() else f"more than {limit}"
        raise PayloadTooLarge(
            f"request body of {shown} bytes exceeds the limit of {limit} (FLEET_MAX_BODY_BYTES)"
        )
    return b"".join(chunks)


class _Endpoints:
    def __init__(
        self,
        service: GatewayService,
        router: Router,
        ring: RingSink,
        *,
        admission: Admission,
        metrics: GatewayMetrics,
        viewers: Viewers,
        max_body: int,
    ) -> None:
        self.service, self.router, self.ring, self.max_body = service, router, ring, max_body
        self.admission, self.metrics, self.viewers = admission, metrics, viewers

    async def _reader(self, request: Request) -> Principal | None:
        """Whose records a caller may read: None for everyone's (the metrics credential), else
        its key's tenant."""
        authorization = request.headers.get("authorization")
        if await self.viewers.sees_all(authorization):
            return None
        return self.admission.authenticate(authorization)

    def proxy(self, kind: Kind) -> Any:
        async def endpoint(request: Request) -> Any:
            received = time.time()
            principal = self.admission.authenticate(request.headers.get("authorization"))
            try:
                raw = await read_body(request, self.max_body)
            except ClientDisconnect:  # left mid-upload: nothing admitted, nobody to answer
                return Response(status_code=499)
            exchange = self.service.begin(
                parse_request(kind, raw),
                principal=principal,
                request_id=request.state.request_id,
                client_request_id=request.state.client_request_id,
                received_at=received,
                session=request.headers.get("x-session-id"),
            )
            return _Answer(self.service, exchange)

        return endpoint

    async def models(self, request: Request) -> Response:
        self.admission.authenticate(request.headers.get("authorization"))
        table = self.router.table
        data = []
        for pool in table.pools.values():
            ready = any(self.router.registry.get(t.url).ready for t in pool.targets)
            entry = {"object": "model", "created": 0, "owned_by": pool.engine, "ready": ready}
            data.append({"id": pool.name, **entry})
            data += [{"id": alias, "root": pool.name, **entry} for alias in pool.aliases]
        return web.json_response({"object": "list", "data": data})

    async def health(self, request: Request) -> Response:
        """ok or degraded for anyone; the upstreams (engine URLs) for the metrics credential."""
        body: dict[str, Any] = {"status": "ok" if self.router.any_ready() else "degraded"}
        if await self.viewers.sees_all(request.headers.get("authorization")):
            body["upstreams"] = self.router.describe()
        return web.json_response(body)

    async def healthz(self, request: Request) -> Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        """503 while the gateway could not serve: no ready endpoint, or admission down."""
        problems = [] if self.router.any_ready() else ["no ready endpoint"]
        if admission_problem := await self.admission.ready():
            problems.append(admission_problem)
        body: dict[str, Any] = {"status": "; ".join(problems) or "ready"}
        if await self.viewers.sees_all(request.headers.get("authorization")):
            body["upstreams"] = self.router.describe()
        return web.json_response(body, 503 if problems else 200)

    async def requests(self, request: Request) -> Response:
        """Recent usage records; a tenant's key sees its own tenant's only."""
        viewer = await self._reader(request)
        raw = request.query_params.get("limit", "100")
        if not raw.isdigit():
            raise InvalidRequest("limit must be a non-negative integer", param="limit")
        records = self.ring.recent(1000)
        if viewer is not None:
            records = [r for r in records if r.tenant == viewer.tenant]
        return web.json_response({"object": "list", "data": records[: min(int(raw), 1000)]})

    async def prometheus(self, request: Request) -> Response:
        await self.viewers.require(request.headers.get("authorization"))
        body, content_type = self.metrics.render(request.headers.get("accept"))
        return Response(body, headers={"Content-Type": content_type})


class _Answer:
    """The ASGI answer to a proxied request. The whole exchange, from admission to the last byte
    sent, runs inside ``service.admitted``, which records and settles it once on every path.
    An error raised before anything was sent reaches Starlette's handler: an envelope."""

    def __init__(self, service: GatewayService, exchange: Exchange) -> None:
        self.service, self.exchange = service, exchange

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        send, started = watch_start(send)
        with contextlib.suppress(ClientLeft):
            async with self.service.admitted(self.exchange):
                try:
                    await until_disconnect(self._answer(scope, receive, send), receive)
                except ClientGone as exc:
                    raise ClientLeft from exc
        if not started[0]:  # the client left first: a status for the access log only
            await Response(status_code=499)(scope, receive, send)

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> None:
        exchange = self.exchange
        opened = await self.service.open(exchange)
        if exchange.request.stream and opened.response.status < 400:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            async with contextlib.aclosing(self.service.stream(exchange)) as frames:
                async for frame in frames:
                    await send({"type": "http.response.body", "body": frame, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        reply = await self.service.buffered(exchange)
        response = Response(reply.body, reply.status, media_type=reply.content_type)
        await response(scope, receive, send)


def gateway_routes(
    service: GatewayService,
    router: Router,
    ring: RingSink,
    *,
    admission: Admission,
    metrics: GatewayMetrics,
    viewers: Viewers,
    max_body: int,
) -> list[BaseRoute]:
    ep = _Endpoints(
        service,
        router,
        ring,
        admission=admission,
        metrics=metrics,
        viewers=viewers,
        max_body=max_body,
    )
    return [
        Route("/v1/chat/completions", ep.proxy("chat"), methods=["POST"]),
        Route("/v1/completions", ep.proxy("completions"), methods=["POST"]),
        Route("/v1/embeddings", ep.proxy("embeddings"), methods=["POST"]),
        Route("/v1/models", ep.models, methods=["GET"]),
        Route("/health", ep.health, methods=["GET"]),
        Route("/healthz", ep.healthz, methods=["GET"]),
        Route("/readyz", ep.readyz, methods=["GET"]),
        Route("/api/v1/requests", ep.requests, methods=["GET"]),
        Route("/metrics", ep.prometheus, methods=["GET"]),
    ]
