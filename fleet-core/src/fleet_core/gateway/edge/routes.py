"""The gateway's HTTP edge: decode, one service call, encode. No routing or metering logic here."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, NamedTuple

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from fleet_core.gateway.admission.service import Admission
from fleet_core.gateway.edge.responses import ClientGone, send_stream, until_disconnect
from fleet_core.gateway.edge.viewers import Viewers
from fleet_core.gateway.edge.wire import Kind, parse_request
from fleet_core.gateway.exchange.router import Router
from fleet_core.gateway.exchange.service import PATHS, ClientLeft, Exchange, GatewayService
from fleet_core.gateway.metering.metrics import GatewayMetrics
from fleet_core.gateway.metering.records import RingSink, UsageRecord
from fleet_core.shared import paging, web
from fleet_core.shared.errors import FleetError, InvalidRequest, PayloadTooLarge

__all__ = ["error_response", "gateway_routes", "read_body", "receive_body"]

log = logging.getLogger("fleet.web")

_DRAIN_FACTOR = 4


async def read_body(request: Request, limit: int) -> bytes:
    """`receive_body` for a Starlette request (the console's proxy)."""
    return await receive_body(request.receive, request.headers.get("content-length"), limit)


async def receive_body(receive: Receive, declared: str | None, limit: int) -> bytes:
    """The request body, or 413 once it is known to exceed ``limit``; ClientDisconnect if the
    client leaves mid-upload. ``declared``: the Content-Length header, if any.

    An oversized body is still read (and dropped) up to ``_DRAIN_FACTOR`` times the limit before
    answering: closing a socket with unread data makes the kernel send RST, and the client would
    see a reset instead of the 413 that explains it.
    """
    too_big = bool(declared and declared.isdigit() and int(declared) > limit)
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect
        chunk, more = message.get("body", b""), message.get("more_body", False)
        size += len(chunk)
        too_big = too_big or size > limit
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
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class _Headers(NamedTuple):
    """The request headers a proxied request reads, found in one pass (first of each wins)."""

    authorization: str | None = None
    content_length: str | None = None
    session: str | None = None

    @classmethod
    def of(cls, raw: list[tuple[bytes, bytes]]) -> _Headers:
        found = dict(reversed(raw))  # reversed: the first of a repeated header is kept
        return cls(
            _text(found.get(b"authorization")),
            _text(found.get(b"content-length")),
            _text(found.get(b"x-session-id")),
        )


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


class _Proxy:
    """``POST /v1/chat/completions`` (``completions``, ``embeddings``) as a plain ASGI app, so
    `GatewayApp` can call it without Starlette's stack (Starlette's router calls it too, for
    requests with an Origin header). It renders its own errors with the same envelope Starlette's
    handlers would (`error_response`): nothing raised before the first byte reaches the server."""

    def __init__(self, endpoints: _Endpoints, kind: Kind) -> None:
        self.endpoints, self.kind = endpoints, kind

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            answer = await self._begin(scope, receive, send)
        except Exception as exc:
            await error_response(exc, scope["path"])(scope, receive, send)
            return
        if answer is not None:
            await answer.run(scope, receive, send)

    async def _begin(self, scope: Scope, receive: Receive, send: Send) -> _Answer | None:
        """Read, authenticate, parse and route the request; None when the client left
        mid-upload (nothing admitted: a 499 for the access log is sent here)."""
        received = time.time()
        ep, headers = self.endpoints, _Headers.of(scope["headers"])
        principal = ep.admission.authenticate(headers.authorization)
        try:
            raw = await receive_body(receive, headers.content_length, ep.max_body)
        except ClientDisconnect:  # left mid-upload: nothing admitted, nobody to answer
            await Response(status_code=499)(scope, receive, send)
            return None
        state = scope["state"]
        exchange = ep.service.begin(
            parse_request(self.kind, raw),
            principal=principal,
            request_id=state["request_id"],
            client_request_id=state["client_request_id"],
            received_at=received,
            session=headers.session,
        )
        return _Answer(ep.service, exchange)


def error_response(exc: Exception, path: str) -> Response:
    """The envelope Starlette's handlers (`web.exception_handlers`) give ``exc``."""
    if isinstance(exc, FleetError):
        return web.render(exc)
    log.exception("unhandled error serving %s", path, exc_info=exc)
    return web.render(FleetError("an internal error occurred; it has been logged"))


def _no_problem() -> str | None:
    return None


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
        sink_problem: Callable[[], str | None] = _no_problem,
    ) -> None:
        self.service, self.router, self.ring, self.max_body = service, router, ring, max_body
        self.admission, self.metrics, self.viewers = admission, metrics, viewers
        self.sink_problem = sink_problem

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
        """503 while the gateway could not serve: no ready endpoint (check ``endpoints``),
        admission down (``admission``), or the ledger writer stopped (``ledger``: records would
        pile up in memory, unwritten). As kube-apiserver's, ``?exclude=NAME`` (repeatable) leaves
        a check out: a Kubernetes readiness probe excludes ``endpoints``, which every replica
        shares, so a fleet with no model up still answers its clients with an envelope."""
        excluded = set(request.query_params.getlist("exclude"))
        if unknown := excluded - READY_CHECKS:
            raise InvalidRequest(
                f"unknown readiness check {sorted(unknown)[0]!r}; the checks are "
                + ", ".join(sorted(READY_CHECKS)),
                param="exclude",
            )
        checks: dict[str, str | None] = {}
        if "endpoints" not in excluded:
            checks["endpoints"] = None if self.router.any_ready() else "no ready endpoint"
        if "admission" not in excluded:
            checks["admission"] = await self.admission.ready()
        if "ledger" not in excluded:
            checks["ledger"] = self.sink_problem()
        problems = [problem for problem in checks.values() if problem]
        body: dict[str, Any] = {"status": "; ".join(problems) or "ready"}
        if await self.viewers.sees_all(request.headers.get("authorization")):
            body["upstreams"] = self.router.describe()
        return web.json_response(body, 503 if problems else 200)

    async def requests(self, request: Request) -> Response:
        """Recent usage records; a tenant's key sees its own tenant's only, without the engine
        endpoint that served each (a pod's address is the operator's business)."""
        viewer = await self.viewers.reader(request.headers.get("authorization"))
        page = paging.page(request.query_params, ["time", "text"], most=RECENT)
        records = self.ring.recent(RECENT)
        if viewer is not None:
            records = [
                msgspec.structs.replace(r, endpoint=None)
                for r in records
                if r.tenant == viewer.tenant
            ]
        rows = paging.window(records, page, _newest, descending=True)
        return web.json_response(paging.listing(rows, page, _newest))

    async def prometheus(self, request: Request) -> Response:
        await self.viewers.require(request.headers.get("authorization"))
        body, content_type = self.metrics.render(request.headers.get("accept"))
        return Response(body, headers={"Content-Type": content_type})


READY_CHECKS = frozenset({"endpoints", "admission", "ledger"})
"""What ``/readyz`` checks, each one a name ``?exclude=`` may leave out."""
RECENT = 1000
"""The most records ``/api/v1/requests`` looks at (and its largest page)."""


def _newest(record: UsageRecord) -> tuple[datetime, str]:
    """The log's order, newest first: when a request was done, then its id."""
    return datetime.fromtimestamp(record.done_at, UTC), record.request_id


class _Answer:
    """The answer to a proxied request. The whole exchange, from admission to the last byte
    sent, runs inside ``service.admitted``, which records and settles it once on every path.
    An error raised before anything was sent becomes an envelope; after, it goes to the server
    (which closes the connection: the client holds part of an answer)."""

    __slots__ = ("exchange", "service", "started")

    def __init__(self, service: GatewayService, exchange: Exchange) -> None:
        self.service, self.exchange, self.started = service, exchange, False

    async def run(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            with contextlib.suppress(ClientLeft):
                async with self.service.admitted(self.exchange):
                    try:
                        await until_disconnect(self._answer(send), receive)
                    except ClientGone as exc:
                        raise ClientLeft from exc
        except Exception as exc:
            if self.started:
                raise
            await error_response(exc, scope["path"])(scope, receive, send)
            return
        if not self.started:  # the client left first: a status for the access log only
            await Response(status_code=499)(scope, receive, send)

    async def _answer(self, send: Send) -> None:
        exchange = self.exchange
        opened = await self.service.open(exchange)
        if exchange.request.stream and opened.response.status < 400:
            self.started = True
            async with contextlib.aclosing(self.service.stream(exchange)) as frames:
                await send_stream(send, frames)
            return
        reply = await self.service.buffered(exchange)
        headers = [
            (b"content-type", reply.content_type.encode("latin-1")),
            (b"content-length", b"%d" % len(reply.body)),
        ]
        self.started = True
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": reply.body})


def gateway_routes(
    service: GatewayService,
    router: Router,
    ring: RingSink,
    *,
    admission: Admission,
    metrics: GatewayMetrics,
    viewers: Viewers,
    max_body: int,
    sink_problem: Callable[[], str | None] = _no_problem,
) -> tuple[dict[str, ASGIApp], list[BaseRoute]]:
    """The OpenAI POST routes as plain ASGI apps by path (for `GatewayApp`), and every route
    (those included) for the Starlette app. ``sink_problem`` says why usage records cannot be
    kept (the ledger writer stopped), for ``/readyz``."""
    ep = _Endpoints(
        service,
        router,
        ring,
        admission=admission,
        metrics=metrics,
        viewers=viewers,
        max_body=max_body,
        sink_problem=sink_problem,
    )
    proxies: dict[str, ASGIApp] = {path: _Proxy(ep, kind) for kind, path in PATHS.items()}
    return proxies, [
        *(Route(path, proxy, methods=["POST"]) for path, proxy in proxies.items()),
        Route("/v1/models", ep.models, methods=["GET"]),
        Route("/health", ep.health, methods=["GET"]),
        Route("/healthz", ep.healthz, methods=["GET"]),
        Route("/readyz", ep.readyz, methods=["GET"]),
        Route("/api/v1/requests", ep.requests, methods=["GET"]),
        Route("/metrics", ep.prometheus, methods=["GET"]),
    ]
