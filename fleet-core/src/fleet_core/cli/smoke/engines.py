"""Engine profiles: vLLM refuses a node below compute capability 7.5 and llama.cpp does not, and
what the gateway publishes about each engine's load signals.

The compute-capability rule lives in the operator (fleet-serving's profiles); over HTTP it is only
visible in what an operator reported: a vLLM deployment held in ``Scheduling`` for compute
capability, next to llama.cpp ones that run. Without such a report it says so. Load signals are
checked only where the gateway publishes them (``fleet_endpoint_*`` series); until then, a note.
"""

from __future__ import annotations

from typing import Any

from fleet_core.cli.smoke.context import Context
from fleet_core.cli.smoke.metrics import samples
from fleet_core.cli.smoke.running import Runner

__all__ = ["AREA", "SIGNALS", "run"]

AREA = "Engine profiles"
SIGNALS = (
    "fleet_endpoint_kv_usage_ratio",
    "fleet_endpoint_queue_depth",
    "fleet_endpoint_kv_capacity_tokens",
)


async def run(ctx: Context, runner: Runner) -> None:
    await _compute(ctx, runner)
    await _signals(ctx, runner)


async def _compute(ctx: Context, runner: Runner) -> None:
    listed = (await ctx.tenants().call("GET", "/api/v1/inventory")).json()
    clusters = (
        [c.get("clusterId") for c in (listed or {}).get("data", [])]
        if isinstance(listed, dict)
        else []
    )
    held: list[dict[str, Any]] = []
    for cluster in clusters:
        if str(cluster).startswith("smoke-"):
            continue  # a run's own report proves nothing about the operator
        found = (await ctx.tenants().call("GET", f"/api/v1/clusters/{cluster}")).json()
        deployments = (
            found.get("report", {}).get("deployments", []) if isinstance(found, dict) else []
        )
        held += [
            d
            for d in deployments
            if d.get("engine") == "vllm"
            and d.get("phase") == "Scheduling"
            and "compute capability" in str(d.get("reason"))
        ]
    if not held:
        runner.note(
            AREA,
            "vLLM refuses compute capability below 7.5",
            "no operator has reported a vLLM deployment held for it "
            "(the rule is fleet-serving's, tested there)",
        )
        return
    runner.check(AREA, "vLLM refuses compute capability below 7.5", True, held[0].get("reason"))


async def _signals(ctx: Context, runner: Runner) -> None:
    token = ctx.metrics_token or ctx.admin
    reply = await ctx.http.call("GET", f"{ctx.gateway}/metrics", token=token)
    if reply.status != 200:
        runner.note(
            AREA, "load signals per engine", f"cannot read the gateway's /metrics ({reply.status})"
        )
        return
    found = [s for s in samples(reply.text) if s.name in SIGNALS]
    if not found:
        runner.note(
            AREA,
            "load signals per engine",
            "not yet published by this gateway "
            "(no fleet_endpoint_kv_usage_ratio / _queue_depth series)",
        )
        return
    bad = [
        f"{s.name}={s.value}"
        for s in found
        if s.value < 0 or (s.name.endswith("_ratio") and s.value > 1)
    ]
    runner.check(
        AREA, "published load signals are in range", not bad, bad or f"{len(found)} series"
    )
