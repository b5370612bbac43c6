"""Cost rates and closed months page by cursor: every row once, the "always" rate
(``effective_from`` -infinity) included, and the report summaries in month order."""

from __future__ import annotations

from typing import Any

import httpx

from .conftest import ADMIN
from .test_periods import RATE, close, seed


async def _every(http: httpx.AsyncClient, path: str) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    params: dict[str, str] = {"limit": "1"}
    while True:
        page = (await http.get(path, params=params)).json()
        assert len(page["data"]) <= 1
        seen.extend(page["data"])
        if "next" not in page:
            return seen
        params = {"limit": "1", "after": page["next"]}


async def test_rates_and_months_page_one_row_at_a_time(
    control_plane_url: str, postgres_url: str
) -> None:
    await seed(control_plane_url, postgres_url)  # the k3s-dev rate that holds "always"
    async with httpx.AsyncClient(base_url=control_plane_url, headers=ADMIN) as http:
        for cluster, start in (("k3s-dev", "2026-09-15T00:00:00Z"), ("a-first", None)):
            body = {**RATE, "cluster": cluster, **({"effectiveFrom": start} if start else {})}
            assert (await http.post("/api/v1/cost-rates", json=body)).status_code == 201
        rates = await _every(http, "/api/v1/cost-rates")
        assert [(r["cluster"], r["effectiveFrom"]) for r in rates] == [
            ("a-first", None),
            ("k3s-dev", None),
            ("k3s-dev", "2026-09-15T00:00:00Z"),
        ]
        for month in ("2026-09", "2026-10"):
            assert (await close(control_plane_url, month, minCoverage="0")).status_code == 200
        months = await _every(http, "/api/v1/cost-periods")
        assert [m["period"] for m in months] == ["2026-09", "2026-10"]
