"""Closing months through the HTTP API on Postgres: figures worked by hand, refusals, corrections,
freezing, concurrency and CSV."""

from __future__ import annotations

import asyncio
import csv
import io
from typing import Any

import httpx
import psycopg
import pytest

from .conftest import ADMIN, heartbeats, inventory, ledger, put_inventory

E1, E2 = "http://10.0.0.1:8000", "http://10.0.0.2:8000"
SEP, OCT = (
    ("2026-09-01T00:00:00Z", "2026-10-01T00:00:00Z"),
    ("2026-10-01T00:00:00Z", "2026-11-01T00:00:00Z"),
)
RATE = {"cluster": "k3s-dev", "gpuHourMicro": 3_200_000, "currency": "USD"}
# September: e1 serves acme/research 00:00–01:00 and globex/main 00:30–01:30 (sharing
# 00:30–01:00); e2 serves acme/batch 02:00–02:30. Each replica holds one GPU.
REQUESTS = [
    ("r1", "acme", "research", E1, "2026-09-01T00:00:00Z", "2026-09-01T01:00:00Z"),
    ("r2", "globex", "main", E1, "2026-09-01T00:30:00Z", "2026-09-01T01:30:00Z"),
    ("r3", "acme", "batch", E2, "2026-09-01T02:00:00Z", "2026-09-01T02:30:00Z"),
]
HOUR_US = 3_600_000_000


async def seed(control_plane_url: str, url: str, *, until: str = SEP[1], rate: bool = True) -> None:
    """k3s-dev: two GPUs watched every 30 s from September 1st to ``until``."""
    await put_inventory(
        control_plane_url, inventory("k3s-dev", at=SEP[0], gpus=2, endpoints={E1: 1, E2: 1})
    )
    await heartbeats(url, "k3s-dev", start=SEP[0], end=until, gpus=2)
    await ledger(url, REQUESTS)
    if rate:
        async with httpx.AsyncClient(headers=ADMIN) as http:
            assert (
                await http.post(f"{control_plane_url}/api/v1/cost-rates", json=RATE)
            ).status_code == 201


async def close(control_plane_url: str, period: str, **params: str) -> httpx.Response:
    async with httpx.AsyncClient(headers=ADMIN, timeout=30) as http:
        return await http.put(f"{control_plane_url}/api/v1/cost-periods/{period}", params=params)


async def test_a_month_closes_with_the_figures_worked_by_hand(
    control_plane_url: str, postgres_url: str
) -> None:
    await seed(control_plane_url, postgres_url)
    # a request on an endpoint no inventory report ever listed: counted, carries no weight
    await ledger(postgres_url, [("r0", "acme", "research", "http://elsewhere:1", *SEP)])
    response = await close(control_plane_url, "2026-09")
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["unplacedRequests"] == 1
    # 2 GPUs × 720 h × 3.20 USD; busy: e1 1.5 h + e2 0.5 h = 2 GPU-hours
    assert (report["pool"], report["busy"], report["idle"]) == (
        4_608_000_000,
        6_400_000,
        4_601_600_000,
    )
    assert report["currency"] == "USD"
    assert report["coverage"] == 1.0
    assert report["forced"] is False
    assert report["unallocated"] == 0
    assert report["allocated"] == report["pool"]
    # shares of busy GPU-time: research 0.5 + 0.25 h, main 0.25 + 0.5 h, batch 0.5 h
    allocations = {
        (a["tenant"], a["project"]): (a["usedGpuMicroseconds"], a["allocated"])
        for a in report["allocations"]
    }
    assert allocations == {
        ("acme", "research"): (HOUR_US * 3 // 4, 1_728_000_000),
        ("globex", "main"): (HOUR_US * 3 // 4, 1_728_000_000),
        ("acme", "batch"): (HOUR_US // 2, 1_152_000_000),
    }
    tenants = {t["tenant"]: t["due"] for t in report["tenants"]}
    assert tenants == {"acme": 2_880_000_000, "globex": 1_728_000_000}
    assert report["rates"] == [
        {
            "cluster": "k3s-dev",
            "gpuHourMicro": 3_200_000,
            "effectiveFrom": None,
            "observedGpuMicroseconds": 1440 * HOUR_US,
        }
    ]
    [cluster] = report["clusters"]
    assert cluster["busyGpuMicroseconds"] == 2 * HOUR_US
    assert cluster["observedSeconds"] == 30 * 86_400
    async with httpx.AsyncClient(headers=ADMIN) as http:
        again = (await http.get(f"{control_plane_url}/api/v1/cost-periods/2026-09")).json()
        listing = (await http.get(f"{control_plane_url}/api/v1/cost-periods")).json()
    assert again == report
    assert [(p["period"], p["pool"], p["frozenBy"]) for p in listing["data"]] == [
        ("2026-09", 4_608_000_000, None)
    ]


async def test_a_rate_change_mid_month_prices_each_part_at_its_rate(
    control_plane_url: str, postgres_url: str
) -> None:
    await seed(control_plane_url, postgres_url)
    async with httpx.AsyncClient(headers=ADMIN) as http:
        later = {**RATE, "gpuHourMicro": 1_600_000, "effectiveFrom": "2026-09-16T00:00:00Z"}
        assert (
            await http.post(f"{control_plane_url}/api/v1/cost-rates", json=later)
        ).status_code == 201
        duplicate = await http.post(f"{control_plane_url}/api/v1/cost-rates", json=later)
        assert duplicate.status_code == 409
        rates = (
            await http.get(f"{control_plane_url}/api/v1/cost-rates", params={"cluster": "k3s-dev"})
        ).json()["data"]
    assert [r["effectiveFrom"] for r in rates] == [None, "2026-09-16T00:00:00Z"]
    report = (await close(control_plane_url, "2026-09")).json()
    assert report["pool"] == 2 * 360 * 3_200_000 + 2 * 360 * 1_600_000
    # busy time is valued at the cluster's mean observed rate (2.40 USD here)
    assert report["busy"] == 2 * 2_400_000


async def test_a_month_it_did_not_watch_is_refused_naming_the_coverage(
    control_plane_url: str, postgres_url: str
) -> None:
    await seed(control_plane_url, postgres_url, until="2026-09-11T00:00:00Z")  # ten days of thirty
    # and reporting again in October: it existed all along, unwatched for twenty days
    await heartbeats(postgres_url, "k3s-dev", start=OCT[0], end="2026-10-01T00:01:00Z", gpus=2)
    refused = await close(control_plane_url, "2026-09")
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "insufficient_coverage"
    assert error["param"] == "minCoverage"
    assert "33.34%" in error["message"]  # ten days, and 60 s the last sample holds
    assert "k3s-dev" in error["message"]
    forced = await close(control_plane_url, "2026-09", minCoverage="0")
    assert forced.status_code == 200
    report = forced.json()
    assert report["forced"] is True
    assert report["minCoverage"] == 0.0
    assert report["clusters"][0]["observedSeconds"] == 10 * 86_400 + 60
    # 480 GPU-hours and 120 GPU-seconds at 3.20: 1,536,106,666.67 micro-units, rounded once
    assert report["pool"] == 1_536_106_667


async def test_a_fresh_deployment_has_watched_nothing(control_plane_url: str) -> None:
    refused = await close(control_plane_url, "2026-09")
    assert refused.status_code == 400
    assert "observed 0.00%" in refused.json()["error"]["message"]
    forced = (await close(control_plane_url, "2026-09", minCoverage="0")).json()
    assert (forced["pool"], forced["forced"], forced["currency"]) == (0, True, None)


async def test_a_cluster_with_gpus_and_no_rate_is_named(
    control_plane_url: str, postgres_url: str
) -> None:
    await seed(control_plane_url, postgres_url, rate=False)
    refused = await close(control_plane_url, "2026-09")
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "cost_rate_missing"
    assert "'k3s-dev'" in refused.json()["error"]["message"]


async def test_reclosing_books_the_difference_into_the_next_month_then_freezes(
    control_plane_url: str, postgres_url: str
) -> None:
    await seed(control_plane_url, postgres_url, until=OCT[1])
    first = (await close(control_plane_url, "2026-09")).json()
    # a late batch of September rows arrives: initech used e2 for half an hour
    await ledger(
        postgres_url, [("r4", "initech", "web", E2, "2026-09-02T00:00:00Z", "2026-09-02T00:30:00Z")]
    )
    reclosed = await close(control_plane_url, "2026-09")
    assert reclosed.status_code == 200
    report = reclosed.json()
    assert report["allocations"] == first["allocations"]  # the issued month is not rewritten
    assert report["recomputes"] == 1
    booked = {(c["tenant"], c["project"]): c["amount"] for c in report["correctionsBooked"]}
    # 2.5 GPU-hours now: research and main 0.3 each, batch and web 0.2 each
    assert booked == {
        ("acme", "research"): 1_382_400_000 - 1_728_000_000,
        ("globex", "main"): 1_382_400_000 - 1_728_000_000,
        ("acme", "batch"): 921_600_000 - 1_152_000_000,
        ("initech", "web"): 921_600_000,
    }
    assert sum(booked.values()) == 0  # the pool did not change, only its split
    october = await close(control_plane_url, "2026-10")
    assert october.status_code == 200
    corrections = october.json()["corrections"]
    assert {(c["fromPeriod"], c["tenant"], c["project"], c["amount"]) for c in corrections} == {
        ("2026-09", t, p, amount) for (t, p), amount in booked.items()
    }
    initech = [t for t in october.json()["tenants"] if t["tenant"] == "initech"]
    assert initech == [
        {
            "tenant": "initech",
            "usedGpuMicroseconds": 0,
            "allocated": 0,
            "corrections": 921_600_000,
            "due": 921_600_000,
        }
    ]
    frozen = await close(control_plane_url, "2026-09")
    assert frozen.status_code == 409
    assert frozen.json()["error"]["code"] == "period_frozen"
    assert "2026-10" in frozen.json()["error"]["message"]
    async with httpx.AsyncClient(headers=ADMIN) as http:
        listing = (await http.get(f"{control_plane_url}/api/v1/cost-periods")).json()["data"]
    assert [(p["period"], p["frozenBy"], p["recomputes"]) for p in listing] == [
        ("2026-09", "2026-10", 1),
        ("2026-10", None, 0),
    ]


async def test_closing_twice_at_once_leaves_one_report(
    control_plane_url: str, postgres_url: str
) -> None:
    await seed(control_plane_url, postgres_url)
    first, second = await asyncio.gather(
        close(control_plane_url, "2026-09"), close(control_plane_url, "2026-09")
    )
    assert (first.status_code, second.status_code) == (200, 200)
    assert first.json() == second.json()
    assert first.json()["recomputes"] == 0
    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
        cursor = await conn.execute("SELECT count(*) FROM cost_periods")
        assert await cursor.fetchone() == (1,)
        cursor = await conn.execute("SELECT count(*) FROM cost_corrections")
        assert await cursor.fetchone() == (0,)


async def test_the_report_as_csv_for_finance(control_plane_url: str, postgres_url: str) -> None:
    await seed(control_plane_url, postgres_url)
    closed = await close(control_plane_url, "2026-09", format="csv")
    async with httpx.AsyncClient(headers=ADMIN) as http:
        accepted = await http.get(
            f"{control_plane_url}/api/v1/cost-periods/2026-09", headers={"Accept": "text/csv"}
        )
    for response in (closed, accepted):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(accepted.text)))
    assert closed.text == accepted.text
    lines = {(r["line"], r["tenant"], r["project"]): int(r["amountMicro"]) for r in rows}
    assert lines == {
        ("pool", "", ""): 4_608_000_000,
        ("busy", "", ""): 6_400_000,
        ("idle", "", ""): 4_601_600_000,
        ("allocation", "acme", "batch"): 1_152_000_000,
        ("allocation", "acme", "research"): 1_728_000_000,
        ("allocation", "globex", "main"): 1_728_000_000,
    }
    assert {r["currency"] for r in rows} == {"USD"}


@pytest.mark.parametrize(
    ("method", "path", "params", "status", "param"),
    [
        ("PUT", "2026-13", {}, 404, None),
        ("GET", "2026-09", {}, 404, None),
        ("PUT", "2099-01", {}, 400, None),  # not over yet
        ("PUT", "2026-09", {"minCoverage": "1e-999999999"}, 400, "minCoverage"),
        ("PUT", "2026-09", {"minCoverage": "lots"}, 400, "minCoverage"),
        ("PUT", "2026-09", {"minCoverage": "1.5"}, 400, "minCoverage"),
        ("PUT", "2026-09", {"format": "xml"}, 400, "format"),
    ],
)
async def test_mistakes_are_4xx(
    control_plane_url: str,
    method: str,
    path: str,
    params: dict[str, Any],
    status: int,
    param: str | None,
) -> None:
    async with httpx.AsyncClient(headers=ADMIN) as http:
        response = await http.request(
            method, f"{control_plane_url}/api/v1/cost-periods/{path}", params=params
        )
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**RATE, "gpuHourMicro": -1}, "gpuHourMicro"),
        ({**RATE, "gpuHourMicro": 1.5}, "gpuHourMicro"),
        ({**RATE, "currency": "usd"}, "currency"),
        ({"gpuHourMicro": 1, "currency": "USD"}, "cluster"),
        ({**RATE, "effectiveFrom": "2026-09-01T00:00:00"}, "effectiveFrom"),
    ],
)
async def test_a_bad_rate_is_400_naming_the_field(
    control_plane_url: str, body: dict[str, Any], param: str
) -> None:
    async with httpx.AsyncClient(headers=ADMIN) as http:
        response = await http.post(f"{control_plane_url}/api/v1/cost-rates", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
