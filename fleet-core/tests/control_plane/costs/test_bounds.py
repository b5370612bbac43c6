"""A month whose pool no client could read exactly (past 2^53 - 1 micro-units) is a 400 naming
the cost rates, and nothing is stored; it used to be stored and returned as a 200."""

from __future__ import annotations

import httpx

from .conftest import ADMIN
from .test_periods import RATE, close, seed


async def test_a_pool_past_what_clients_read_is_400_and_nothing_is_stored(
    control_plane_url: str, postgres_url: str
) -> None:
    await seed(control_plane_url, postgres_url, rate=False)  # two GPUs for the whole month
    async with httpx.AsyncClient(headers=ADMIN) as http:
        body = {**RATE, "gpuHourMicro": 2**53 - 1}  # the largest rate the edge accepts
        assert (
            await http.post(f"{control_plane_url}/api/v1/cost-rates", json=body)
        ).status_code == 201
        response = await close(control_plane_url, "2026-09")
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "pool_out_of_range"
        assert "cost-rates" in response.json()["error"]["message"]
        assert (
            await http.get(f"{control_plane_url}/api/v1/cost-periods/2026-09")
        ).status_code == 404
