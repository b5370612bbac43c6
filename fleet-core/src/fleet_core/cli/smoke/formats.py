"""Weight formats: a safetensors and a GGUF repository from the synthetic hub, pulled side by
side; each fits its own engine (vLLM: safetensors, llama.cpp: GGUF) and is refused by the other's,
with the reason in the message (a FleetModel pairing the wrong ones would crash-loop instead).

Needs a control plane pulling from the synthetic hub, named by ``--hub`` (``make smoke`` passes
``make dev``'s); without it, or against a deployment pulling from the real hub, it says so and
checks nothing. The models are registered under
the run's own ids and deleted afterwards.
"""

from __future__ import annotations

import asyncio
import time

from fleet_core.cli.smoke.context import Context
from fleet_core.cli.smoke.running import Runner

__all__ = ["AREA", "REPOS", "run"]

AREA = "Weight formats"
REPOS = {"safetensors": ("fleet/tiny-safetensors", "vllm"), "gguf": ("fleet/tiny-gguf", "llamacpp")}
_READY_WITHIN_S = 90.0


async def run(ctx: Context, runner: Runner) -> None:
    admin = ctx.tenants()
    if ctx.hub is None:
        runner.note(AREA, "the synthetic hub's repositories", "no --hub given: skipped")
        return
    hub = await ctx.http.call("GET", f"{ctx.hub}/api/models/fleet/tiny-gguf")
    if hub.status != 200:
        runner.note(
            AREA,
            "the synthetic hub's repositories",
            f"not served at --hub {ctx.hub} ({hub.status}): skipped",
        )
        return
    made = []
    try:
        for fmt, (repo, _) in REPOS.items():
            body = {
                "id": f"{ctx.run}-{fmt}",
                "source": {"huggingface": {"repo": repo}},
                "format": fmt,
            }
            await admin.expect("POST", "/api/v1/models", body)
            made.append(str(body["id"]))
            await admin.expect("POST", f"/api/v1/models/{body['id']}/pull")
        for model_id, (fmt, (_, engine)) in zip(made, REPOS.items(), strict=True):
            status = await _ready(ctx, model_id)
            if runner.check(AREA, f"a {fmt} repository pulls to Ready", status == "Ready", status):
                await _fits(ctx, runner, model_id, fmt, engine)
    finally:
        for model_id in made:
            await admin.call("DELETE", f"/api/v1/models/{model_id}")


async def _ready(ctx: Context, model_id: str) -> str:
    deadline = time.monotonic() + _READY_WITHIN_S
    while True:
        found = (await ctx.tenants().call("GET", f"/api/v1/models/{model_id}")).json()
        status = str(found.get("status")) if isinstance(found, dict) else "unknown"
        if status in ("Ready", "Failed", "Cancelled") or time.monotonic() > deadline:
            reason = found.get("reason") if isinstance(found, dict) else ""
            return status if status == "Ready" else f"{status}: {reason}"
        await asyncio.sleep(0.3)


async def _fits(ctx: Context, runner: Runner, model_id: str, fmt: str, engine: str) -> None:
    other = "llamacpp" if engine == "vllm" else "vllm"
    own = await ctx.tenants().call("GET", f"/api/v1/models/{model_id}/fit?engine={engine}")
    fits = own.json()
    ok = own.status == 200 and isinstance(fits, dict) and fits.get("fits") is True
    runner.check(AREA, f"{fmt} weights fit {engine}", ok, own.brief())
    refused = await ctx.tenants().call("GET", f"/api/v1/models/{model_id}/fit?engine={other}")
    ok = refused.status == 409 and fmt in refused.text and "engine_mismatch" in refused.text
    runner.check(
        AREA, f"{fmt} weights are refused by {other}, with the reason", ok, refused.brief()
    )
