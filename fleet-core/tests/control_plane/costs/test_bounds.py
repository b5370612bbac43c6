"""A month whose pool no client could read exactly (past 2^53 - 1 micro-units) is a 400 naming
the cost rates, and nothing is stored; it used to be stored and returned as a 200."""

from __future__ import annotations

import httpx

from .conftest import ADMIN, heartbeats, inventory, put_inventory
from .test_periods import RATE, SEP, close, seed


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


async def test_the_largest_gpu_count_a_report_may_carry_closes_without_overflow(
    control_plane_url: str, postgres_url: str
) -> None:
    """2^31 - 1 GPUs for a month is 5.8e21 GPU-µs, past bigint: it used to be a 500."""
    most = 2**31 - 1
    await put_inventory(control_plane_url, inventory("huge", at=SEP[0], gpus=most))
    await heartbeats(postgres_url, "huge", start=SEP[0], end=SEP[1], gpus=most)
    forced = await close(control_plane_url, "2026-09", minCoverage="0")
    assert forced.status_code == 400, forced.text
    assert forced.json()["error"]["code"] == "cost_rate_missing"
    async with httpx.AsyncClient(headers=ADMIN) as http:
        rate = {"cluster": "huge", "gpuHourMicro": 1, "currency": "USD"}
        assert (
            await http.post(f"{control_plane_url}/api/v1/cost-rates", json=rate)
        ).status_code == 201
    priced = await close(control_plane_url, "2026-09", minCoverage="0")
    assert priced.status_code == 200, priced.text
    report = priced.json()
    assert report["pool"] == most * 720  # one micro-unit per GPU-hour, 720 hours
