"""Rate limiting: a tenant's request ceiling holds, a token ceiling bites before the request
ceiling does (tokens are reserved up front), a refusal says when to retry, a tenant's keys share
its bucket (a second key is no way around the limit), and another tenant is unaffected."""

from __future__ import annotations

import contextlib
from typing import Any

from fleet_core.cli.smoke.context import Context
from fleet_core.cli.smoke.http import Reply
from fleet_core.cli.smoke.limited import RPM, TPM, Limited, limited_gateway
from fleet_core.cli.smoke.running import Runner

__all__ = ["AREA", "run"]

AREA = "Rate limits"


def _body(model: str, max_tokens: int, *, stream: bool = False) -> dict[str, Any]:
    messages = [{"role": "user", "content": "hi"}]
    return {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": stream}


async def _model(ctx: Context, gateway: Limited) -> str:
    listed = (await ctx.http.call("GET", f"{gateway.url}/v1/models", token=gateway.other)).json()
    data = listed.get("data") if isinstance(listed, dict) else None
    return str(data[0]["id"]) if data else "unknown"


async def run(ctx: Context, runner: Runner) -> None:
    gateway = await limited_gateway(ctx)
    model = await _model(ctx, gateway)
    await _request_ceiling(ctx, runner, gateway, model)
    await _token_ceiling(ctx, runner, gateway, model)


async def _chat(ctx: Context, url: str, key: str, body: dict[str, Any]) -> Reply:
    return await ctx.http.call("POST", f"{url}/v1/chat/completions", token=key, body=body)


async def _request_ceiling(ctx: Context, runner: Runner, gateway: Limited, model: str) -> None:
    first, second = gateway.shared
    order = [first] * (RPM - 1) + [second]
    statuses = [(await _chat(ctx, gateway.url, key, _body(model, 4))).status for key in order]
    runner.check(
        AREA, f"{RPM} requests within the ceiling are served", statuses == [200] * RPM, statuses
    )
    refused = await _chat(ctx, gateway.url, second, _body(model, 4))
    shared = refused.status == 429 and "rpm" in refused.text
    runner.check(
        AREA, f"request {RPM + 1}, on the tenant's other key, is refused", shared, refused.brief()
    )
    retry = refused.headers.get("Retry-After", "")
    ok = retry.replace(".", "", 1).isdigit() and float(retry) > 0
    runner.check(AREA, "the refusal carries Retry-After", ok, f"Retry-After: {retry!r}")
    other = await _chat(ctx, gateway.url, gateway.other, _body(model, 4))
    runner.check(AREA, "another tenant is served meanwhile", other.status == 200, other.brief())


async def _token_ceiling(ctx: Context, runner: Runner, gateway: Limited, model: str) -> None:
    """Two requests of ``TPM - 40`` tokens each, the first held open while the second asks: both
    reservations cannot fit, whatever the first one ends up using."""
    big = TPM - 40
    url = f"{gateway.url}/v1/chat/completions"
    holder = ctx.http.lines(url, token=gateway.tokens, body=_body(model, big, stream=True))
    async with contextlib.aclosing(holder):
        status, _ = await anext(holder, (0, ""))
        second = await _chat(ctx, gateway.url, gateway.tokens, _body(model, big))
    ok = status == 200 and second.status == 429 and "tpm" in second.text
    what = "a token ceiling bites before the request ceiling"
    runner.check(AREA, what, ok, f"first {status}, second {second.brief()}")
