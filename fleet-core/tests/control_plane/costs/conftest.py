"""A control plane on a fresh database, and helpers that seed what a close reads.

Capacity samples are written straight into ``capacity_samples`` with ``generate_series`` (a month
of 30-second heartbeats is 86,400 reports); endpoint placements come from one real
``PUT /api/v1/inventory``; ledger rows are inserted as the ledger writer would leave them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest

from fleet_core.control_plane.app import ApiserverSettings
from fleet_core.shared.settings import LogSettings
from fleet_testing.asgi import control_plane_app
from fleet_testing.fix_auth import bearer

ADMIN_TOKEN = "costs-tests-admin-token-0123456789abcdef"
ADMIN = bearer(ADMIN_TOKEN)
"""The headers of the control plane's admin (its token, and the JSON type writes need)."""


@pytest.fixture
async def control_plane_url(postgres_url: str) -> AsyncIterator[str]:
    settings = ApiserverSettings(
        log=LogSettings(access=False), database_url=postgres_url, admin_token=ADMIN_TOKEN
    )
    async with control_plane_app(settings) as url:
        yield url


def inventory(
    cluster: str, *, at: str, gpus: int, endpoints: dict[str, int] | None = None
) -> dict[str, Any]:
    """A report of one node with ``gpus`` GPUs, and one deployment per GPUs-per-replica figure
    listing ``endpoints`` (url → GPUs per replica)."""
    by_size: dict[int, list[str]] = {}
    for url, size in (endpoints or {}).items():
        by_size.setdefault(size, []).append(url)
    return {
        "schemaVersion": 1,
        "clusterId": cluster,
        "observedAt": at,
        "reporterVersion": "test",
        "nodes": [
            {
                "name": "node-1",
                "ready": True,
                "schedulable": True,
                "gpus": [{"vendor": "nvidia", "product": "L4", "memoryMib": 23034, "count": gpus}],
            }
        ],
        "deployments": [
            {
                "name": f"m{size}",
                "namespace": "default",
                "servedModelName": f"model-{size}",
                "engine": "vllm",
                "weightFormat": "safetensors",
                "gpusPerReplica": size,
                "desiredReplicas": len(urls),
                "readyReplicas": len(urls),
                "phase": "Ready",
                "endpoints": [{"url": url + "/", "ready": True} for url in urls],
            }
            for size, urls in by_size.items()
        ],
    }


async def put_inventory(control_plane_url: str, report: dict[str, Any]) -> None:
    """PUT ``report`` as its cluster's operator would, the cluster bound first to exactly the
    models and endpoint hosts it lists (ADR 0020: an unbound cluster serves nothing)."""
    models = [d["servedModelName"] for d in report["deployments"]]
    hosts = [
        urlsplit(e["url"]).hostname for d in report["deployments"] for e in d["endpoints"]
    ]  # fmt: skip
    binding = {"servedModels": models, "endpoints": [f"{h}/32" for h in hosts]}
    async with httpx.AsyncClient(headers=ADMIN) as http:
        bound = await http.put(
            f"{control_plane_url}/api/v1/clusters/{report['clusterId']}/binding", json=binding
        )
        assert bound.status_code == 200, bound.text
        response = await http.put(f"{control_plane_url}/api/v1/inventory", json=report)
    assert response.status_code == 200, response.text


async def heartbeats(
    url: str, cluster: str, *, start: str, end: str, gpus: int, every_s: int = 30
) -> None:
    """One capacity sample every ``every_s`` seconds in ``[start, end)``."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO capacity_samples (cluster_id, observed_at, gpus)"
            " SELECT %s, t, %s FROM generate_series(%s::timestamptz, %s::timestamptz"
            " - interval '1 microsecond', make_interval(secs => %s)) AS t"
            " ON CONFLICT DO NOTHING",
            (cluster, gpus, start, end, every_s),
        )


async def ledger(url: str, rows: list[tuple[str, str, str, str, str, str]]) -> None:
    """``(request_id, tenant, project, endpoint, received_at, done_at)`` as served requests."""
    async with (
        await psycopg.AsyncConnection.connect(url, autocommit=True) as conn,
        conn.cursor() as cursor,
    ):
        await cursor.executemany(
            "INSERT INTO ledger (request_id, received_at, done_at, tenant, project, model,"
            " served_model, endpoint, kind, status, outcome, stream, gw_prompt_tokens,"
            " gw_completion_tokens, count_method, prompt_tokens, completion_tokens,"
            " cached_tokens, fresh_tokens) VALUES (%s, %s, %s, %s, %s, 'm', 'm', %s, 'chat',"
            " 200, 'ok', false, 1, 1, 'engine', 1, 1, 0, 1)",
            [(r, rec, done, t, p, e) for r, t, p, e, rec, done in rows],
        )


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
