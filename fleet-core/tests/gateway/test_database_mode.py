"""The gateway in database mode: keys, limits, budget rules and rates from the control plane's
Postgres, and one ledger row per served or refused request.

Everything is real: a fresh Postgres database, the control plane and the gateway served over
loopback, a stub engine, the official SDK as the client. Changes are made through the control
plane's API and must reach the gateway without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import psycopg
import pytest

from fleet_core.gateway.admission.directory import BudgetRule
from fleet_core.gateway.settings import DatabaseModeSettings, from_env
from fleet_core.shared.errors import ConfigError
from fleet_testing import servers
from fleet_testing.fix_auth import bearer
from fleet_testing.fix_proxy import ProxyFactory

from .conftest import GatewayFactory, Served, StubFactory, running_control_plane

MODEL = "m1"
MSG = [{"role": "user", "content": "hello there"}]
CHANGE_DEADLINE_S = 2.0


@dataclass
class Fleet:
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
        deadline = time.monotonic() + timeout_s
        while True:
            rows = await self.ledger(
                "SELECT request_id, tenant, project, key_id, model, endpoint, status, outcome,"
                " prompt_tokens, completion_tokens, units FROM ledger ORDER BY received_at"
            )
            if len(rows) >= count or time.monotonic() > deadline:
                return rows
            await asyncio.sleep(0.05)


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


async def until(check: Callable[[], Awaitable[bool]], *, within_s: float) -> float:
    """Seconds until ``check()`` held; fails past ``within_s``."""
    started = time.monotonic()
    while not await check():
        elapsed = time.monotonic() - started
        assert elapsed < within_s, f"not true within {within_s}s"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def status_with(fleet: Fleet, key: str, **extra: Any) -> int:
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{fleet.gateway.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"model": MODEL, "messages": MSG, "max_tokens": 8, **extra},
        )
    return response.status_code


async def test_a_key_issued_by_the_control_plane_is_served_and_billed(
    start_fleet: FleetFactory,
) -> None:
    fleet = await start_fleet()
    await fleet.call(
        {
            "_method": "PUT",
            "_path": f"/api/v1/model-rates/{MODEL}",
            "inputFresh": 1000,
            "inputCached": 100,
            "output": 4000,
        },
        status=201,
    )
    issued = await fleet.issue_key()
    client = fleet.sdk(issued["secret"])
    # The new key and rates reach the gateway by notification, without a restart.
    await until(lambda: _served(fleet, issued["secret"]), within_s=CHANGE_DEADLINE_S)
    reply = await client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=8)  # type: ignore[arg-type]
    assert reply.usage is not None

    rows = await fleet.ledger_rows(2)
    assert len(rows) == 2  # the probe and the SDK call, one row each
    _, tenant, project, key_id, model, endpoint, status, outcome, prompt, completion, units = rows[
        -1
    ]
    assert (tenant, project, key_id, model, status, outcome) == (
        "acme",
        "research",
        issued["id"],
        MODEL,
        200,
        "ok",
    )
    assert endpoint is not None
    assert endpoint.startswith("http://127.0.0.1:")
    assert (prompt, completion) == (reply.usage.prompt_tokens, reply.usage.completion_tokens)
    assert units == prompt * 1000 + completion * 4000  # micro-units: tokens × units per 1M

    async def last_used() -> bool:
        keys = await fleet.call({"_method": "GET", "_path": "/api/v1/keys"}, status=200)
        (key,) = keys["data"]
        assert "secret" not in key
        return key["lastUsedAt"] is not None

    await until(last_used, within_s=CHANGE_DEADLINE_S)

    with pytest.raises(openai.AuthenticationError):
        await fleet.sdk("fk_not-a-key").chat.completions.create(model=MODEL, messages=MSG)  # type: ignore[arg-type]


async def _served(fleet: Fleet, key: str) -> bool:
    return await status_with(fleet, key) == 200


async def test_a_revoked_key_is_refused_within_two_seconds(start_fleet: FleetFactory) -> None:
    fleet = await start_fleet()
    issued = await fleet.issue_key()
    await until(lambda: _served(fleet, issued["secret"]), within_s=CHANGE_DEADLINE_S)
    await fleet.call({"_method": "DELETE", "_path": f"/api/v1/keys/{issued['id']}"}, status=200)

    async def refused() -> bool:
        return await status_with(fleet, issued["secret"]) == 401

    elapsed = await until(refused, within_s=CHANGE_DEADLINE_S)
    assert elapsed < CHANGE_DEADLINE_S


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/api/v1/projects/acme%2Fresearch", "project_inactive"),
        ("/api/v1/tenants/acme", "tenant_inactive"),
    ],
)
async def test_an_inactive_tenant_or_project_is_refused_with_403_and_recorded(
    start_fleet: FleetFactory, path: str, code: str
) -> None:
    fleet = await start_fleet()
    issued = await fleet.issue_key()
    await until(lambda: _served(fleet, issued["secret"]), within_s=CHANGE_DEADLINE_S)
    await fleet.call({"_method": "PATCH", "_path": path, "active": False}, status=200)

    client = fleet.sdk(issued["secret"])

    async def forbidden() -> bool:
        try:
            await client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=8)  # type: ignore[arg-type]
        except openai.PermissionDeniedError as exc:
            codes.append(exc.code)
            return True
        return False

    codes: list[str | None] = []
    await until(forbidden, within_s=CHANGE_DEADLINE_S)
    assert codes == [code]
    rows = await fleet.ledger_rows(3)
    refused = [r for r in rows if r[7] == "refused"]
    assert refused, rows
    assert all(r[6] == 403 and r[8] == 0 and r[9] == 0 for r in refused)  # nothing billed
    usage = await fleet.call({"_method": "GET", "_path": "/api/v1/usage?groupBy=model"}, status=200)
    served = [r for r in rows if r[7] == "ok"]
    assert usage["data"][0]["requests"] == len(served)  # refusals are not usage


async def test_a_budget_rule_refuses_with_the_rule_and_when_it_frees(
    start_fleet: FleetFactory,
) -> None:
    fleet = await start_fleet()
    issued = await fleet.issue_key()
    rule = await fleet.call(
        {
            "_path": "/api/v1/budget-rules",
            "scopeKind": "project",
            "scopeId": fleet.project,
            "dimension": "tokens_total",
            "limit": 120,
            "window": "1h",
        },
        status=201,
    )
    client = fleet.sdk(issued["secret"])
    await until(lambda: _served(fleet, issued["secret"]), within_s=CHANGE_DEADLINE_S)
    refusal = None
    for _ in range(40):
        try:
            await client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=8)  # type: ignore[arg-type]
        except openai.RateLimitError as exc:
            refusal = exc
            break
    assert refusal is not None, "the budget never refused"
    assert refusal.code == "budget_exceeded"
    assert rule["id"] in refusal.message
    assert "frees enough in" in refusal.message  # the rollups hold the usage: a time is known
    assert int(refusal.response.headers["retry-after"]) > 3000  # about an hour away

    rows = await fleet.ledger_rows(1)
    billed = sum(r[8] + r[9] for r in rows if r[7] == "ok")
    assert billed <= 120  # the rule held: served tokens never went past the limit

    # A request that could never fit is a 400, not a 429 to retry forever.
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=500)  # type: ignore[arg-type]


async def test_concurrent_requests_cannot_overdraw_a_budget(start_fleet: FleetFactory) -> None:
    """Held reservations are counted at once: a burst cannot all pass one check."""
    fleet = await start_fleet(latency_ms=300)
    issued = await fleet.issue_key()
    await until(lambda: _served(fleet, issued["secret"]), within_s=CHANGE_DEADLINE_S)
    await fleet.call(
        {
            "_path": "/api/v1/budget-rules",
            "scopeKind": "tenant",
            "scopeId": "acme",
            "dimension": "tokens_output",
            "limit": 50,
            "window": "1d",
        },
        status=201,
    )
    await asyncio.sleep(1.0)  # the rule reaches the gateway (notification) and a refresh runs

    statuses = await asyncio.gather(
        *(status_with(fleet, issued["secret"], max_tokens=10) for _ in range(20))
    )
    # 50 output tokens, 10 reserved each, and the earlier probe used a few: at most 5 fit at once.
    assert statuses.count(200) <= 5
    assert statuses.count(200) >= 1
    assert set(statuses) <= {200, 429}


async def test_the_ledger_loses_nothing_when_the_database_drops_mid_load(
    start_fleet: FleetFactory, postgres_url: str, tcp_proxy: ProxyFactory
) -> None:
    target = servers.address_of(postgres_url)
    proxy = tcp_proxy(target.host, target.port)
    fleet = await start_fleet(gateway_db_url=proxy.url_for(postgres_url))
    issued = await fleet.issue_key()
    await until(lambda: _served(fleet, issued["secret"]), within_s=CHANGE_DEADLINE_S)
    served = 1
    for n in range(60):
        if n == 20:
            proxy.cut()  # the gateway's every database connection is reset
        if n == 45:
            proxy.resume()
        assert await status_with(fleet, issued["secret"]) == 200  # the cached catalog serves
        served += 1
    rows = await fleet.ledger_rows(served, timeout_s=30)
    ids = [r[0] for r in rows]
    assert len(ids) == served
    assert len(set(ids)) == served


async def test_usage_agreement_compares_engine_and_gateway_counts(
    start_fleet: FleetFactory,
) -> None:
    fleet = await start_fleet()
    issued = await fleet.issue_key()
    await until(lambda: _served(fleet, issued["secret"]), within_s=CHANGE_DEADLINE_S)
    for _ in range(4):
        assert await status_with(fleet, issued["secret"]) == 200
    await fleet.ledger_rows(5)
    found = await fleet.call({"_method": "GET", "_path": "/api/v1/usage-agreement"}, status=200)
    (row,) = found["data"]
    assert row["model"] == MODEL
    assert row["requests"] == 5
    assert row["compared"] == 5  # the stub engine reports usage on every non-stream reply
    assert row["withoutEngineUsage"] == 0
    assert row["countMethods"]
    assert row["prompt"]["p95AbsRelativeDiff"] >= 0


async def test_model_rates_api(start_fleet: FleetFactory) -> None:
    fleet = await start_fleet()
    path = "/api/v1/model-rates/Qwen/Qwen2.5-7B-Instruct"
    body = {"inputFresh": 150, "inputCached": 15, "output": 600}
    created = await fleet.call({"_method": "PUT", "_path": path, **body}, status=201)
    assert created["model"] == "Qwen/Qwen2.5-7B-Instruct"
    updated = await fleet.call({"_method": "PUT", "_path": path, **body, "output": 700}, status=200)
    assert updated["output"] == 700
    listed = await fleet.call({"_method": "GET", "_path": "/api/v1/model-rates"}, status=200)
    assert [r["model"] for r in listed["data"]] == ["Qwen/Qwen2.5-7B-Instruct"]
    bad = await fleet.call({"_method": "PUT", "_path": path, **body, "output": -1}, status=400)
    assert "output" in bad["error"]["message"]
    # Rates are exact to a thousandth of a unit per million tokens, and kept as integers.
    exact = await fleet.call(
        {"_method": "PUT", "_path": path, **body, "output": 0.001, "inputFresh": 123456.789},
        status=200,
    )
    assert (exact["output"], exact["inputFresh"]) == (0.001, 123456.789)
    finer = await fleet.call(
        {"_method": "PUT", "_path": path, **body, "output": 0.0005}, status=400
    )
    assert finer["error"]["param"] == "output"
    for junk in ("NaN", "Infinity", 1e13):
        await fleet.call({"_method": "PUT", "_path": path, **body, "output": junk}, status=400)
    await fleet.call({"_method": "DELETE", "_path": path}, status=200)
    await fleet.call({"_method": "GET", "_path": path}, status=404)


@pytest.mark.parametrize("variable", ["FLEET_API_KEYS", "FLEET_RATE_TENANTS"])
def test_database_mode_refuses_environment_keys_and_limits(variable: str) -> None:
    from fleet_core.gateway.config import GatewayConfig

    env = {"FLEET_DATABASE_URL": "postgresql://x@127.0.0.1/fleet", variable: "acme/a/b"}
    with pytest.raises(ConfigError) as info:
        from_env(env, GatewayConfig())
    assert variable in str(info.value)
    assert "\n" not in str(info.value)


def test_the_ledger_flush_interval_is_bounded_by_what_a_crash_may_lose() -> None:
    from fleet_core.gateway.config import GatewayConfig

    base = {"FLEET_DATABASE_URL": "postgresql://x@127.0.0.1/fleet"}
    for given, expected in (({}, 0.2), ({"FLEET_LEDGER_FLUSH_S": "6"}, 6.0)):
        database = from_env({**base, **given}, GatewayConfig()).database
        assert database is not None
        assert database.ledger_flush_s == expected
    for bad in ("0", "-1", "10.5", "soon", "nan"):
        with pytest.raises(ConfigError) as info:
            from_env({**base, "FLEET_LEDGER_FLUSH_S": bad}, GatewayConfig())
        assert "FLEET_LEDGER_FLUSH_S" in str(info.value)
        assert "\n" not in str(info.value)


async def test_metrics_are_for_a_metrics_credential_of_the_control_plane(
    start_fleet: FleetFactory,
) -> None:
    """In database mode the gateway checks /metrics against the control plane's credentials:
    a ``metrics`` one (or an admin's) reads it; a tenant's key is 403; none is 401."""
    fleet = await start_fleet()
    key = (await fleet.issue_key())["secret"]
    created = await fleet.api.post("/api/v1/credentials", json={"role": "metrics", "label": "p"})
    scrape = created.json()["secret"]
    finance = await fleet.api.post("/api/v1/credentials", json={"role": "finance", "label": "f"})
    async with httpx.AsyncClient(base_url=fleet.gateway.url) as http:
        assert (await http.get("/metrics")).status_code == 401
        assert (await http.get("/metrics", headers=bearer(key))).status_code == 403
        other = bearer(finance.json()["secret"])
        assert (await http.get("/metrics", headers=other)).status_code == 403
        assert (await http.get("/metrics", headers=bearer(scrape))).status_code == 200
        admin = {"Authorization": fleet.api.headers["Authorization"]}
        assert (await http.get("/metrics", headers=admin)).status_code == 200
        assert set((await http.get("/health", headers=bearer(key))).json()) == {"status"}
        detail = (await http.get("/health", headers=bearer(scrape))).json()
        assert detail["upstreams"][MODEL]["endpoints"]
        credential_id = created.json()["id"]
        await fleet.api.delete(f"/api/v1/credentials/{credential_id}")
        assert (await http.get("/metrics", headers=bearer(scrape))).status_code == 401


async def test_the_ledger_key_is_the_gateways_not_the_clients(start_fleet: FleetFactory) -> None:
    """Regression (issue 13, item 1): X-Request-Id was the ledger's key. Six requests with one
    id left one row; another tenant reusing it was never billed; and the budget book, keyed by
    it, overwrote its entries without subtracting them, so its sum leaked for good."""
    fleet = await start_fleet()
    await fleet.call({"_path": "/api/v1/tenants", "id": "globex", "name": "G"}, status=201)
    await fleet.call(
        {"_path": "/api/v1/projects", "tenantId": "globex", "name": "main"}, status=201
    )
    rule = await fleet.call(
        {
            "_path": "/api/v1/budget-rules",
            "scopeKind": "tenant",
            "scopeId": "acme",
            "dimension": "tokens_total",
            "limit": 1_000_000,
            "window": "1d",
        },
        status=201,
    )
    acme, globex = await fleet.issue_key(), await fleet.issue_key("globex/main")
    for key in (acme, globex):
        await until(lambda k=key: _served(fleet, k["secret"]), within_s=CHANGE_DEADLINE_S)
    echoed = set()
    async with httpx.AsyncClient() as http:
        for key in [acme] * 6 + [globex]:
            response = await http.post(
                f"{fleet.gateway.url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {key['secret']}", "X-Request-Id": "dup-1"},
                json={"model": MODEL, "messages": MSG, "max_tokens": 8},
            )
            assert response.status_code == 200
            echoed.add(response.headers["x-request-id"])
    assert echoed == {"dup-1"}
    await fleet.ledger_rows(9)
    rows = await fleet.ledger(
        "SELECT request_id, tenant, prompt_tokens + completion_tokens FROM ledger"
        " WHERE client_request_id = 'dup-1'"
    )
    assert len(rows) == 7
    assert len({r[0] for r in rows}) == 7  # seven keys, all minted here
    assert all(r[0].startswith("req_") for r in rows)
    assert [r[1] for r in rows].count("globex") == 1  # billed to its own tenant
    budgets = fleet.gateway.app.state.admission.budgets
    acme_rule = BudgetRule(rule["id"], "tenant", "acme", "tokens_total", 1_000_000, 86_400)

    async def rolled_up() -> bool:  # every settled record has reached the rollups: none left
        return bool(budgets.unrolled(acme_rule) == 0)

    await until(rolled_up, within_s=5.0)


async def test_a_tenants_priority_reaches_the_gateways_fair_queue(
    start_fleet: FleetFactory,
) -> None:
    """Migration 0014: ``priority`` is a tenant field the control plane validates and the
    gateway's catalog carries to its fair queue (the tenant's weight when slots are full)."""
    fleet = await start_fleet()
    tenant = await fleet.call({"_method": "GET", "_path": "/api/v1/tenants/acme"}, status=200)
    assert tenant["priority"] == 1
    refused = await fleet.call(
        {"_method": "PATCH", "_path": "/api/v1/tenants/acme", "priority": 0}, status=400
    )
    assert refused["error"]["param"] == "priority"
    patched = await fleet.call(
        {"_method": "PATCH", "_path": "/api/v1/tenants/acme", "priority": 7}, status=200
    )
    assert patched["priority"] == 7
    directory = fleet.gateway.app.state.database.directory

    async def seen() -> bool:
        acme = directory.catalog.tenants.get("acme")  # the catalog may not have it yet
        return acme is not None and acme.priority == 7

    await until(seen, within_s=CHANGE_DEADLINE_S)
