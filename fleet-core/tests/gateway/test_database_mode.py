"""The gateway in database mode, as the control plane changes it: a key issued, revoked, or its
tenant or project made inactive; a metrics credential; a tenant's priority. Each change is made
through the control plane's API and must reach the gateway without a restart. Database mode also
refuses the environment's keys and limits, and bounds the ledger's flush interval.

Everything is real: a fresh Postgres database, the control plane and the gateway served over
loopback, a stub engine, the official SDK as the client (`conftest.start_fleet`).
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from fleet_core.gateway.settings import from_env
from fleet_core.shared.errors import ConfigError
from fleet_testing.fix_auth import bearer
from fleet_testing.waiting import eventually

from .conftest import (
    CHANGE_DEADLINE_S,
    MODEL,
    MSG,
    FleetFactory,
    key_served,
    status_with,
)
from .money import metric


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
    await eventually(lambda: key_served(fleet, issued["secret"]), within=CHANGE_DEADLINE_S)
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

    await eventually(last_used, within=CHANGE_DEADLINE_S)

    with pytest.raises(openai.AuthenticationError):
        await fleet.sdk("fk_not-a-key").chat.completions.create(model=MODEL, messages=MSG)  # type: ignore[arg-type]


async def test_a_revoked_key_is_refused_within_two_seconds(start_fleet: FleetFactory) -> None:
    fleet = await start_fleet()
    issued = await fleet.issue_key()
    await eventually(lambda: key_served(fleet, issued["secret"]), within=CHANGE_DEADLINE_S)
    await fleet.call({"_method": "DELETE", "_path": f"/api/v1/keys/{issued['id']}"}, status=200)

    async def refused() -> bool:
        return await status_with(fleet, issued["secret"]) == 401

    await eventually(refused, within=CHANGE_DEADLINE_S)


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/api/v1/projects/acme%2Fresearch", "project_inactive"),
        ("/api/v1/tenants/acme", "tenant_inactive"),
    ],
)
async def test_an_inactive_tenant_or_project_is_refused_with_403_and_counted(
    start_fleet: FleetFactory, path: str, code: str, admin_token: str
) -> None:
    """Refused with 403, counted on /metrics by status, and kept out of the ledger: a client
    looping on a refusal wrote a row each time (tens of thousands from one loop)."""
    fleet = await start_fleet()
    issued = await fleet.issue_key()
    await eventually(lambda: key_served(fleet, issued["secret"]), within=CHANGE_DEADLINE_S)
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
    await eventually(forbidden, within=CHANGE_DEADLINE_S)
    assert codes == [code]
    refusals = await metric(fleet.gateway.url, "fleet_requests_refused_total", bearer(admin_token))
    assert refusals >= 1
    await asyncio.sleep(0.5)  # longer than the writer's flush: a queued refusal would be in
    rows = await fleet.ledger_rows(1)
    assert all(r[7] == "ok" for r in rows), rows
    usage = await fleet.call({"_method": "GET", "_path": "/api/v1/usage?groupBy=model"}, status=200)
    served = [r for r in rows if r[7] == "ok"]
    assert usage["data"][0]["requests"] == len(served)  # refusals are not usage


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

        async def tenant_refused() -> bool:  # 401 until the new key reaches the gateway
            return (await http.get("/metrics", headers=bearer(key))).status_code == 403

        await eventually(tenant_refused, within=CHANGE_DEADLINE_S)
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

    await eventually(seen, within=CHANGE_DEADLINE_S)


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
