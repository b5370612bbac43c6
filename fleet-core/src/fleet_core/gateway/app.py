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
from starlette.applications import Starlette

from fleet_core import web
from fleet_core.admission.limits import LimitStore
from fleet_core.admission.service import Admission
from fleet_core.admission.store import BatchingStore, MemoryStore, open_redis_store
from fleet_core.gateway.discovery import poll_endpoints
from fleet_core.gateway.health import HealthChecker
from fleet_core.gateway.proxy import Proxy
from fleet_core.gateway.router import Router
from fleet_core.gateway.routes import gateway_routes
from fleet_core.gateway.routing.endpoints import EndpointRegistry
from fleet_core.gateway.service import GatewayService
from fleet_core.metering.metrics import GatewayMetrics
from fleet_core.metering.records import RingSink
from fleet_core.settings import GatewaySettings

__all__ = ["GatewayResources", "create_gateway_app", "open_resources"]

log = logging.getLogger("fleet.gateway")


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

    middleware = web.middleware(
        access_log=settings.log.access, cors_origins=settings.admission.cors_origins
    )
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
        exception_handlers=web.exception_handlers(),
        lifespan=lifespan,
    )
    app.state.router = router
    return app
