"""``GET /api/v1/requests`` in database mode, by who asks: a tenant's key reads its own tenant's
recent requests with no engine pod URL in them; control-plane credentials without the metrics
or admin role are known, so 403 (they used to get 401); the metrics credential reads all."""

from __future__ import annotations

import httpx

from fleet_testing.fix_auth import bearer
from fleet_testing.waiting import eventually

from .conftest import CHANGE_DEADLINE_S, MODEL, MSG, Fleet, FleetFactory


async def _served(fleet: Fleet, key: str) -> bool:
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{fleet.gateway.url}/v1/chat/completions",
            headers=bearer(key),
            json={"model": MODEL, "messages": MSG, "max_tokens": 8},
        )
    return response.status_code == 200


async def test_recent_requests_show_a_tenant_its_own_without_engine_addresses(
    start_fleet: FleetFactory,
) -> None:
    fleet = await start_fleet()
    issued = await fleet.issue_key()
    await eventually(lambda: _served(fleet, issued["secret"]), within=CHANGE_DEADLINE_S)
    made = {"role": "metrics", "label": "m"}
    scrape = (await fleet.api.post("/api/v1/credentials", json=made)).json()["secret"]
    async with httpx.AsyncClient(base_url=fleet.gateway.url) as http:
        own = (await http.get("/api/v1/requests", headers=bearer(issued["secret"]))).json()
        assert own["data"]
        assert all(r["endpoint"] is None and r["tenant"] == "acme" for r in own["data"])
        everyone = (await http.get("/api/v1/requests", headers=bearer(scrape))).json()
        assert all(r["endpoint"] for r in everyone["data"])
        for role, fields in (("finance", {}), ("operator", {"clusterId": "c1"})):
            made = {"role": role, "label": role, **fields}
            secret = (await fleet.api.post("/api/v1/credentials", json=made)).json()["secret"]
            refused = await http.get("/api/v1/requests", headers=bearer(secret))
            assert refused.status_code == 403, (role, refused.text)
            assert refused.json()["error"]["code"] == "insufficient_role"
        assert (await http.get("/api/v1/requests", headers=bearer("nobody"))).status_code == 401
