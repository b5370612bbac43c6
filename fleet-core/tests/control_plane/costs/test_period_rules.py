"""The period rules a finance team relies on, each from a reproduction on a scratch database:
months close in order, late rows are billed, placements are kept in time, one close
reads one snapshot, coverage is per cluster over its lifetime, and inputs are bounded."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from fleet_core.control_plane.costs.service import CostService, CostSettings
from fleet_core.shared.errors import InvalidRequest

from .conftest import ADMIN, heartbeats, inventory, ledger, put_inventory

E1, E2 = "http://10.0.0.1:8000", "http://10.0.0.2:8000"
HOUR_US = 3_600_000_000
RATE = {"cluster": "k3s-dev", "gpuHourMicro": 3_200_000, "currency": "USD"}


async def close(control_plane_url: str, period: str, **params: str) -> httpx.Response:
    async with httpx.AsyncClient(headers=ADMIN, timeout=60) as http:
        return await http.put(f"{control_plane_url}/api/v1/cost-periods/{period}", params=params)


async def post_rate(control_plane_url: str, rate: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(headers=ADMIN) as http:
        return await http.post(f"{control_plane_url}/api/v1/cost-rates", json=rate)


async def watched(
    control_plane_url: str, url: str, start: str, end: str, cluster: str = "k3s-dev"
) -> None:
    """``cluster`` with two GPUs, e1 and e2 on one GPU each, reported every 30 s."""
    report = inventory(cluster, at=start, gpus=2, endpoints={E1: 1, E2: 1})
    await put_inventory(control_plane_url, report)
    await heartbeats(url, cluster, start=start, end=end, gpus=2)


def row(rid: str, tenant: str, endpoint: str, start: str, end: str) -> tuple[str, ...]:
    return (rid, tenant, "main", endpoint, start, end)


async def acme_in_september(control_plane_url: str, url: str, *, watched_until: str) -> None:
    """k3s-dev watched from September 1st until ``watched_until`` at ``RATE``, and acme's one hour
    on e1 on September 2nd in the ledger."""
    await watched(control_plane_url, url, "2026-09-01T00:00:00Z", watched_until)
    await post_rate(control_plane_url, RATE)
    await ledger(url, [row("s1", "acme", E1, "2026-09-02T00:00:00Z", "2026-09-02T01:00:00Z")])


async def read_period(control_plane_url: str, period: str) -> httpx.Response:
    async with httpx.AsyncClient(headers=ADMIN) as http:
        return await http.get(f"{control_plane_url}/api/v1/cost-periods/{period}")


def due(report: dict[str, Any]) -> dict[str, int]:
    return {t["tenant"]: t["due"] for t in report["tenants"]}


# 1. Order: a first close of a later month no longer freezes an earlier one.


async def test_a_later_month_cannot_be_closed_first_over_an_open_month_with_data(
    control_plane_url: str, postgres_url: str
) -> None:
    await acme_in_september(control_plane_url, postgres_url, watched_until="2026-11-01T00:00:00Z")
    refused = await close(control_plane_url, "2026-10", minCoverage="0")
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "previous_period_open"
    assert "close 2026-09 first" in error["message"]
    september = await close(control_plane_url, "2026-09")
    assert september.status_code == 200, september.text
    assert due(september.json()) == {"acme": 2 * 720 * 3_200_000}
    assert (await close(control_plane_url, "2026-10")).status_code == 200
    frozen = await close(control_plane_url, "2026-09")
    assert frozen.status_code == 409
    assert frozen.json()["error"]["code"] == "period_frozen"


async def test_a_month_never_closed_is_not_frozen_by_its_successor(
    control_plane_url: str, postgres_url: str
) -> None:
    # October is the first month with anything to bill, so it may be closed first...
    await watched(control_plane_url, postgres_url, "2026-10-01T00:00:00Z", "2026-11-01T00:00:00Z")
    await post_rate(control_plane_url, RATE)
    assert (await close(control_plane_url, "2026-10")).status_code == 200
    # ...then a replayed spool brings September usage and capacity: September is still issuable
    await heartbeats(
        postgres_url, "k3s-dev", start="2026-09-01T00:00:00Z", end="2026-10-01T00:00:00Z", gpus=2
    )
    await ledger(
        postgres_url, [row("s1", "acme", E1, "2026-09-02T00:00:00Z", "2026-09-02T01:00:00Z")]
    )
    september = await close(control_plane_url, "2026-09")
    assert september.status_code == 200, september.text
    assert september.json()["pool"] == 2 * 720 * 3_200_000
    read = await read_period(control_plane_url, "2026-09")
    assert read.status_code == 200
    # it is frozen only now, for a re-close: its successor has been closed
    assert (await close(control_plane_url, "2026-09")).json()["error"]["code"] == "period_frozen"


# 2. Late rows and the grace period.


async def test_a_late_row_of_a_closed_month_is_billed_when_the_next_month_closes(
    control_plane_url: str, postgres_url: str
) -> None:
    await acme_in_september(control_plane_url, postgres_url, watched_until="2026-11-01T00:00:00Z")
    september = (await close(control_plane_url, "2026-09")).json()
    assert due(september) == {"acme": 4_608_000_000}
    # in flight at midnight, or a spool replayed after an outage: a September row, after the close
    await ledger(
        postgres_url, [row("late", "initech", E2, "2026-09-03T00:00:00Z", "2026-09-03T01:00:00Z")]
    )
    october = await close(control_plane_url, "2026-10")
    assert october.status_code == 200, october.text
    corrections = {
        (c["fromPeriod"], c["tenant"]): c["amount"] for c in october.json()["corrections"]
    }
    assert corrections == {
        ("2026-09", "acme"): -2_304_000_000,
        ("2026-09", "initech"): 2_304_000_000,
    }
    # nobody used October: its pool is unallocated, and the tenants owe September's differences
    assert due(october.json()) == {"acme": -2_304_000_000, "initech": 2_304_000_000}
    again = (await read_period(control_plane_url, "2026-09")).json()
    assert again["allocations"] == september["allocations"]  # as issued
    assert again["recomputes"] == 1
    assert sum(c["amount"] for c in again["correctionsBooked"]) == 0


@pytest.fixture
async def pool(control_plane_url: str, postgres_url: str) -> AsyncIterator[AsyncConnectionPool]:
    """A pool on the migrated database (the control plane fixture applied the migrations)."""
    async with AsyncConnectionPool(postgres_url, min_size=1, max_size=2, open=False) as opened:
        await opened.wait()
        yield opened


async def test_a_month_closes_only_after_the_grace_period(
    control_plane_url: str, postgres_url: str, pool: AsyncConnectionPool
) -> None:
    await watched(control_plane_url, postgres_url, "2026-09-01T00:00:00Z", "2026-10-01T00:00:00Z")
    await post_rate(control_plane_url, RATE)
    service = CostService.on_pool(pool, CostSettings(close_grace_s=3600))
    early = datetime(2026, 10, 1, 0, 59, 59, tzinfo=UTC)
    with pytest.raises(InvalidRequest, match="2026-10-01T01:00:00") as refused:
        await service.close("2026-09", now=early)
    assert refused.value.code == "period_not_over"
    report = await service.close("2026-09", now=datetime(2026, 10, 1, 1, tzinfo=UTC))
    assert report.pool == 2 * 720 * 3_200_000


# 3. Placements in time: a recycled pod IP.


async def test_a_recycled_pod_ip_keeps_the_placement_it_had_when_the_request_ran(
    control_plane_url: str, postgres_url: str
) -> None:
    july, august = "2026-07-01T00:00:00Z", "2026-08-01T00:00:00Z"
    await put_inventory(control_plane_url, inventory("k3s-dev", at=july, gpus=9, endpoints={E1: 1}))
    await heartbeats(postgres_url, "k3s-dev", start=july, end="2026-09-01T00:00:00Z", gpus=9)
    await post_rate(control_plane_url, RATE)
    await ledger(
        postgres_url,
        [
            row("j1", "acme", E1, "2026-07-02T00:00:00Z", "2026-07-02T01:00:00Z"),
            row("j2", "globex", E2, "2026-07-02T00:00:00Z", "2026-07-02T01:00:00Z"),
        ],
    )
    # August: the 1-GPU pod is gone; its IP now serves an 8-GPU replica, and e2 holds 1 GPU
    await put_inventory(
        control_plane_url, inventory("k3s-dev", at=august, gpus=9, endpoints={E1: 8, E2: 1})
    )
    await ledger(
        postgres_url, [row("a1", "acme", E1, "2026-08-02T00:00:00Z", "2026-08-02T01:00:00Z")]
    )
    report = (await close(control_plane_url, "2026-07")).json()
    used = {a["tenant"]: a["usedGpuMicroseconds"] for a in report["allocations"]}
    # July's e1 held one GPU: acme and globex used the same GPU-time (e2 unplaced in July)
    assert used == {"acme": HOUR_US}
    assert report["unplacedRequests"] == 1
    august_report = (await close(control_plane_url, "2026-08")).json()
    assert {a["tenant"]: a["usedGpuMicroseconds"] for a in august_report["allocations"]} == {
        "acme": 8 * HOUR_US
    }
    assert august_report["corrections"] == []  # re-measuring July found nothing new


# 4. One snapshot: a project committed during a close.


async def test_projects_committed_while_closing_never_give_a_500(
    control_plane_url: str, postgres_url: str
) -> None:
    await acme_in_september(control_plane_url, postgres_url, watched_until="2026-10-01T00:00:00Z")
    assert (await close(control_plane_url, "2026-09")).status_code == 200
    stop = asyncio.Event()

    async def new_projects() -> int:
        written = 0
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
            for i in itertools.count():
                if stop.is_set():
                    return written
                await conn.execute(
                    "INSERT INTO ledger (request_id, received_at, done_at, tenant, project,"
                    " model, served_model, endpoint, kind, status, outcome, stream,"
                    " gw_prompt_tokens, gw_completion_tokens, count_method, prompt_tokens,"
                    " completion_tokens, cached_tokens, fresh_tokens) VALUES (%s,"
                    " '2026-09-05T00:00:00Z', '2026-09-05T00:10:00Z', 'newco', %s, 'm', 'm', %s,"
                    " 'chat', 200, 'ok', false, 1, 1, 'engine', 1, 1, 0, 1)",
                    (f"n{i}", f"p{i}", E2),
                )
                written += 1
        return written

    writer = asyncio.create_task(new_projects())
    try:
        statuses = [(await close(control_plane_url, "2026-09")).status_code for _ in range(8)]
    finally:
        stop.set()
        written = await writer
    assert statuses == [200] * 8
    assert written > 8


# 5. Coverage per cluster over its lifetime; the operator's interval against the gap.


async def test_a_cluster_joining_mid_month_is_covered_over_the_time_it_existed(
    control_plane_url: str, postgres_url: str
) -> None:
    await watched(control_plane_url, postgres_url, "2026-09-01T00:00:00Z", "2026-10-01T00:00:00Z")
    await put_inventory(control_plane_url, inventory("new-dc", at="2026-09-16T00:00:00Z", gpus=4))
    await heartbeats(
        postgres_url, "new-dc", start="2026-09-16T00:00:00Z", end="2026-10-01T00:00:00Z", gpus=4
    )
    await post_rate(control_plane_url, RATE)
    await post_rate(control_plane_url, {**RATE, "cluster": "new-dc"})
    closed = await close(
        control_plane_url, "2026-09"
    )  # no ?minCoverage=0 needed for a fleet that grew
    assert closed.status_code == 200, closed.text
    report = closed.json()
    clusters = {c["cluster"]: (c["coverage"], c["existedSeconds"]) for c in report["clusters"]}
    assert clusters == {"k3s-dev": (1.0, 30 * 86_400), "new-dc": (1.0, 15 * 86_400)}
    assert (report["coverage"], report["forced"]) == (1.0, False)


async def test_a_decommissioned_cluster_ends_its_lifetime_there(
    control_plane_url: str, postgres_url: str
) -> None:
    await watched(control_plane_url, postgres_url, "2026-09-01T00:00:00Z", "2026-10-01T00:00:00Z")
    # old-dc reported until the 10th; it was taken out of service on the 20th
    await put_inventory(
        control_plane_url,
        inventory(
            "old-dc", at="2026-09-01T00:00:00Z", gpus=4, endpoints={"http://10.9.0.1:8000": 4}
        ),
    )
    await heartbeats(
        postgres_url, "old-dc", start="2026-09-01T00:00:00Z", end="2026-09-10T00:00:00Z", gpus=4
    )
    await post_rate(control_plane_url, RATE)
    await post_rate(control_plane_url, {**RATE, "cluster": "old-dc"})
    async with httpx.AsyncClient(headers=ADMIN) as http:
        gone = await http.delete(
            f"{control_plane_url}/api/v1/clusters/old-dc", params={"at": "2026-09-20T00:00:00Z"}
        )
        assert gone.status_code == 200, gone.text
        assert gone.json() == {"clusterId": "old-dc", "decommissionedAt": "2026-09-20T00:00:00Z"}
        assert (await http.get(f"{control_plane_url}/api/v1/clusters/old-dc")).status_code == 404
        endpoints = (await http.get(f"{control_plane_url}/api/v1/endpoints")).json()
        assert "http://10.9.0.1:8000" not in str(endpoints)
        again = await http.delete(f"{control_plane_url}/api/v1/clusters/old-dc")
        assert again.status_code == 404
    refused = await close(control_plane_url, "2026-09")
    assert refused.status_code == 400  # nine days watched of the nineteen it existed
    assert "old-dc 47.37%" in refused.json()["error"]["message"]
    report = (await close(control_plane_url, "2026-09", minCoverage="0")).json()
    old = next(c for c in report["clusters"] if c["cluster"] == "old-dc")
    assert old["existedSeconds"] == 19 * 86_400
    assert old["observedSeconds"] == 9 * 86_400 - 30 + 90


async def test_an_operator_reporting_less_often_than_a_sample_vouches_is_refused(
    control_plane_url: str,
) -> None:
    report = inventory("k3s-dev", at="2026-09-01T00:00:00Z", gpus=2)
    async with httpx.AsyncClient(headers=ADMIN) as http:
        fine = await http.put(
            f"{control_plane_url}/api/v1/inventory", json={**report, "reportIntervalSeconds": 30}
        )
        slow = await http.put(
            f"{control_plane_url}/api/v1/inventory", json={**report, "reportIntervalSeconds": 120}
        )
    assert fine.status_code == 200
    assert slow.status_code == 400
    error = slow.json()["error"]
    assert (error["code"], error["param"]) == ("report_interval_too_long", "reportIntervalSeconds")
    assert "--report-interval" in error["message"]


# 6. Bounds: 400, never a 500.


async def test_a_rate_near_two_to_the_63_is_400(control_plane_url: str) -> None:
    for amount in (2**63 - 1, 2**53):
        refused = await post_rate(control_plane_url, {**RATE, "gpuHourMicro": amount})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == "gpuHourMicro"
    assert (
        await post_rate(control_plane_url, {**RATE, "gpuHourMicro": 2**53 - 1})
    ).status_code == 201


def _full_node() -> dict[str, Any]:
    """A node whose GPU count fits a column, though two of them do not."""
    return inventory("k3s-dev", at="2026-09-01T00:00:00Z", gpus=2**31 - 1)["nodes"][0]


@pytest.mark.parametrize(
    ("edit", "param"),
    [
        (lambda r: r["nodes"][0]["gpus"][0].update(count=3_000_000_000), "nodes[0].gpus[0].count"),
        (
            lambda r: r["deployments"][0].update(gpusPerReplica=3_000_000_000),
            "deployments[0].gpusPerReplica",
        ),
        (lambda r: r["nodes"].extend([_full_node(), _full_node()]), "nodes"),
    ],
)
async def test_inventory_counts_out_of_bounds_are_400(
    control_plane_url: str, edit: Any, param: str
) -> None:
    report = inventory("k3s-dev", at="2026-09-01T00:00:00Z", gpus=1, endpoints={E1: 1})
    edit(report)
    async with httpx.AsyncClient(headers=ADMIN) as http:
        response = await http.put(f"{control_plane_url}/api/v1/inventory", json=report)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
