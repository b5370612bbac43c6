"""Fixtures for gateway tests: stub engines and gateways served for real over loopback, and
database mode as a whole (`start_fleet`: the control plane, a stub engine and a gateway on one
fresh database)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import openai
import psycopg
import pytest
from starlette.applications import Starlette

from fleet_core.control_plane.app import ApiserverSettings
from fleet_core.devtools.stub_engine import StubSettings, create_app
from fleet_core.gateway.app import create_gateway_app, open_resources
from fleet_core.gateway.config import GatewayConfig, validate
from fleet_core.gateway.settings import (
    DatabaseModeSettings,
    GatewaySettings,
    LogSettings,
    admission_from_env,
)
from fleet_core.shared.asgi_server import Server
from fleet_testing.asgi import control_plane_app, serving
from fleet_testing.fix_auth import bearer
from fleet_testing.fix_fault_engine import FaultEngine, FaultEngineFactory
from fleet_testing.waiting import eventually

from .money import Books

TPM = 6000
"""The anonymous tenant's tokens per minute in a `Rig`: 100 a second of refill."""
READ_TIMEOUT_S = 1.0
MSG = [{"role": "user", "content": "hello there"}]


@dataclass
class Served:
    url: str
    app: Starlette
    stack: contextlib.AsyncExitStack | None = None

    def stats(self) -> Any:
        return self.app.state.stats

    def client(self) -> openai.AsyncOpenAI:
        """An SDK client for this server, closed with the test however the test ends."""
        assert self.stack is not None
        client = openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)
        self.stack.push_async_callback(client.close)
        return client


StubFactory = Callable[..., Awaitable[Served]]
GatewayFactory = Callable[..., Awaitable[Served]]


@pytest.fixture
async def stack() -> AsyncIterator[contextlib.AsyncExitStack]:
    async with contextlib.AsyncExitStack() as stack:
        yield stack


@pytest.fixture
def start_stub(stack: contextlib.AsyncExitStack) -> StubFactory:
    async def start(**fields: Any) -> Served:
        app = create_app(StubSettings(**fields))
        url = await stack.enter_async_context(serving(app))
        return Served(url, app)

    return start


@pytest.fixture
def serve_app(stack: contextlib.AsyncExitStack) -> Callable[[Any], Awaitable[str]]:
    async def serve(app: Any) -> str:
        return await stack.enter_async_context(serving(app))

    return serve


@pytest.fixture
def start_gateway(stack: contextlib.AsyncExitStack) -> GatewayFactory:
    """``await start_gateway(config, server=..., **settings)``: a gateway served for real,
    on uvicorn (the default, as shipped) unless ``server`` says hypercorn."""

    async def start(
        config: dict[str, Any], *, server: Server = "uvicorn", **settings: Any
    ) -> Served:
        parsed = msgspec.convert(config, GatewayConfig)
        validate(parsed)
        full = GatewaySettings(config=parsed, log=LogSettings(access=False), **settings)
        resources = await stack.enter_async_context(open_resources(full))
        app = create_gateway_app(full, resources)
        url = await stack.enter_async_context(serving(app, server=server))
        return Served(url, app, stack)

    return start


@dataclass
class Rig:
    gw: Served
    engine: FaultEngine
    spare: FaultEngine
    books: Books
    headers: dict[str, str] = field(default_factory=dict)
    """The client's (its key, in database mode)."""

    async def send(
        self, *, stream: bool = False, path: str = "/v1/chat/completions", **body: Any
    ) -> httpx.Response:
        """One request (chat by default; a None in ``body`` drops that field)."""
        payload = {"model": "m", "messages": MSG, "max_tokens": 1000, "stream": stream, **body}
        payload = {name: value for name, value in payload.items() if value is not None}
        async with httpx.AsyncClient(timeout=30, headers=self.headers) as http:
            response = await http.post(f"{self.gw.url}{path}", json=payload)
        self.books.statuses.append(response.status_code)
        return response


RigFactory = Callable[..., Awaitable[Rig]]


@pytest.fixture
def start_rig(
    start_gateway: GatewayFactory,
    fault_engine: FaultEngineFactory,
    redis_url: str,
    redis_prefix: str,
    admin_token: str,
) -> RigFactory:
    """``await start_rig(**upstream)``: a gateway on Redis (anonymous tpm=`TPM`) whose model
    ``m`` is a `FaultEngine` (``upstream`` adds to its config), with another as its fallback.

    With ``database`` (and the ``key`` of tenant ``acme``, see `issue_tenant_key`) the gateway
    runs in database mode, and the books include the ledger."""

    async def start(
        env: dict[str, str] | None = None,
        *,
        database: DatabaseModeSettings | None = None,
        key: str | None = None,
        eject_after: int = 2,
        read_timeout_s: float = READ_TIMEOUT_S,
        **upstream: Any,
    ) -> Rig:
        engine = await fault_engine()
        spare = await fault_engine()
        full = {"FLEET_RATE_TPM": str(TPM), "FLEET_REDIS_URL": redis_url, **(env or {})}
        admission = admission_from_env({**full, "FLEET_REDIS_PREFIX": redis_prefix})
        first = {"id": "m", "model": "m", "base_url": engine.url, "fallbacks": ["s"], **upstream}
        config = {
            "read_timeout_s": read_timeout_s,
            "queue_timeout_s": 0.2,
            "health": {"interval_s": 60, "eject_after": eject_after},
            "upstreams": [first, {"id": "s", "model": "s", "base_url": spare.url}],
        }
        gw = await start_gateway(config, admission=admission, database=database)
        tenant = "anonymous" if database is None else "acme"
        bucket = f"{redis_prefix}fleet:rl:{{{tenant}}}:tenant:tpm"
        books = Books(gw.url, redis_url, bucket, TPM, ledger_url=database and database.url)
        if database is not None:  # the operator reads /metrics and every record
            books.headers = bearer(admin_token)
        return Rig(gw, engine, spare, books, bearer(key) if key else {})

    return start


@contextlib.asynccontextmanager
async def running_control_plane(
    postgres_url: str, admin_token: str
) -> AsyncIterator[httpx.AsyncClient]:
    """The control plane on ``postgres_url``, in process; its API client, as the admin."""
    settings = ApiserverSettings(
        database_url=postgres_url, log=LogSettings(access=False), admin_token=admin_token
    )
    async with (
        control_plane_app(settings) as url,
        httpx.AsyncClient(base_url=url, headers=bearer(admin_token)) as api,
    ):
        yield api


@pytest.fixture
async def control_plane(postgres_url: str, admin_token: str) -> AsyncIterator[httpx.AsyncClient]:
    """The control plane on a fresh database, in process; its API client, as the admin."""
    async with running_control_plane(postgres_url, admin_token) as api:
        yield api


async def issue_tenant_key(api: httpx.AsyncClient, *, tpm: int) -> str:
    """Tenant ``acme`` (tokens per minute ``tpm``), project ``acme/research``, and a key for it."""
    for path, body in (
        ("/api/v1/tenants", {"id": "acme", "name": "Acme", "tokenLimit": tpm}),
        ("/api/v1/projects", {"tenantId": "acme", "name": "research"}),
        ("/api/v1/keys", {"projectId": "acme/research", "label": "t"}),
    ):
        response = await api.post(path, json=body)
        assert response.status_code == 201, response.text
    return str(response.json()["secret"])


MODEL = "m1"
"""The model a `Fleet`'s stub engine serves."""
CHANGE_DEADLINE_S = 2.0
"""How soon a change made through the control plane's API must reach a `Fleet`'s gateway."""


@dataclass
class Fleet:
    """The control plane's API client (as the admin), a gateway in database mode serving
    `MODEL`, and their database, with tenant ``acme`` and its project ``acme/research``."""

    api: httpx.AsyncClient
    gateway: Served
    database_url: str
    tenant: str = "acme"
    project: str = "acme/research"

    def sdk(self, key: str) -> openai.AsyncOpenAI:
        client = openai.AsyncOpenAI(base_url=f"{self.gateway.url}/v1", api_key=key, max_retries=0)
        assert self.gateway.stack is not None
        self.gateway.stack.push_async_callback(client.close)
        return client

    async def call(self, body: dict[str, Any], *, status: int) -> dict[str, Any]:
        response = await self.api.request(body.pop("_method", "POST"), body.pop("_path"), json=body)
        assert response.status_code == status, response.text
        found: dict[str, Any] = response.json()
        return found

    async def issue_key(self, project: str | None = None) -> dict[str, Any]:
        return await self.call(
            {"_path": "/api/v1/keys", "projectId": project or self.project, "label": "t"},
            status=201,
        )

    async def ledger(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        async with await psycopg.AsyncConnection.connect(self.database_url) as conn:
            cur = await conn.execute(sql, args)
            return await cur.fetchall()

    async def ledger_rows(self, count: int, timeout_s: float = 15.0) -> list[tuple[Any, ...]]:
        """The ledger's rows once it holds ``count`` (the writer batches in the background)."""

        async def enough() -> list[tuple[Any, ...]] | None:
            rows = await self.ledger(
                "SELECT request_id, tenant, project, key_id, model, endpoint, status, outcome,"
                " prompt_tokens, completion_tokens, units FROM ledger ORDER BY received_at"
            )
            return rows if len(rows) >= count else None

        return await eventually(enough, within=timeout_s, what=f"{count} ledger rows")


FleetFactory = Callable[..., Awaitable[Fleet]]


@pytest.fixture
async def start_fleet(
    postgres_url: str,
    start_stub: StubFactory,
    start_gateway: GatewayFactory,
    tmp_path: Path,
    admin_token: str,
) -> AsyncIterator[FleetFactory]:
    """``await start_fleet(gateway_db_url=None, **stub)``: control plane, engine, gateway."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(gateway_db_url: str | None = None, **stub: Any) -> Fleet:
            control_plane = running_control_plane(postgres_url, admin_token)
            api = await stack.enter_async_context(control_plane)
            engine = await start_stub(model=MODEL, **stub)
            database = DatabaseModeSettings(
                url=gateway_db_url or postgres_url,
                spool_path=tmp_path / "spool" / "ledger.jsonl",
                catalog_poll_s=0.5,
                budget_refresh_s=0.2,
                key_usage_interval_s=0.2,
            )
            config = {"upstreams": [{"id": MODEL, "model": MODEL, "base_url": engine.url}]}
            gateway = await start_gateway(config, database=database)
            fleet = Fleet(api, gateway, postgres_url)
            await fleet.call({"_path": "/api/v1/tenants", "id": "acme", "name": "Acme"}, status=201)
            await fleet.call(
                {"_path": "/api/v1/projects", "tenantId": "acme", "name": "research"}, status=201
            )
            return fleet

        yield start


async def status_with(fleet: Fleet, key: str, **extra: Any) -> int:
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{fleet.gateway.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"model": MODEL, "messages": MSG, "max_tokens": 8, **extra},
        )
    return response.status_code


async def key_served(fleet: Fleet, key: str) -> bool:
    """Whether the gateway serves ``key`` now."""
    return await status_with(fleet, key) == 200
