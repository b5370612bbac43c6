"""Budgets and ledger: a served request reaches ``/api/v1/usage`` within seconds (the ledger is
what invoices are made from), and a budget rule refuses once spent, naming the rule (so the
tenant knows which limit to raise)."""

from __future__ import annotations

import asyncio
import time

from fleet_core.cli.smoke.context import Context
from fleet_core.cli.smoke.running import Runner

__all__ = ["AREA", "BUDGET", "run"]

AREA = "Budgets"
BUDGET = 60
"""The throwaway rule: 60 tokens_total an hour; each request reserves about 25."""
_USAGE_WITHIN_S = 15.0
_HI = [{"role": "user", "content": "hi"}]


async def run(ctx: Context, runner: Runner) -> None:
    tenant = await ctx.tenant("budget")
    key = tenant.keys[0]
    body = {"model": await ctx.model_name(key), "max_tokens": 20, "messages": _HI}
    url = f"{ctx.gateway}/v1/chat/completions"
    first = await ctx.http.call("POST", url, token=key, body=body)
    runner.check(AREA, "a request of a fresh tenant is served", first.status == 200, first.brief())
    rows = await _usage(ctx, tenant.id)
    what = f"it appears in /api/v1/usage within {_USAGE_WITHIN_S:.0f} s"
    runner.check(AREA, what, rows >= 1, f"{rows} requests")
    rule = await ctx.tenants().rule(
        {"scopeKind": "tenant", "scopeId": tenant.id, "dimension": "tokens_total"}
        | {"limit": BUDGET, "window": "1h"}
    )
    statuses, last = [], first
    for _ in range(8):  # about 25 tokens each: refused by the third or fourth
        last = await ctx.http.call("POST", url, token=key, body=body)
        statuses.append(last.status)
        if last.status != 200:
            break
    named = last.status == 429 and str(rule["id"]) in last.text
    seen = f"{statuses}: {last.text[:120]}"
    runner.check(AREA, "a spent budget rule refuses, naming the rule", named, seen)


async def _usage(ctx: Context, tenant: str) -> int:
    path = f"/api/v1/usage?tenantId={tenant}&groupBy=project"
    deadline = time.monotonic() + _USAGE_WITHIN_S
    while True:
        found = (await ctx.tenants().call("GET", path)).json()
        data = found.get("data") if isinstance(found, dict) else None
        rows = sum(int(r.get("requests", 0)) for r in data or [] if isinstance(r, dict))
        if rows or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.5)
