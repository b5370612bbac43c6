"""Operator inventory: the control plane recomputes every count from the node list (a report's
own totals are never trusted), and keeps ``Scheduling`` with its reason apart from ``Pending``
(the one is "no node can take it, and why", the other "not started yet").

Clusters an operator reported are checked against their own node lists. With an operator
credential for a throwaway cluster, it also PUTs a report of its own (with a bogus
``totalGpus`` the control plane must ignore), reads it back, and decommissions the cluster. The
cluster gets a zero cost rate in the fleet's currency first, so its few seconds of capacity never
stand in the way of closing a month.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fleet_core.cli.smoke.context import Context
from fleet_core.cli.smoke.running import Runner

__all__ = ["AREA", "EXPECTED", "report", "run"]

AREA = "Inventory"
SCHEDULING_REASON = "vllm needs a GPU of compute capability 7.5 or better; node smoke-old has 6.1"
EXPECTED = {
    "nodes": 2,
    "readyNodes": 1,
    "gpus": 3,
    "gpusOnReadyNodes": 2,
    "deploymentsByPhase": {"Scheduling": 1, "Pending": 1},
}


def _deployment(name: str, phase: str, reason: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": "smoke",
        "servedModelName": name,
        "engine": "vllm",
        "weightFormat": "safetensors",
        "gpusPerReplica": 1,
        "desiredReplicas": 1,
        "readyReplicas": 0,
        "phase": phase,
        "reason": reason,
    }


def report(cluster: str) -> dict[str, Any]:
    new = {
        "vendor": "nvidia",
        "product": "smoke-A100",
        "memoryMib": 40960,
        "count": 2,
        "computeCapability": "8.0",
    }
    old = {
        "vendor": "nvidia",
        "product": "smoke-P100",
        "memoryMib": 16384,
        "count": 1,
        "computeCapability": "6.1",
    }
    return {
        "schemaVersion": 1,
        "clusterId": cluster,
        "observedAt": datetime.now(UTC).isoformat(),
        "reporterVersion": "fleet-smoke",
        "reportIntervalSeconds": 60,
        "totalGpus": 999,
        "nodes": [
            {"name": "smoke-new", "ready": True, "schedulable": True, "gpus": [new]},
            {"name": "smoke-old", "ready": False, "schedulable": True, "gpus": [old]},
        ],
        "deployments": [
            _deployment("smoke-held", "Scheduling", SCHEDULING_REASON),
            _deployment("smoke-waiting", "Pending", ""),
        ],
    }


async def run(ctx: Context, runner: Runner) -> None:
    admin = ctx.tenants()
    cluster = f"{ctx.run}-cluster"
    await _zero_rate(ctx, cluster)
    issued = await admin.expect(
        "POST",
        "/api/v1/credentials",
        {"role": "operator", "label": "fleet smoke", "clusterId": cluster},
    )
    binding = f"/api/v1/clusters/{cluster}/binding"
    try:
        unbound = await ctx.http.call(
            "PUT",
            f"{ctx.control_plane}/api/v1/inventory",
            token=str(issued["secret"]),
            body=report(cluster),
        )
        refused = unbound.status == 403
        runner.check(AREA, "an unbound cluster's report is refused", refused, unbound.brief())
        models = [d["servedModelName"] for d in report(cluster)["deployments"]]
        await admin.expect("PUT", binding, {"servedModels": models, "endpoints": []})
        put = await ctx.http.call(
            "PUT",
            f"{ctx.control_plane}/api/v1/inventory",
            token=str(issued["secret"]),
            body=report(cluster),
        )
        summary = put.json() if put.status == 200 else None
        got = {k: summary.get(k) for k in EXPECTED} if isinstance(summary, dict) else put.brief()
        runner.check(AREA, "counts are recomputed from the node list", got == EXPECTED, got)
        await _phases(ctx, runner, cluster)
        await _reported(ctx, runner)
    finally:
        await admin.call("DELETE", binding)
        await admin.call("DELETE", f"/api/v1/clusters/{cluster}")
        await admin.call("DELETE", f"/api/v1/credentials/{issued['id']}")


async def _reported(ctx: Context, runner: Runner) -> None:
    """Clusters an operator reported: their summaries against the counts of their own nodes."""
    listed = (await ctx.tenants().call("GET", "/api/v1/inventory")).json()
    data = listed.get("data", []) if isinstance(listed, dict) else []
    for summary in data:
        cluster = str(summary.get("clusterId"))
        if cluster.startswith("smoke-"):
            continue
        found = (await ctx.tenants().call("GET", f"/api/v1/clusters/{cluster}")).json()
        nodes = found.get("report", {}).get("nodes", []) if isinstance(found, dict) else []
        gpus = sum(g.get("count", 0) for n in nodes for g in n.get("gpus", []))
        got = (summary.get("nodes"), summary.get("gpus"))
        what = f"cluster {cluster}: counts match its node list"
        runner.check(
            AREA, what, got == (len(nodes), gpus), f"summary {got}, nodes {len(nodes)}, gpus {gpus}"
        )


async def _phases(ctx: Context, runner: Runner, cluster: str) -> None:
    found = (await ctx.tenants().call("GET", f"/api/v1/clusters/{cluster}")).json()
    deployments = (
        (found or {}).get("report", {}).get("deployments", []) if isinstance(found, dict) else []
    )
    by_name = {d.get("name"): d for d in deployments if isinstance(d, dict)}
    held, waiting = by_name.get("smoke-held", {}), by_name.get("smoke-waiting", {})
    ok = held.get("phase") == "Scheduling" and held.get("reason") == SCHEDULING_REASON
    runner.check(
        AREA, "Scheduling keeps its reason", ok, f"{held.get('phase')}: {held.get('reason')}"
    )
    runner.check(
        AREA,
        "Pending stays Pending, apart from Scheduling",
        waiting.get("phase") == "Pending",
        waiting.get("phase"),
    )


async def _zero_rate(ctx: Context, cluster: str) -> None:
    rates = (await ctx.tenants().call("GET", "/api/v1/cost-rates")).json()
    data = rates.get("data") if isinstance(rates, dict) else None
    currency = str(data[0]["currency"]) if data else "USD"
    body = {"cluster": cluster, "gpuHourMicro": 0, "currency": currency}
    await ctx.tenants().expect("POST", "/api/v1/cost-rates", body)
