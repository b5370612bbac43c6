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
from starlette.requests import Request
from starlette.responses import Response

from fleet_core.errors import FleetError, MethodNotAllowed, NotFound
from fleet_core.gateway.discovery import poll_endpoints
from fleet_core.gateway.health import HealthChecker
from fleet_core.gateway.proxy import Proxy
from fleet_core.gateway.router import Router
from fleet_core.gateway.routes import gateway_routes
from fleet_core.gateway.routing.endpoints import EndpointRegistry
from fleet_core.gateway.service import GatewayService
from fleet_core.logs import RequestContextMiddleware
from fleet_core.metering.records import RingSink
from fleet_core.settings import GatewaySettings

__all__ = ["GatewayResources", "create_gateway_app", "open_resources"]

log = logging.getLogger("fleet.gateway")


@dataclass
class GatewayResources:
    session: aiohttp.ClientSession
    ring: RingSink


@contextlib.asynccontextmanager
async def open_resources(settings: GatewaySettings) -> AsyncIterator[GatewayResources]:
    config = settings.config
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=config.connect_timeout_s, sock_read=config.read_timeout_s
    )
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False
    ) as session:
        yield GatewayResources(session=session, ring=RingSink(settings.requests_ring))


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
    service = GatewayService(table=router.current, proxy=proxy, sink=resources.ring)
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

    middleware = [Middleware(RequestContextMiddleware, access_log=settings.log.access)]
    app = Starlette(
        routes=gateway_routes(service, router, resources.ring, max_body=settings.max_body_bytes),
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
