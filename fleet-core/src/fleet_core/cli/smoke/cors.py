"""CORS: browsers on this machine (the console, vite's dev server) may call the gateway and the
control plane; a foreign origin may not, or any page a user visits could spend their key."""

from __future__ import annotations

from fleet_core.cli.smoke.context import Context
from fleet_core.cli.smoke.running import Runner

__all__ = ["AREA", "FOREIGN", "LOOPBACK", "run"]

AREA = "CORS"
LOOPBACK = "http://127.0.0.1:5173"
FOREIGN = "https://fleet-smoke.invalid"


async def run(ctx: Context, runner: Runner) -> None:
    for name, url in (
        ("gateway", f"{ctx.gateway}/v1/models"),
        ("control plane", f"{ctx.control_plane}/api/v1/tenants"),
    ):
        allowed = await _preflight(ctx, url, LOOPBACK)
        runner.check(
            AREA,
            f"{name}: a loopback origin is allowed",
            allowed in (LOOPBACK, "*"),
            f"Access-Control-Allow-Origin: {allowed}",
        )
        refused = await _preflight(ctx, url, FOREIGN)
        runner.check(
            AREA,
            f"{name}: a foreign origin is refused",
            refused is None,
            f"Access-Control-Allow-Origin: {refused}",
        )


async def _preflight(ctx: Context, url: str, origin: str) -> str | None:
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "authorization",
    }
    reply = await ctx.http.call("OPTIONS", url, headers=headers)
    return (
        reply.headers.get("Access-Control-Allow-Origin")
        if reply.status
        else f"no answer: {reply.text}"
    )
