"""Authentication: health answers anyone, a valid key is served, and a missing or an unknown key
is a 401 with ``WWW-Authenticate`` (a gateway serving anonymous traffic spends someone's GPUs)."""

from __future__ import annotations

import secrets

from fleet_core.cli.smoke.context import Context
from fleet_core.cli.smoke.http import envelope_ok
from fleet_core.cli.smoke.limited import limited_gateway
from fleet_core.cli.smoke.running import Runner

__all__ = ["AREA", "run"]

AREA = "Auth"


async def run(ctx: Context, runner: Runner) -> None:
    gateway = await limited_gateway(ctx)
    health = await ctx.http.call("GET", f"{gateway.url}/healthz")
    runner.check(AREA, "/healthz answers without a key", health.status == 200, health.brief())
    served = await ctx.http.call("GET", f"{gateway.url}/v1/models", token=gateway.other)
    runner.check(AREA, "a valid key is served", served.status == 200, served.brief())
    unknown = f"fk_smoke_{secrets.token_urlsafe(16)}"
    for what, token in (("a missing key", None), ("an unknown key", unknown)):
        body = {"model": "any", "messages": [{"role": "user", "content": "hi"}]}
        reply = await ctx.http.call(
            "POST", f"{gateway.url}/v1/chat/completions", token=token, body=body
        )
        challenge = reply.headers.get("WWW-Authenticate", "")
        ok = reply.status == 401 and challenge.lower().startswith("bearer") and envelope_ok(reply)
        runner.check(
            AREA,
            f"{what} is a 401 with WWW-Authenticate",
            ok,
            f"{reply.status} WWW-Authenticate: {challenge!r}",
        )
