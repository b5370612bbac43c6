"""The cost pool's clock is the control plane's: report times, and placements from late reports.

A report's ``observedAt`` decides which month its capacity and placements land in. An operator
credential could date one into a month already closed — a million GPUs in September, then a
re-close, booked hundreds of millions of units to tenants as a correction — so a report inside a
closed period is refused. And a late, older report (the newest one already stored) kept its
capacity sample but lost its placements, leaving its endpoints' requests unplaced.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import httpx
import psycopg

from .conftest import ADMIN, inventory, put_inventory
from .test_period_rules import E1, E2, acme_in_september, close


async def test_a_report_dated_into_a_closed_month_is_refused_and_books_nothing(
    control_plane_url: str, postgres_url: str
) -> None:
    await acme_in_september(control_plane_url, postgres_url, watched_until="2026-10-01T00:00:00Z")
    issued = await close(control_plane_url, "2026-09")
    assert issued.status_code == 200, issued.text
    backdated = inventory("k3s-dev", at="2026-09-15T00:00:00Z", gpus=1_000_000,
                          endpoints={E1: 1, E2: 1})  # fmt: skip
    async with httpx.AsyncClient(headers=ADMIN) as http:
        refused = await http.put(f"{control_plane_url}/api/v1/inventory", json=backdated)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["param"], error["code"]) == ("observedAt", "observed_at_out_of_range")
    assert "closed cost period" in error["message"]
    again = await close(control_plane_url, "2026-09")
    assert again.status_code == 200, again.text
    assert again.json()["correctionsBooked"] == issued.json()["correctionsBooked"]
    assert again.json()["pool"] == issued.json()["pool"]
    with psycopg.connect(postgres_url) as conn:
        (booked,) = conn.execute("SELECT count(*) FROM cost_corrections").fetchone() or (0,)
        (huge,) = conn.execute(
            "SELECT count(*) FROM capacity_samples WHERE gpus = 1000000"
        ).fetchone() or (0,)
    assert (booked, huge) == (0, 0)


async def test_a_late_older_report_still_places_its_endpoints(
    control_plane_url: str, postgres_url: str
) -> None:
    """Migration 0012 promised placements "whatever the arrival order"; the trigger ran only
    when the newest report changed, so the older report's endpoint was never placed."""
    now = datetime.now(UTC).replace(microsecond=0)
    newer, older = now - timedelta(minutes=1), now - timedelta(minutes=10)
    await put_inventory(control_plane_url, inventory("c1", at=newer.isoformat(), gpus=2,
                                                     endpoints={E1: 1}))  # fmt: skip
    await put_inventory(control_plane_url, inventory("c1", at=older.isoformat(), gpus=2,
                                                     endpoints={E1: 1, E2: 1}))  # fmt: skip
    with psycopg.connect(postgres_url) as conn:
        placed = conn.execute(
            "SELECT endpoint, cluster_id, valid_from FROM endpoint_placements ORDER BY endpoint"
        ).fetchall()
        samples = conn.execute(
            "SELECT observed_at FROM capacity_samples WHERE cluster_id = 'c1' ORDER BY 1"
        ).fetchall()
    assert [s[0] for s in samples] == [older, newer]
    assert [(e, c, f) for e, c, f in placed] == [(E1, "c1", older), (E2, "c1", older)]


async def test_a_report_waits_for_a_close_in_progress_and_then_respects_it(
    control_plane_url: str, postgres_url: str
) -> None:
    """A close holds cost_periods in SHARE ROW EXCLUSIVE mode; the report's SHARE lock waits for
    it, so a report dated into the month being closed cannot land beside the close."""
    backdated = inventory("late-dc", at="2026-09-20T00:00:00Z", gpus=8)
    async with await psycopg.AsyncConnection.connect(postgres_url) as closing:
        await closing.execute("LOCK TABLE cost_periods IN SHARE ROW EXCLUSIVE MODE")
        await closing.execute("INSERT INTO cost_periods (period, report) VALUES ('2026-09', '{}')")
        async with httpx.AsyncClient(headers=ADMIN, timeout=30) as http:
            put = asyncio.create_task(
                http.put(f"{control_plane_url}/api/v1/inventory", json=backdated)
            )
            done, _ = await asyncio.wait({put}, timeout=0.5)
            assert not done  # waiting for the close
            await closing.commit()
            response = await put
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "observedAt"
    with psycopg.connect(postgres_url) as conn:
        (samples,) = conn.execute(
            "SELECT count(*) FROM capacity_samples WHERE cluster_id = 'late-dc'"
        ).fetchone() or (0,)
    assert samples == 0
