"""Cost pool: a cost rate round-trips exactly (money is integer micro-units end to end); closing
the current month is refused with when it can be closed; closing a month nobody observed is
refused with its coverage (a report over unwatched capacity would bill guesses). Nothing is
closed: the current month is not over, and the unobserved one is asked with ``minCoverage=1``."""

from __future__ import annotations

from datetime import UTC, datetime

from fleet_core.cli.smoke.context import Context
from fleet_core.cli.smoke.http import envelope_ok
from fleet_core.cli.smoke.running import Runner

__all__ = ["AREA", "RATE", "UNOBSERVED", "run"]

AREA = "Cost pool"
UNOBSERVED = "2000-01"
"""A month before any fleet: closing it with ``minCoverage=1`` can only be refused."""
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
    await _unobserved(ctx, runner)


async def _unobserved(ctx: Context, runner: Runner) -> None:
    """Closing a month before any fleet existed, demanding full coverage: it can only be refused
    (nothing observed it), so the call is safe on a deployment."""
    what = f"closing {UNOBSERVED} (nobody observed it) is a 400 with the coverage"
    if (await ctx.tenants().call("GET", f"/api/v1/cost-periods/{UNOBSERVED}")).status != 404:
        runner.note(AREA, what, f"{UNOBSERVED} is closed here already: not closed again")
        return
    path = f"/api/v1/cost-periods/{UNOBSERVED}?minCoverage=1"
    refused = await ctx.tenants().call("PUT", path)
    found = refused.json()
    error = found.get("error", {}) if isinstance(found, dict) else {}
    ok = refused.status == 400 and error.get("code") == "insufficient_coverage"
    ok = ok and "observed" in str(error.get("message")) and "%" in str(error.get("message"))
    runner.check(AREA, what, ok, refused.brief())
