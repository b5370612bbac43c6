"""AMD and MIG models on a real API server: admitted by server-side apply, each Deployment asking
for its vendor's extended resource, placed on nodes that advertise it, refused where it cannot
run. No GPU is needed: a Node's status.capacity may advertise any extended resource. On kmock: a
vLLM model on a node without GPU feature discovery is placed, and the skipped compute check is
said once, not at every resync.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest
import yaml

from fleet_testing.waiting import eventually

from .cluster import RealCluster
from .conftest import (
    FM,
    KUBECTL,
    NODES,
    KubeApi,
    Sink,
    StartOperator,
    _node,
    fleetmodel,
    live,
    phase_of,
)
from .kube_emulator import FleetKubernetes

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


async def server_side_apply(cluster: RealCluster, obj: dict[str, Any]) -> None:
    """``kubectl apply --server-side``: the CRD's schema and CEL rules are the server's."""
    assert KUBECTL is not None
    obj["metadata"]["namespace"] = cluster.namespace
    process = await asyncio.create_subprocess_exec(
        KUBECTL, f"--kubeconfig={cluster.kubeconfig}", "apply", "--server-side",
        "--validate=strict", "-f", "-", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await process.communicate(yaml.safe_dump(obj).encode())
    assert process.returncode == 0, out.decode()


def engine(cluster: RealCluster, name: str) -> dict[str, Any] | None:
    deployment = cluster.live("deployments", name)
    if deployment is None:
        return None
    return dict(deployment["spec"]["template"]["spec"]["containers"][0])


def status(cluster: RealCluster, name: str, phase: str) -> dict[str, Any] | None:
    got = (cluster.live("fleetmodels", name) or {}).get("status") or {}
    return got if got.get("phase") == phase else None


async def test_amd_and_mig_models_ask_for_their_resources(
    real_cluster: RealCluster, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    cluster = real_cluster
    suffix = secrets.token_hex(3)
    amd = _node(f"mi300-{suffix}", {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"},
                {"amd.com/gpu": "8", "cpu": "96", "memory": "1Ti", "pods": "110"})  # fmt: skip
    mig = _node(f"h100-{suffix}", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                {"nvidia.com/mig-1g.10gb": "7", "cpu": "64", "memory": "512Gi",
                 "pods": "110"})  # fmt: skip
    for node in (amd, mig):
        await cluster.create(NODES, node)
    try:
        await start_operator(sink[1], "--resync=1s", "--report-interval=30s")
        await server_side_apply(cluster, fleetmodel("mi300", accelerator={"vendor": "amd"},
                                                     gpusPerReplica=8))  # fmt: skip
        await server_side_apply(cluster, fleetmodel("slice", accelerator={"migProfile": "1g.10gb"}))
        rocm = await eventually(lambda: engine(cluster, "mi300"), within=60)
        assert rocm["resources"]["limits"]["amd.com/gpu"] == "8"
        assert rocm["resources"]["requests"]["amd.com/gpu"] == "8"
        assert rocm["image"] == "rocm/vllm:rocm7.0.0_vllm_0.11.2_20251210"
        assert rocm["command"] == ["vllm", "serve"]
        cuda = await eventually(lambda: engine(cluster, "slice"), within=60)
        assert cuda["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
        # Placed (each node advertises what its model asks for), so not Scheduling.
        await eventually(lambda: status(cluster, "mi300", "Pending"), within=30)
        await eventually(lambda: status(cluster, "slice", "Pending"), within=30)

        # Twelve AMD GPUs fit on no node; two MIG slices in one process CUDA cannot see.
        await server_side_apply(cluster, fleetmodel("big", accelerator={"vendor": "amd"},
                                                    gpusPerReplica=12))  # fmt: skip
        await server_side_apply(
            cluster, fleetmodel("pair", gpusPerReplica=2, accelerator={"migProfile": "1g.10gb"})
        )
        big = await eventually(lambda: status(cluster, "big", "Scheduling"), within=30)
        assert "needs 12 amd.com/gpu per replica; the largest eligible node has 8" in big["message"]
        pair = await eventually(lambda: status(cluster, "pair", "Failed"), within=30)
        assert "a CUDA process sees one MIG device" in pair["message"]
        assert cluster.live("deployments", "pair") is None

        def reported() -> dict[str, Any] | None:
            report = sink[0].latest()
            got = {d.name: d for d in report.deployments} if report else {}
            return got if {"mi300", "slice"} <= set(got) else None

        deployments = await eventually(reported, within=40)
        assert deployments["mi300"].accelerator == "amd.com/gpu"
        assert deployments["slice"].accelerator == "nvidia.com/mig-1g.10gb"
        share = deployments["slice"].gpu_share
        assert share is not None
        assert (share.numerator, share.denominator) == (1, 7)
    finally:
        for node in (amd, mig):
            cluster.cluster.delete(f"{NODES}/{node['metadata']['name']}")


async def test_without_gpu_feature_discovery_vllm_is_placed_and_the_skip_said_once(
    kube: FleetKubernetes, kube_api: KubeApi, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    await kube_api.create(NODES, _node("plain", {}, {"nvidia.com/gpu": "4", "cpu": "32"}))
    operator = await start_operator(sink[1], "--resync=1s", "--report-interval=30s")
    await kube_api.create(FM, fleetmodel("qwen"))
    deployment = await eventually(lambda: live(kube, "deployments", "qwen"), within=30)
    pod = deployment["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    unlabelled = {"key": "nvidia.com/gpu.compute.major", "operator": "DoesNotExist"}
    assert {"matchExpressions": [unlabelled]} in terms["nodeSelectorTerms"]
    status = await eventually(lambda: phase_of(kube, "qwen", "Pending"), within=30)
    assert status["reason"] != "NoFittingNode"
    said = "compute check skipped on plain"
    await eventually(lambda: said in operator.output(), within=30)
    await asyncio.sleep(3)  # three resyncs
    assert operator.output().count(said) == 1, operator.output()
