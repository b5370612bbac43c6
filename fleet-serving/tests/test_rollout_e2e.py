"""Rollouts and node drains of a model on a real API server: never an outage.

What the operator renders (the Deployment's strategy, the PodDisruptionBudget) only matters to
the real Deployment and disruption controllers and to the eviction API, so these run on the real
server only (:class:`cluster.RealCluster`); the tests play the scheduler and the kubelet, and a
drain is the evictions ``kubectl drain`` would make.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleet_testing.fix_kube import KubeError
from fleet_testing.waiting import eventually

from .cluster import RealCluster
from .conftest import FM, NODES, Sink, StartOperator, fleetmodel, gpu_node

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


async def started(cluster: RealCluster, sink: tuple[Sink, str], start: StartOperator) -> None:
    await cluster.create(NODES, gpu_node("gpu-1"))
    await start(sink[1], "--resync=1s", "--report-interval=30s")


def evict(cluster: RealCluster, pod: dict[str, Any]) -> int:
    """What the eviction API answers for ``pod``, as a drain asks it: 201, or 429 when the
    budget forbids it."""
    name = pod["metadata"]["name"]
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": cluster.namespace},
    }
    try:
        cluster.cluster.create(f"/api/v1/namespaces/{cluster.namespace}/pods/{name}/eviction",
                               eviction)  # fmt: skip
    except KubeError as exc:
        return exc.status
    return 201


def budget(cluster: RealCluster, model: str, **expected: int) -> dict[str, Any] | None:
    """The model's budget status once the disruption controller has counted ``expected``."""
    pdb = cluster.live("poddisruptionbudgets", model) or {}
    status = pdb.get("status") or {}
    observed = status.get("observedGeneration") == (pdb.get("metadata") or {}).get("generation")
    counted = all(status.get(k) == v for k, v in expected.items())
    return status if pdb and observed and counted else None


async def test_a_drain_evicts_one_replica_of_a_model_at_a_time(
    real_cluster: RealCluster, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    cluster = real_cluster
    await started(cluster, sink, start_operator)
    await cluster.create(FM, fleetmodel("qwen", replicas=2))
    await cluster.serve("qwen", ["10.1.0.1", "10.1.0.2"])
    await eventually(lambda: budget(cluster, "qwen", disruptionsAllowed=1), within=30)
    first, second = await cluster.pods("qwen", 2)
    assert evict(cluster, first) == 201
    assert evict(cluster, second) == 429  # the other replica keeps serving

    # A lone replica can still be drained (minAvailable: 1 would block it forever).
    await cluster.create(FM, fleetmodel("solo"))
    await cluster.serve("solo", ["10.1.0.3"])
    await eventually(lambda: budget(cluster, "solo", disruptionsAllowed=1), within=30)
    (solo,) = await cluster.pods("solo", 1)
    assert evict(cluster, solo) == 201


async def test_crash_looping_replicas_never_block_a_drain(
    real_cluster: RealCluster, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    """Both replicas running and never Ready: the budget has none to spare, yet each may go
    (``unhealthyPodEvictionPolicy: AlwaysAllow``; the default would refuse both)."""
    cluster = real_cluster
    await started(cluster, sink, start_operator)
    await cluster.create(FM, fleetmodel("qwen", replicas=2))
    pods = await cluster.pods("qwen", 2)
    for pod, ip in zip(pods, ["10.1.0.1", "10.1.0.2"], strict=True):
        cluster.cluster.run_pod(cluster.namespace, pod["metadata"]["name"], "gpu-1", ip,
                                ready=False)  # fmt: skip
    counted = {"expectedPods": 2, "currentHealthy": 0, "disruptionsAllowed": 0}
    await eventually(lambda: budget(cluster, "qwen", **counted), within=30)
    assert [evict(cluster, pod) for pod in pods] == [201, 201]


async def test_a_lone_gpu_replica_keeps_serving_until_its_successor_is_ready(
    real_cluster: RealCluster, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    """The real Deployment controller surges: with no spare GPU the new pod is Unschedulable,
    the status says so, and the old pod's endpoint stays; once the new pod is Ready it serves."""
    cluster = real_cluster
    await started(cluster, sink, start_operator)
    await cluster.create(FM, fleetmodel("qwen"))
    await cluster.serve("qwen", ["10.1.0.1"])
    await eventually(lambda: cluster.phase_of("qwen", "Ready"), within=30)

    await cluster.patch(f"{FM}/qwen", {"spec": {"engineArgs": ["--max-num-seqs=8"]}})
    pods = await cluster.pods("qwen", 2)  # the controller adds a pod; it removes none
    (new,) = [p for p in pods if not p["spec"].get("nodeName")]
    message = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    status = {"phase": "Pending", "conditions": [unschedulable | {"message": message}]}
    path = f"/api/v1/namespaces/{cluster.namespace}/pods/{new['metadata']['name']}/status"
    cluster.cluster.patch(path, {"status": status})
    shown = await eventually(lambda: cluster.phase_of("qwen", "Scheduling"), within=20)
    assert shown["message"] == message
    assert shown["endpoints"] == ["http://10.1.0.1:8000"]  # the old replica still serves
    (old,) = [p for p in pods if p is not new]
    still = cluster.live("pods", old["metadata"]["name"])
    assert still is not None
    assert "deletionTimestamp" not in still["metadata"]

    # A GPU frees up: the new pod runs, and only then is the old one let go.
    cluster.cluster.run_pod(cluster.namespace, new["metadata"]["name"], "gpu-1", "10.1.0.2")
    serving = ["http://10.1.0.2:8000"]
    await eventually(
        lambda: (s := cluster.phase_of("qwen", "Ready")) and s["endpoints"] == serving, within=30
    )
