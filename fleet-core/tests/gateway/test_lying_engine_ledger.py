"""The lying-engine suite in database mode: absurd usage reaches the ledger bounded, the writer
lives on, the usage agreement flags the engine, and refusals are counted rather than stored.

Real parts throughout: a fresh Postgres, Redis, the control plane in process, a gateway over
loopback in front of a raw-socket `FaultEngine`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import psycopg

from fleet_core.gateway.settings import DatabaseModeSettings
from fleet_testing.fix_auth import bearer
from fleet_testing.waiting import eventually

from .conftest import TPM, Rig, RigFactory, issue_tenant_key
from .money import metric
from .test_lying_engine import MAX_TOKENS, chat, usage


async def database_rig(
    start_rig: RigFactory, control_plane: httpx.AsyncClient, postgres_url: str, tmp_path: Path
) -> Rig:
    key = await issue_tenant_key(control_plane, tpm=TPM)
    database = DatabaseModeSettings(url=postgres_url, spool_path=tmp_path / "spool.jsonl")
    rig = await start_rig(database=database, key=key)
    await eventually(lambda: _served(rig), within=5, what="the key served")
    return rig


async def _served(rig: Rig) -> bool:
    return (await rig.send()).status_code == 200


async def rows(url: str) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cursor = await conn.execute(
            "SELECT engine_completion_tokens, completion_tokens, outcome FROM ledger"
            " ORDER BY received_at"
        )
        return await cursor.fetchall()


async def test_a_usage_figure_past_int8_does_not_stop_the_ledger(
    start_rig: RigFactory, control_plane: httpx.AsyncClient, postgres_url: str, tmp_path: Path
) -> None:
    """Regression: ``completion_tokens: 15000000000000000000`` raised OverflowError in the
    ledger's int8 encoding, which killed the writer task without a word: every later record
    waited in memory until shutdown, and /readyz said ready all along."""
    rig = await database_rig(start_rig, control_plane, postgres_url, tmp_path)
    rig.engine.then([chat(usage(3, 15 * 10**18))])
    for _ in range(3):
        assert (await rig.send()).status_code == 200
    found = await rig.books.check(admitted=4)  # one ledger row each, buckets exact
    lied = [r for r in found if r.out_of_bounds]
    assert [r.completion_tokens for r in lied] == [MAX_TOKENS]
    stored = await rows(postgres_url)
    assert (2**63 - 1, MAX_TOKENS, "ok") in stored  # the claim saturated, the bill bounded
    async with httpx.AsyncClient() as http:
        ready = await http.get(f"{rig.gw.url}/readyz")
    assert ready.status_code == 200, ready.text


async def test_the_usage_agreement_flags_figures_out_of_bounds(
    start_rig: RigFactory, control_plane: httpx.AsyncClient, postgres_url: str, tmp_path: Path
) -> None:
    rig = await database_rig(start_rig, control_plane, postgres_url, tmp_path)
    rig.engine.then([chat(usage(-500, 2))], [chat(usage(3, 10**12))])
    for _ in range(3):
        assert (await rig.send()).status_code == 200
    await rig.books.check(admitted=4)
    found = (await control_plane.get("/api/v1/usage-agreement")).json()["data"]
    [model] = found
    assert (model["requests"], model["outOfBounds"]) == (4, 2)
    headers = rig.books.headers
    assert await metric(rig.gw.url, "fleet_engine_usage_out_of_bounds_total", headers) == 2


async def test_refusals_are_counted_not_stored(
    start_rig: RigFactory, control_plane: httpx.AsyncClient, postgres_url: str, tmp_path: Path
) -> None:
    """Regression: every refused request wrote a ledger row (27,414 from one client looping on
    a 429). Refusals bill nothing and are counted on /metrics by status instead; the usage
    API's answers, which never counted them, are unchanged."""
    rig = await database_rig(start_rig, control_plane, postgres_url, tmp_path)
    big = TPM * 5 // 6
    rig.engine.then([chat(usage(3, big - 10))])  # leaves the bucket far below ``big``
    statuses = [(await rig.send(max_tokens=big)).status_code for _ in range(21)]
    assert statuses[0] == 200
    assert statuses.count(429) == 20, statuses
    await rig.books.check(admitted=2)  # no ledger row for a refusal
    await asyncio.sleep(0.5)  # longer than the writer's flush: a queued refusal would be in
    assert [r[2] for r in await rows(postgres_url)] == ["ok", "ok"]
    refused = await metric(rig.gw.url, "fleet_requests_refused_total", rig.books.headers)
    assert refused == statuses.count(429)
    found = (await control_plane.get("/api/v1/usage")).json()["data"]
    assert sum(row["requests"] for row in found) == 2


async def test_a_dead_ledger_writer_makes_the_gateway_not_ready(
    start_rig: RigFactory,
    control_plane: httpx.AsyncClient,
    postgres_url: str,
    tmp_path: Path,
    admin_token: str,
) -> None:
    rig = await database_rig(start_rig, control_plane, postgres_url, tmp_path)
    writer = rig.gw.app.app.state.database.ledger
    writer._task.cancel()  # stands in for a bug that ends the task
    await asyncio.sleep(0)
    async with httpx.AsyncClient() as http:
        ready = await http.get(f"{rig.gw.url}/readyz", headers=bearer(admin_token))
    assert ready.status_code == 503
    assert "ledger writer stopped" in ready.json()["status"]
