"""The control plane's app factory and resources.

With ``FLEET_DATABASE_URL`` the resources hold the psycopg pool (opened, checked and migrated at
start) and every feature keeps its rows in Postgres. Without one, the control plane still serves
what needs no database — inventory, endpoints for the gateway, health — and answers the rest with
503 ``database_required`` naming the variable to set.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import msgspec
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from fleet_core.control_plane import openapi, operations
from fleet_core.control_plane.access import ANY_CREDENTIAL, POLICY
from fleet_core.control_plane.api_keys.routes import keys_routes
from fleet_core.control_plane.auth import guard
from fleet_core.control_plane.auth.routes import auth_routes
from fleet_core.control_plane.auth.service import AuthService
from fleet_core.control_plane.budget_rules.routes import budget_routes
from fleet_core.control_plane.costs.routes import cost_routes
from fleet_core.control_plane.costs.service import CostSettings
from fleet_core.control_plane.inventory.routes import inventory_routes
from fleet_core.control_plane.inventory.store import (
    InventoryStore,
    MemoryInventory,
    PostgresInventory,
)
from fleet_core.control_plane.rates.routes import rates_routes
from fleet_core.control_plane.registry.routes import registry_routes
from fleet_core.control_plane.registry.service import RegistryService
from fleet_core.control_plane.registry.settings import RegistrySettings
from fleet_core.control_plane.tenants.routes import tenants_routes
from fleet_core.control_plane.usage.routes import usage_routes
from fleet_core.shared import web
from fleet_core.shared.errors import NotFound, Unavailable, shown
from fleet_core.shared.http_limits import HttpLimits
from fleet_core.shared.settings import LogSettings
from fleet_core.shared.storage.db import open_pool

__all__ = ["ApiserverResources", "ApiserverSettings", "create_apiserver_app", "open_resources"]

DATABASE_COLLECTIONS = (
    "tenants",
    "projects",
    "keys",
    "budget-rules",
    "usage",
    "usage-agreement",
    "model-rates",
    "cost-rates",
    "cost-periods",
    "models",
)


@dataclass(frozen=True)
class ApiserverSettings:
    listen: str = "127.0.0.1:8081"
    """Where to serve (``--listen``)."""
    database_url: str | None = field(default=None, repr=False)
    """Postgres (FLEET_DATABASE_URL); unset: inventory and health only."""
    admin_token: str | None = field(default=None, repr=False)
    """The bootstrap admin credential (FLEET_ADMIN_TOKEN or FLEET_ADMIN_TOKEN_FILE); required
    unless the database already holds an active admin credential (ADR 0009)."""
    shutdown_grace_s: float = 30.0
    """On SIGTERM, how long in-flight requests may take (FLEET_SHUTDOWN_GRACE_S)."""
    http_limits: HttpLimits = field(default_factory=HttpLimits)
    """What a client may send before the app sees it (FLEET_HTTP_*: docs/security.md)."""
    cors_origins: tuple[str, ...] = ()
    """Origins allowed besides loopback ones (FLEET_CORS_ORIGINS)."""
    log: LogSettings = field(default_factory=LogSettings)
    costs: CostSettings = field(default_factory=CostSettings)
    """Closing cost periods: coverage threshold and how long a report vouches for capacity."""
    registry: RegistrySettings = field(default_factory=RegistrySettings)
    """The model registry: object store, hub, token (FLEET_S3_*, FLEET_HUB_URL, FLEET_HF_TOKEN)."""


@dataclass
class ApiserverResources:
    pool: AsyncConnectionPool | None
    inventory: InventoryStore
    auth: AuthService
    """Credentials and the audit trail (in memory without a database)."""
    registry: RegistryService | None = None
    """The model registry and its pulls (needs the database)."""


@contextlib.asynccontextmanager
async def open_resources(settings: ApiserverSettings) -> AsyncIterator[ApiserverResources]:
    """ConfigError when it cannot start: no database, or no admin credential."""
    if settings.database_url is None:
        auth = AuthService.on_pool(None)
        await auth.start(settings.admin_token)
        yield ApiserverResources(None, MemoryInventory(), auth)
        return
    async with open_pool(settings.database_url) as pool:
        auth = AuthService.on_pool(pool)
        await auth.start(settings.admin_token)
        inventory = PostgresInventory(pool)
        async with RegistryService.running(pool, inventory, settings.registry) as registry:
            yield ApiserverResources(pool, inventory, auth, registry)


class _Health:
    def __init__(self, pool: AsyncConnectionPool | None) -> None:
        self.pool = pool

    async def healthz(self, request: Request) -> Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        database = "not configured"
        if self.pool is not None:
            try:
                async with self.pool.connection(timeout=2) as conn:
                    await conn.execute("SELECT 1")
                database = "ok"
            except Exception as exc:  # any failure means not ready; the reason is shown
                return web.json_response(
                    {"status": "database unavailable", "reason": type(exc).__name__}, 503
                )
        return web.json_response({"status": "ready", "database": database})


async def _database_required(request: Request) -> Response:
    raise Unavailable(
        f"{request.url.path} needs a database: set FLEET_DATABASE_URL and restart the "
        "control plane",
        code="database_required",
    )


async def _not_found(request: Request) -> Response:
    raise NotFound(f"no route for {request.method} {shown(request.url.path)}")


def _routes(resources: ApiserverResources, costs: CostSettings) -> list[BaseRoute]:
    health = _Health(resources.pool)
    routes: list[BaseRoute] = [
        Route("/healthz", health.healthz, methods=["GET"]),
        Route("/readyz", health.readyz, methods=["GET"]),
        *inventory_routes(resources.inventory, max_gap_s=costs.max_sample_gap_s),
        *auth_routes(resources.auth),
    ]
    if resources.pool is not None:
        pool = resources.pool
        routes += tenants_routes(pool) + keys_routes(pool) + budget_routes(pool)
        routes += usage_routes(pool) + rates_routes(pool)
        routes += cost_routes(pool, costs)
    if resources.registry is not None:
        routes += registry_routes(resources.registry)
    routes.append(_openapi_route(routes))
    routes = guard.protect(routes, POLICY, resources.auth)
    if resources.pool is None:
        for name in DATABASE_COLLECTIONS:
            for path in (f"/api/v1/{name}", f"/api/v1/{name}/{{rest:path}}"):
                methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
                stand_in = Route(path, _database_required, methods=methods)
                routes.append(guard.guard(stand_in, ANY_CREDENTIAL, resources.auth))
    return routes


def _openapi_route(served: list[BaseRoute]) -> Route:
    """The document describes what is served; the 503 stand-ins for a missing database are not."""
    body = msgspec.json.encode(openapi.build_document(served))

    async def document(request: Request) -> Response:
        return Response(body, media_type="application/json")

    return Route(operations.OPENAPI_PATH, document, methods=["GET"])


def create_apiserver_app(settings: ApiserverSettings, resources: ApiserverResources) -> Starlette:
    routes = _routes(resources, settings.costs)
    app = Starlette(
        routes=routes,
        middleware=[
            *web.middleware(access_log=settings.log.access, cors_origins=settings.cors_origins),
            Middleware(web.TrailingSlashMiddleware),
        ],
        exception_handlers=web.exception_handlers(),
    )
    app.state.resources = resources
    return app
