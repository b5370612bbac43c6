"""Closing a month on a MIG fleet through the HTTP API, as finance uses it: a MIG slice is priced
as its part of a card, in the pool's capacity and in a tenant's busy time (ADR 0026).

The cluster reports once a day for all of September (the control plane told a report vouches for
a day), so every capacity sample comes through ``PUT /api/v1/inventory`` and the inventory's own
arithmetic, not through SQL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest

from fleet_core.control_plane.app import ApiserverSettings
from fleet_core.control_plane.costs.service import CostSettings
from fleet_core.shared.settings import LogSettings
from fleet_core.shared.storage.migrations import available
from fleet_testing.asgi import control_plane_app

from .conftest import ADMIN, ADMIN_TOKEN, ledger, put_inventory, utc

HOUR_US = 3_600_000_000
RATE = 7_000_000  # 7.00 USD per GPU-hour: a 1g.10gb slice-hour (1/7 of a card) is 1.00 USD
E1, E2, E3 = "http://10.0.1.1:8000", "http://10.0.1.2:8000", "http://10.0.1.3:8000"
H100 = {"vendor": "nvidia", "product": "NVIDIA-H100-80GB-HBM3", "memoryMib": 81559}


@pytest.fixture
async def daily_control_plane(postgres_url: str) -> AsyncIterator[str]:
    settings = ApiserverSettings(
        log=LogSettings(access=False),
        database_url=postgres_url,
        admin_token=ADMIN_TOKEN,
        costs=CostSettings(max_sample_gap_s=86_400),
    )
    async with control_plane_app(settings) as url:
        yield url


def mig_report(at: str) -> dict[str, Any]:
    """Two H100s: one whole, one fully partitioned into seven 1g.10gb slices (the device
    plugin's mixed strategy advertises ``nvidia.com/gpu: 0`` there). ``small`` runs two
    replicas on one slice each, ``big`` one replica on the whole card."""

    def deployment(name: str, urls: list[str], **placement: Any) -> dict[str, Any]:
        return {
            "name": name,
            "namespace": "models",
            "servedModelName": name,
            "engine": "vllm",
            "weightFormat": "safetensors",
            "gpusPerReplica": 1,
            "desiredReplicas": len(urls),
            "readyReplicas": len(urls),
            "phase": "Ready",
            "endpoints": [{"url": url, "ready": True} for url in urls],
            **placement,
        }

    slices = {"profile": "1g.10gb", "count": 7, "share": {"numerator": 1, "denominator": 7}}
    return {
        "schemaVersion": 1,
        "clusterId": "mig-east",
        "observedAt": at,
        "reporterVersion": "test",
        "nodes": [
            {"name": "whole", "ready": True, "schedulable": True, "gpus": [{**H100, "count": 1}]},
            {
                "name": "mig",
                "ready": True,
                "schedulable": True,
                "gpus": [{**H100, "count": 0, "migSlices": [slices]}],
            },
        ],
        "deployments": [
            deployment(
                "small",
                [E1, E2],
                accelerator="nvidia.com/mig-1g.10gb",
                gpuShare={"numerator": 1, "denominator": 7},
            ),
            deployment("big", [E3], accelerator="nvidia.com/gpu"),
        ],
    }


async def test_a_slice_hour_costs_its_part_of_a_card_and_the_month_adds_up(
    daily_control_plane: str, postgres_url: str
) -> None:
    start = utc("2026-09-01T00:00:00Z")
    for day in range(30):
        at = (start + timedelta(days=day)).isoformat().replace("+00:00", "Z")
        await put_inventory(daily_control_plane, mig_report(at))
    await ledger(
        postgres_url,
        [  # acme: one 1g.10gb slice for an hour; globex: the whole card for half an hour
            ("m1", "acme", "chat", E1, "2026-09-01T00:00:00Z", "2026-09-01T01:00:00Z"),
            ("m2", "globex", "main", E3, "2026-09-02T00:00:00Z", "2026-09-02T00:30:00Z"),
        ],
    )
    async with httpx.AsyncClient(headers=ADMIN, timeout=30) as http:
        rate = {"cluster": "mig-east", "gpuHourMicro": RATE, "currency": "USD"}
        assert (await http.post(f"{daily_control_plane}/api/v1/cost-rates", json=rate)).is_success
        closed = await http.put(f"{daily_control_plane}/api/v1/cost-periods/2026-09")
        assert closed.status_code == 200, closed.text
        # re-closing an unchanged month finds the same fractions: nothing booked
        again = (await http.put(f"{daily_control_plane}/api/v1/cost-periods/2026-09")).json()
        report = (await http.get(f"{daily_control_plane}/api/v1/cost-periods/2026-09")).json()
    assert (again["recomputes"], again["correctionsBooked"]) == (0, [])
    assert report["coverage"] == 1.0
    # capacity: 1 whole card + 7 × 1/7 = 2 cards, all month (it used to count 1)
    [cluster] = report["clusters"]
    assert cluster["observedGpuMicroseconds"] == 2 * 720 * HOUR_US
    assert report["pool"] == 2 * 720 * RATE == 10_080_000_000
    # busy: 1/7 card for an hour + a whole card for half an hour
    assert report["busy"] == RATE // 7 + RATE // 2 == 4_500_000
    assert report["idle"] == report["pool"] - report["busy"]
    assert cluster["busyGpuMicroseconds"] == round(HOUR_US * 9 / 14)
    used = {a["tenant"]: a["usedGpuMicroseconds"] for a in report["allocations"]}
    assert used == {"acme": round(HOUR_US / 7), "globex": HOUR_US // 2}
    due = {t["tenant"]: t["due"] for t in report["tenants"]}
    # acme's weight is (1/7) / (1/7 + 1/2) = 2/9: 1/7 of the rate for its busy hour, and 2/9
    # of the idle capacity (the six other slices and the whole card, the month round)
    assert due["acme"] == RATE // 7 + report["idle"] * 2 // 9 == 2_240_000_000
    assert due["globex"] == RATE // 2 + report["idle"] * 7 // 9 == 7_840_000_000
    assert sum(due.values()) == report["allocated"] == report["pool"]
    assert report["unallocated"] == 0
    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
        cursor = await conn.execute(
            "SELECT endpoint, gpus_per_replica, share_num, share_den FROM endpoint_placements"
            " ORDER BY endpoint"
        )
        assert await cursor.fetchall() == [(E1, 1, 1, 7), (E2, 1, 1, 7), (E3, 1, 1, 1)]


async def test_rows_from_before_card_shares_keep_meaning_whole_gpus(postgres_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        for migration in available():
            if migration.version < 26:
                await conn.execute(migration.sql.encode())
        await conn.execute("INSERT INTO capacity_samples VALUES ('old', '2026-08-01', 4)")
        await conn.execute(
            "INSERT INTO endpoint_placements (endpoint, cluster_id, gpus_per_replica, first_seen,"
            " last_seen) VALUES ('http://10.0.0.9:8000', 'old', 2, now(), now())"
        )
        (shares,) = [m for m in available() if m.version == 26]
        await conn.execute(shares.sql.encode())
        cursor = await conn.execute("SELECT gpus, slice_num, slice_den FROM capacity_samples")
        assert await cursor.fetchall() == [(4, 0, 1)]
        cursor = await conn.execute(
            "SELECT gpus_per_replica, share_num, share_den FROM endpoint_placements"
        )
        assert await cursor.fetchall() == [(2, 1, 1)]
