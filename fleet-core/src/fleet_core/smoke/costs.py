"""Cost pool: a cost rate round-trips exactly (money is integer micro-units end to end), and
closing a month that is not over is refused with when it can be closed, before anything is
written. Closing a past month is never tried: on a deployment that would be a real close."""

from __future__ import annotations

from datetime import UTC, datetime

from fleet_core.smoke.context import Context
from fleet_core.smoke.http import envelope_ok
from fleet_core.smoke.running import Runner

__all__ = ["AREA", "RATE", "run"]

AREA = "Cost pool"
RATE = 1_234_567
"""Micro-units per GPU-hour: digits a float round trip or a cents column would change."""


async def run(ctx: Context, runner: Runner) -> None:
    admin = ctx.tenants()
    cluster = f"{ctx.run}-rates"
    body = {"cluster": cluster, "gpuHourMicro": RATE, "currency": "USD"}
    made = await admin.call("POST", "/api/v1/cost-rates", body)
    listed = (await admin.call("GET", f"/api/v1/cost-rates?cluster={cluster}")).json()
    rows = listed.get("data", []) if isinstance(listed, dict) else []
    got = [(r.get("cluster"), r.get("gpuHourMicro"), r.get("currency")) for r in rows]
    ok = made.status == 201 and got == [(cluster, RATE, "USD")]
    runner.check(AREA, "a cost rate round-trips exactly", ok, got or made.brief())
    month = datetime.now(UTC).strftime("%Y-%m")
    closing = await admin.call("PUT", f"/api/v1/cost-periods/{month}")
    found = closing.json()
    code = found.get("error", {}).get("code") if isinstance(found, dict) else None
    ok = closing.status == 400 and envelope_ok(closing) and code == "period_not_over"
    runner.check(AREA, f"closing {month} before it is over is refused", ok, closing.brief())
    runner.note(
        AREA,
        "closing an unobserved month answers 400 with its coverage",
        "not tried: it needs a past month with unobserved capacity, and a month that would close "
        "would close for real (tested in fleet-core/tests/costs)",
    )
