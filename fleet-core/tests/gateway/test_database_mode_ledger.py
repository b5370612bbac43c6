"""The ledger in database mode: one row per request under a key the gateway mints, none lost
when the database drops mid-load, the engine's and the gateway's counts compared, and the model
rates that price the rows.

Everything is real: a fresh Postgres database, the control plane and the gateway served over
loopback, a stub engine, the official SDK as the client (`conftest.start_fleet`).
"""

from __future__ import annotations

import httpx

from fleet_core.gateway.admission.directory import BudgetRule
from fleet_testing import servers
from fleet_testing.fix_proxy import ProxyFactory
from fleet_testing.waiting import eventually

from .conftest import CHANGE_DEADLINE_S, MODEL, MSG, FleetFactory, key_served, status_with


async def test_the_ledger_loses_nothing_when_the_database_drops_mid_load(
    start_fleet: FleetFactory, postgres_url: str, tcp_proxy: ProxyFactory
) -> None:
    target = servers.address_of(postgres_url)
    proxy = tcp_proxy(target.host, target.port)
    fleet = await start_fleet(gateway_db_url=proxy.url_for(postgres_url))
    issued = await fleet.issue_key()
    await eventually(lambda: key_served(fleet, issued["secret"]), within=CHANGE_DEADLINE_S)
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
    await eventually(lambda: key_served(fleet, issued["secret"]), within=CHANGE_DEADLINE_S)
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


async def test_the_ledger_key_is_the_gateways_not_the_clients(start_fleet: FleetFactory) -> None:
    """The client's X-Request-Id was once the ledger's key: six requests with one id left one row;
    another tenant reusing it was never billed; and the budget book, keyed by it, overwrote its
    entries without subtracting them, so its sum leaked for good."""
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
        await eventually(lambda k=key: key_served(fleet, k["secret"]), within=CHANGE_DEADLINE_S)
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

    await eventually(rolled_up, within=5.0)
