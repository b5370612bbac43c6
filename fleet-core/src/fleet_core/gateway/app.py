"""The gateway's app factory and the resources it runs on.

``open_resources`` opens everything with a lifetime (the one pooled aiohttp session to the
engines, the usage sink) in one ``async with``; ``create_gateway_app(settings, resources)`` wires
the features together and starts the background loops (health checks, discovery) in the lifespan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette

from fleet_core.gateway.admission.batching_store import BatchingStore
from fleet_core.gateway.admission.budget_book import BudgetBook
from fleet_core.gateway.admission.catalog import (
    CatalogWatcher,
    KeyUsage,
    RuleMinutes,
    load_catalog,
    read_budgets,
    refresh_budgets,
)
from fleet_core.gateway.admission.directory import (
    BudgetRule,
    CatalogDirectory,
    Directory,
    StaticDirectory,
)
from fleet_core.gateway.admission.leases import LeasedStore
from fleet_core.gateway.admission.limits import LimitStore
from fleet_core.gateway.admission.memory_store import MemoryStore
from fleet_core.gateway.admission.service import Admission, BudgetWait
from fleet_core.gateway.admission.store import open_redis_store
from fleet_core.gateway.admission.windows import free_after
from fleet_core.gateway.config import GatewayConfig
from fleet_core.gateway.console.proxying import proxy_routes
from fleet_core.gateway.console.serving import console_routes, with_shell
from fleet_core.gateway.edge.dispatch import GatewayApp
from fleet_core.gateway.edge.routes import gateway_routes
from fleet_core.gateway.edge.viewers import Viewers
from fleet_core.gateway.exchange.discovery import poll_endpoints
from fleet_core.gateway.exchange.health import HealthChecker
from fleet_core.gateway.exchange.proxy import Proxy
from fleet_core.gateway.exchange.router import Router
from fleet_core.gateway.exchange.routing.endpoints import EndpointRegistry
from fleet_core.gateway.exchange.routing.selection import Scoring
from fleet_core.gateway.exchange.service import GatewayService
from fleet_core.gateway.exchange.tokenizers import RegistryTokenizers, registry_id
from fleet_core.gateway.ledger import LedgerWriter
from fleet_core.gateway.metering.metrics import GatewayMetrics
from fleet_core.gateway.metering.records import FanOut, RingSink, UsageSink
from fleet_core.gateway.settings import DatabaseModeSettings, GatewaySettings
from fleet_core.shared import stopping, web
from fleet_core.shared.storage.db import open_pool

__all__ = ["GatewayResources", "create_gateway_app", "open_resources"]

log = logging.getLogger("fleet.gateway")
LOOPS_STOP_S = 5.0
"""How long shutdown waits for the background loops (health, catalog, budgets …) to stop."""


@dataclass
class DatabaseMode:
    """What the gateway holds in database mode: the pool, the live directory and the ledger."""

    settings: DatabaseModeSettings
    pool: AsyncConnectionPool
    directory: CatalogDirectory
    key_usage: KeyUsage
    budgets: BudgetBook
    ledger: LedgerWriter
    minutes: RuleMinutes


@dataclass
class GatewayResources:
    session: aiohttp.ClientSession
    ring: RingSink
    limits: LimitStore
    database: DatabaseMode | None = None

    @property
    def sink(self) -> UsageSink:
        return self.ring if self.database is None else FanOut(self.ring, self.database.ledger)


@contextlib.asynccontextmanager
async def open_database_mode(
    settings: DatabaseModeSettings, *, default_max_tokens: int, prefix: str = ""
) -> AsyncIterator[DatabaseMode]:
    """Open the pool (refusing to start without the database), load the first catalog and the
    budget rules' usage (so budgets hold from the first request), and start the ledger writer;
    closing flushes the ledger and the keys' last use."""
    async with open_pool(settings.url) as pool:
        async with pool.connection() as conn:
            catalog = await load_catalog(conn)
        key_usage = KeyUsage(pool, interval_s=settings.key_usage_interval_s)
        directory = CatalogDirectory(
            catalog, default_max_tokens=default_max_tokens, on_seen=key_usage.seen
        )
        budgets = BudgetBook(
            prefix=prefix,
            ttl_s=settings.budget_hold_ttl_s,
            grace_s=2 * settings.budget_refresh_s,
            ledger=True,
        )
        await read_budgets(pool, lambda used, started: budgets.refreshed(used, started_at=started))
        ledger = LedgerWriter(
            pool,
            spool_path=settings.spool_path,
            flush_interval_s=settings.ledger_flush_s,
            on_commit=lambda batch: budgets.committed([r.request_id for r in batch]),
        )
        async with ledger:
            try:
                minutes = RuleMinutes(pool, ttl_s=settings.budget_refresh_s)
                yield DatabaseMode(settings, pool, directory, key_usage, budgets, ledger, minutes)
            finally:
                await key_usage.flush()


ENGINE_KEEP_ALIVE_S = 4.0
"""How long an idle connection to an engine is kept for reuse: under the 5 s after which vLLM's
uvicorn and llama.cpp's server close an idle connection (aiohttp's default is 15 s), so the
gateway closes it first. Reusing one the engine is closing at that moment fails the request with
"server disconnected" before the engine read it, and counts against a healthy endpoint."""


@contextlib.asynccontextmanager
async def open_resources(settings: GatewaySettings) -> AsyncIterator[GatewayResources]:
    config = settings.config
    connector = aiohttp.TCPConnector(
        limit=0,
        ttl_dns_cache=300,
        enable_cleanup_closed=True,
        keepalive_timeout=ENGINE_KEEP_ALIVE_S,
    )
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=config.connect_timeout_s, sock_read=config.read_timeout_s
    )
    redis_url = settings.admission.redis_url
    limits: LimitStore = MemoryStore()
    if redis_url:
        limits = BatchingStore(await open_redis_store(redis_url))
        if settings.admission.rate_lease == "auto":
            limits = LeasedStore(limits)
    try:
        async with contextlib.AsyncExitStack() as stack:
            database = None
            if settings.database is not None:
                database = await stack.enter_async_context(
                    open_database_mode(
                        settings.database,
                        default_max_tokens=settings.admission.policy.default_max_tokens,
                        prefix=settings.admission.redis_prefix,
                    )
                )
            session = await stack.enter_async_context(
                aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)
            )
            yield GatewayResources(session, RingSink(settings.requests_ring), limits, database)
    finally:
        await limits.aclose()


def create_gateway_app(settings: GatewaySettings, resources: GatewayResources) -> GatewayApp:
    config = settings.config
    registry = EndpointRegistry(
        eject_after=config.health.eject_after,
        scoring=Scoring(config.routing.kv_threshold, config.routing.kv_penalty),
        signal_max_age=2 * config.health.interval_s,  # two scrapes missed: stale (ADR 0013)
        epsilon=config.routing.affinity_epsilon,
    )
    router = Router(config, registry, engine_key=settings.engine_key or "")
    proxy = Proxy(resources.session, registry, queue_timeout=config.queue_timeout_s)
    metrics = GatewayMetrics(
        endpoints=router.readiness,
        signals=router.signals,
        multiprocess_dir=settings.metrics_dir,
        flush_interval_s=settings.metrics_flush_s,
    )
    database = resources.database
    directory: Directory = (
        StaticDirectory(keys=settings.admission.keys, policy=settings.admission.policy)
        if database is None
        else database.directory
    )
    admission = Admission(
        directory=directory,
        budgets=database.budgets if database else None,
        budget_wait=budget_wait(database) if database else None,
        store=resources.limits,
        metrics=metrics,
        prefix=settings.admission.redis_prefix,
        on_store_error=settings.admission.on_store_error,
    )
    tokenizers = (
        RegistryTokenizers(
            resources.session, settings.control_plane_url, token=settings.control_plane_token
        )
        if settings.control_plane_url
        else None
    )

    def registry_tokenizers() -> list[str]:
        found = (registry_id(pool.tokenizer) for pool in router.current().pools.values())
        return [model_id for model_id in found if model_id]

    service = GatewayService(
        tokenizers=tokenizers,
        table=router.current,
        proxy=proxy,
        sink=resources.sink,
        admission=admission,
        metrics=metrics,
        usage_grace_s=config.usage_grace_s,
        routing=config.routing,
        priority=tenant_priority(config, database),
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
        if database is not None:
            tasks += database_tasks(database, admission)
        if tokenizers is not None:
            with contextlib.suppress(TimeoutError):  # first requests counted right if we can
                await asyncio.wait_for(tokenizers.fetch(registry_tokenizers()), timeout=5)
            tasks.append(
                asyncio.create_task(tokenizers.run(registry_tokenizers), name="tokenizers")
            )
        if settings.control_plane_url:
            tasks.append(
                asyncio.create_task(
                    poll_endpoints(
                        resources.session,
                        settings.control_plane_url,
                        router.apply_discovery,
                        interval=settings.discovery_interval_s,
                        token=settings.control_plane_token,
                    ),
                    name="discovery",
                )
            )
        try:
            yield
        finally:
            # Bounded (`stopping`): a loop whose cancellation was swallowed must not hold the
            # shutdown (hypercorn gives the whole lifespan 60 s, then fails it).
            await stopping.stop(tasks, within_s=LOOPS_STOP_S)
            # Every exchange settles in its finally; the settlements then go out before the
            # store's client closes (open_resources closes it after this lifespan ends).
            await service.drain(timeout_s=config.usage_grace_s + 5)
            await admission.drain()
            metrics.flush()  # a worker's last counts reach the shared files before it exits

    middleware = web.middleware(
        access_log=settings.log.access, cors_origins=settings.admission.cors_origins
    )
    hot, routes = gateway_routes(
        service,
        router,
        resources.ring,
        admission=admission,
        metrics=metrics,
        viewers=Viewers(
            admission,
            metrics_token=settings.admission.metrics_token,
            pool=database.pool if database else None,
        ),
        max_body=settings.max_body_bytes,
        sink_problem=(lambda: database.ledger.problem) if database else lambda: None,
    )
    routes += proxy_routes(
        resources.session, settings.console.api_url, max_body=settings.max_body_bytes
    )
    routes += console_routes(settings.console)
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers=with_shell(settings.console, web.exception_handlers()),
        lifespan=lifespan,
    )
    app.state.router = router
    app.state.admission = admission
    app.state.database = database
    app.state.metrics = metrics  # for the metrics-only listener (FLEET_METRICS_LISTEN)
    return GatewayApp(app, hot, access_log=settings.log.access)


def tenant_priority(config: GatewayConfig, database: DatabaseMode | None) -> Callable[[str], int]:
    """A tenant's fair-queue weight: its row in database mode, fleet.yaml's ``tenants`` else."""
    if database is not None:
        directory = database.directory

        def from_catalog(tenant: str) -> int:
            scope = directory.catalog.tenants.get(tenant)
            return scope.priority if scope is not None else 1

        return from_catalog
    tenants = config.tenants

    def from_config(tenant: str) -> int:
        found = tenants.get(tenant)
        return found.priority if found is not None else 1

    return from_config


def budget_wait(database: DatabaseMode) -> BudgetWait:
    """How long until a refusing rule frees enough: read from its minutes (cached per rule for a
    refresh interval), only when refusing."""

    async def wait(rule: BudgetRule, excess: int) -> float | None:
        minutes = await database.minutes.get(rule)
        if minutes is None:
            return None
        return free_after(
            minutes,
            over_by=excess,
            window_s=rule.window_s,
            now=time.time(),
            unrolled=database.budgets.unrolled(rule),
        )

    return wait


def database_tasks(database: DatabaseMode, admission: Admission) -> list[asyncio.Task[None]]:
    """The loops that keep database mode current: catalog, budget usage, keys' last use."""
    pool, options = database.pool, database.settings
    watcher = CatalogWatcher(
        options.url, database.directory, poll_interval_s=options.catalog_poll_s
    )
    return [
        asyncio.create_task(watcher.run(), name="catalog"),
        asyncio.create_task(
            refresh_budgets(
                pool,
                admission.budgets_refreshed,
                interval_s=options.budget_refresh_s,
                idle=admission.keep_holds,
                wanted=database.budgets.wanted,
            ),
            name="budgets",
        ),
        asyncio.create_task(database.key_usage.run(), name="key-usage"),
    ]
