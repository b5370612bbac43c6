"""GET /api/v1/usage: the ledger's rollups, filtered and grouped, summed as written."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleet_core.gateway.ledger.writer import LedgerWriter
from fleet_core.gateway.metering.records import EngineUsage, GatewayCount, UsageRecord

from .conftest import ApiserverFactory

T0 = 1_788_220_800.0  # 2026-09-01T00:00:00Z


def record(
    n: int,
    *,
    tenant: str,
    project: str,
    model: str,
    at: float,
    prompt: int,
    completion: int,
    cached: int = 0,
) -> UsageRecord:
    return UsageRecord(
        request_id=f"r{n}",
        kind="chat",
        model=model,
        served_model=model,
        endpoint="http://e:1",
        status=200,
        outcome="ok",
        stream=False,
        received_at=at - 1,
        first_byte_at=at - 0.5,
        done_at=at,
        engine=EngineUsage(prompt, completion, cached),
        gateway=GatewayCount(prompt, completion, "estimate:chars/4"),
        tenant=tenant,
        project=project,
        key_id="k_x",
    )


RECORDS = [
    record(
        1,
        tenant="acme",
        project="research",
        model="qwen",
        at=T0 + 60,
        prompt=100,
        completion=10,
        cached=40,
    ),
    record(
        2, tenant="acme", project="research", model="qwen", at=T0 + 3700, prompt=50, completion=5
    ),
    record(3, tenant="acme", project="batch", model="gemma", at=T0 + 3720, prompt=7, completion=3),
    record(
        4,
        tenant="globex",
        project="main",
        model="qwen",
        at=T0 + 86_400 + 5,
        prompt=1000,
        completion=100,
    ),
]


@pytest.fixture
async def control_plane_url(
    start_apiserver: ApiserverFactory,
    postgres_url: str,
    tmp_path: Path,
    admin_headers: dict[str, str],
) -> AsyncIterator[httpx.AsyncClient]:
    """An admin's client on a control plane whose ledger holds ``RECORDS``."""
    url = await start_apiserver(database_url=postgres_url)  # applies the migrations
    async with LedgerWriter(postgres_url, spool_path=tmp_path / "spool.jsonl") as writer:
        for item in RECORDS:
            writer.record(item)
        async with asyncio.timeout(15):
            await writer.wait_settled()
    async with httpx.AsyncClient(base_url=url, headers=admin_headers) as http:
        yield http


async def get(control_plane_url: httpx.AsyncClient, **params: str) -> httpx.Response:
    return await control_plane_url.get("/api/v1/usage", params=params)


WINDOW = {"from": "2026-09-01T00:00:00Z", "to": "2026-09-03T00:00:00Z"}


async def test_grouped_by_day_and_hour(control_plane_url: httpx.AsyncClient) -> None:
    days = (await get(control_plane_url, **WINDOW, groupBy="day")).json()["data"]
    assert [(d["key"], d["requests"]) for d in days] == [("2026-09-01", 3), ("2026-09-02", 1)]
    first = days[0]
    assert first["tokensInput"] == 157
    assert first["tokensOutput"] == 18
    assert first["tokensCached"] == 40
    assert first["tokensFresh"] == 117
    hours = (await get(control_plane_url, **WINDOW, groupBy="hour", tenantId="acme")).json()["data"]
    assert [(h["key"], h["requests"]) for h in hours] == [
        ("2026-09-01T00:00:00Z", 1),
        ("2026-09-01T01:00:00Z", 2),
    ]


async def test_grouped_by_model_and_project_with_filters(
    control_plane_url: httpx.AsyncClient,
) -> None:
    models = {
        m["key"]: m["requests"]
        for m in (await get(control_plane_url, **WINDOW, groupBy="model")).json()["data"]
    }
    assert models == {"qwen": 3, "gemma": 1}
    projects = (await get(control_plane_url, **WINDOW, groupBy="project", tenantId="acme")).json()[
        "data"
    ]
    assert {p["key"]: p["tokensOutput"] for p in projects} == {"acme/research": 15, "acme/batch": 3}
    one = (await get(control_plane_url, **WINDOW, groupBy="model", projectId="acme/batch")).json()[
        "data"
    ]
    assert one == [
        {
            "key": "gemma",
            "requests": 1,
            "tokensInput": 7,
            "tokensOutput": 3,
            "tokensCached": 0,
            "tokensFresh": 7,
            "units": 0,
        }
    ]
    narrow = (
        await get(control_plane_url, groupBy="day", **{"from": "2026-09-02", "to": "2026-09-03"})
    ).json()
    assert [d["key"] for d in narrow["data"]] == ["2026-09-02"]


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"groupBy": "week"}, "groupBy"),
        ({"from": "yesterday"}, "from"),
        ({"from": "2026-09-02", "to": "2026-09-01"}, "to"),
        ({"projectId": "research"}, "projectId"),
        ({"projectId": "acme/research", "tenantId": "globex"}, "projectId"),
        ({"model": "qw\x00en"}, "model"),
    ],
)
async def test_bad_parameters_are_400_naming_them(
    control_plane_url: httpx.AsyncClient, params: dict[str, Any], param: str
) -> None:
    response = await get(control_plane_url, **params)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
