"""Rollouts of a model on a real API server: never an outage.

The Deployment's strategy only matters to the real Deployment controller, so these run on the
real server only (:class:`cluster.RealCluster`); the tests play the scheduler and the kubelet.
"""

from __future__ import annotations

import pytest

from fleet_testing.waiting import eventually

from .cluster import RealCluster
from .conftest import FM, NODES, Sink, StartOperator, fleetmodel, gpu_node

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


async def started(cluster: RealCluster, sink: tuple[Sink, str], start: StartOperator) -> None:
    await cluster.create(NODES, gpu_node("gpu-1"))
    await start(sink[1], "--resync=1s", "--report-interval=30s")


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
