"""The gateway's app factory and the resources it runs on.

``open_resources`` opens everything with a lifetime (the one pooled aiohttp session to the
engines, the usage sink) in one ``async with``; ``create_gateway_app(settings, resources)`` wires
the features together and starts the background loops (health checks, discovery) in the lifespan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response

from fleet_core.admission.limits import LimitStore
from fleet_core.admission.service import Admission
from fleet_core.admission.store import BatchingStore, MemoryStore, open_redis_store
from fleet_core.errors import FleetError, MethodNotAllowed, NotFound
from fleet_core.gateway.discovery import poll_endpoints
from fleet_core.gateway.health import HealthChecker
from fleet_core.gateway.proxy import Proxy
from fleet_core.gateway.router import Router
from fleet_core.gateway.routes import gateway_routes
from fleet_core.gateway.routing.endpoints import EndpointRegistry
from fleet_core.gateway.service import GatewayService
from fleet_core.logs import RequestContextMiddleware
from fleet_core.metering.metrics import GatewayMetrics
from fleet_core.metering.records import RingSink
from fleet_core.settings import GatewaySettings

__all__ = ["GatewayResources", "create_gateway_app", "open_resources"]

log = logging.getLogger("fleet.gateway")
LOOPBACK_ORIGINS = r"^https?://(127\.0\.0\.1|localhost|\[::1\])(:[0-9]+)?$"
"""Browsers on this machine (the console) are allowed by default; FLEET_CORS_ORIGINS adds more."""


@dataclass
class GatewayResources:
    session: aiohttp.ClientSession
    ring: RingSink
    limits: LimitStore


@contextlib.asynccontextmanager
async def open_resources(settings: GatewaySettings) -> AsyncIterator[GatewayResources]:
    config = settings.config
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=config.connect_timeout_s, sock_read=config.read_timeout_s
    )
    redis_url = settings.admission.redis_url
    limits: LimitStore = (
        BatchingStore(await open_redis_store(redis_url)) if redis_url else MemoryStore()
    )
    try:
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False
        ) as session:
            yield GatewayResources(session, RingSink(settings.requests_ring), limits)
    finally:
        await limits.aclose()


def _render(error: FleetError) -> Response:
    return Response(
        msgspec.json.encode(error.envelope()),
        error.status,
        headers=error.headers,
        media_type="application/json",
    )


async def _on_fleet_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, FleetError)
    return _render(exc)


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        return _render(MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}"))
    if exc.status_code == 404:
        return _render(NotFound(f"no route for {request.method} {request.url.path}"))
    return _render(FleetError(str(exc.detail)))


async def _on_crash(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error serving %s", request.url.path, exc_info=exc)
    return _render(FleetError("the gateway hit an internal error; it has been logged"))


def create_gateway_app(settings: GatewaySettings, resources: GatewayResources) -> Starlette:
    config = settings.config
    registry = EndpointRegistry(eject_after=config.health.eject_after)
    router = Router(config, registry)
    proxy = Proxy(resources.session, registry, queue_timeout=config.queue_timeout_s)
    metrics = GatewayMetrics(endpoints=router.readiness)
    admission = Admission(
        keys=settings.admission.keys,
        policy=settings.admission.policy,
        store=resources.limits,
        metrics=metrics,
        prefix=settings.admission.redis_prefix,
        on_store_error=settings.admission.on_store_error,
    )
    service = GatewayService(
        table=router.current,
        proxy=proxy,
        sink=resources.ring,
        admission=admission,
        metrics=metrics,
    )
    checker = HealthChecker(
        resources.session,
        registry,
        interval=config.health.interval_s,
        timeout=config.health.timeout_s,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(checker.run(router.current), name="health")]
        if settings.control_plane_url:
            tasks.append(
                asyncio.create_task(
                    poll_endpoints(
                        resources.session,
                        settings.control_plane_url,
                        router.apply_discovery,
                        interval=settings.discovery_interval_s,
                    ),
                    name="discovery",
                )
            )
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await admission.drain()

    middleware = [
        Middleware(RequestContextMiddleware, access_log=settings.log.access),
        Middleware(
            CORSMiddleware,
            allow_origins=list(settings.admission.cors_origins),
            allow_origin_regex=LOOPBACK_ORIGINS,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["*"],
            expose_headers=["X-Request-Id", "Retry-After"],
            max_age=600,
        ),
    ]
    routes = gateway_routes(
        service,
        router,
        resources.ring,
        admission=admission,
        metrics=metrics,
        metrics_token=settings.admission.metrics_token,
        max_body=settings.max_body_bytes,
    )
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={
            FleetError: _on_fleet_error,
            HTTPException: _on_http_error,
            Exception: _on_crash,
        },
        lifespan=lifespan,
    )
    app.state.router = router
    return app
