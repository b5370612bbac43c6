"""The operator end to end: a real ``fleet-serving run`` process against kmock, then against a
real API server (``cluster``), over HTTP.

On kmock the tests play the parts of a real cluster the emulator lacks (the Deployment
controller's status, the EndpointSlice controller, the scheduler's pod conditions); on the real
server those controllers are real and the tests play only the scheduler and the kubelet
(:class:`cluster.RealCluster`). Assertions are on the objects and reports that reach the API and
the sink.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fleet_contract import InventoryReport
from fleet_testing.waiting import eventually

from .cluster import Cluster
from .conftest import (
    DEPLOYMENTS,
    FM,
    NODES,
    PDBS,
    PODS,
    Operator,
    Sink,
    StartOperator,
    cpu_node,
    fleetmodel,
    gpu_node,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


async def started(
    cluster: Cluster, sink: tuple[Sink, str], start_operator: StartOperator, *nodes: dict[str, Any]
) -> tuple[Sink, Operator]:
    for node in nodes:
        await cluster.create(NODES, node)
    state, url = sink
    return state, await start_operator(url, "--resync=1s", "--report-interval=30s")


def reported(state: Sink, check: Any) -> InventoryReport | None:
    report = state.latest()
    return report if report is not None and check(report) else None


async def test_a_fleetmodel_becomes_a_deployment_a_service_and_ready(
    cluster: Cluster, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    state, _ = await started(cluster, sink, start_operator, gpu_node("gpu-1"))
    await cluster.create(FM, fleetmodel("qwen"))

    deployment = await eventually(lambda: cluster.live("deployments", "qwen"), within=20)
    service = await eventually(lambda: cluster.live("services", "qwen"), within=20)
    budget = await eventually(lambda: cluster.live("poddisruptionbudgets", "qwen"), within=20)
    fm = cluster.live("fleetmodels", "qwen")
    assert fm is not None
    owner = deployment["metadata"]["ownerReferences"][0]
    assert owner["uid"] == fm["metadata"]["uid"]
    assert owner["kind"] == "FleetModel"
    assert service["metadata"]["ownerReferences"][0]["uid"] == fm["metadata"]["uid"]
    assert budget["metadata"]["ownerReferences"] == deployment["metadata"]["ownerReferences"]
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    # One replica on GPUs: the new pod must be Ready before the old one goes.
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][container["args"].index("--served-model-name") + 1] == "qwen"
    assert container["env"][:1] == [
        {
            "name": "VLLM_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": "fleet-engine-key", "key": "api-key"}},
        }
    ]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert service["spec"]["ports"][0]["port"] == 8000
    await eventually(lambda: cluster.phase_of("qwen", "Pending"), within=20)

    # One pod is ready: the Deployment and EndpointSlice controllers report it.
    await cluster.serve("qwen", ["10.1.2.3"])
    status = await eventually(
        lambda: (s := cluster.phase_of("qwen", "Ready")) and s["endpoints"] and s, within=20
    )
    assert status["readyReplicas"] == 1
    assert status["endpoints"] == ["http://10.1.2.3:8000"]

    # The EndpointSlice and the Deployment's status are two writes, watched in either order: a
    # report between them carries the endpoint while the phase, read from the Deployment, is
    # still Pending. The report that follows both is the one this checks.
    def ready(report: InventoryReport) -> bool:
        return any(d.endpoints and d.phase == "Ready" for d in report.deployments)

    report = await eventually(lambda: reported(state, ready), within=20)
    (model,) = report.deployments
    assert (model.served_model_name, model.engine, model.ready_replicas) == ("qwen", "vllm", 1)
    assert [e.url for e in model.endpoints] == ["http://10.1.2.3:8000"]


async def test_scaling_and_drift_update_the_deployment(
    cluster: Cluster, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    await started(cluster, sink, start_operator, gpu_node("gpu-1"))
    await cluster.create(FM, fleetmodel("qwen"))
    await eventually(lambda: cluster.live("deployments", "qwen"), within=20)

    await cluster.patch(f"{FM}/qwen", {"spec": {"replicas": 3, "engineArgs": ["--max-num-seqs=8"]}})
    scaled = await eventually(
        lambda: (d := cluster.live("deployments", "qwen")) and d["spec"]["replicas"] == 3 and d,
        within=20,
    )
    assert scaled["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "--max-num-seqs=8"
    # Three GPU replicas: one is replaced at a time, needing no spare GPU.
    assert scaled["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}

    # Someone edits an owned object by hand; the resync puts it back.
    drift = {"spec": {"template": {"spec": {"containers": [{"name": "engine", "image": "evil"}]}}}}
    await cluster.patch(f"{DEPLOYMENTS}/qwen", drift)
    restored = await eventually(
        lambda: (
            (d := cluster.live("deployments", "qwen"))
            and d["spec"]["template"]["spec"]["containers"][0]["image"] != "evil"
            and d
        ),
        within=20,
    )
    assert restored["spec"]["template"]["spec"]["containers"][0]["image"].startswith("vllm/")

    # A budget loosened by hand (any number of replicas at once, crash-looping ones protected)
    # is put back too.
    loose = {"spec": {"maxUnavailable": 3, "unhealthyPodEvictionPolicy": "IfHealthyBudget"}}
    loosened = await cluster.patch(f"{PDBS}/qwen", loose)
    assert loosened["spec"]["maxUnavailable"] == 3  # a resync may put it back at any moment
    budget = await eventually(
        lambda: (
            (b := cluster.live("poddisruptionbudgets", "qwen"))
            and b["spec"]["maxUnavailable"] == 1
            and b
        ),
        within=20,
    )
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


async def test_a_field_removed_from_the_spec_is_removed_from_the_deployment(
    cluster: Cluster, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    await started(cluster, sink, start_operator, gpu_node("gpu-1"))
    await cluster.create(FM, fleetmodel("qwen", nodeSelector={"pool": "h100", "zone": "a"}))
    created = await eventually(lambda: cluster.live("deployments", "qwen"), within=20)
    assert created["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "h100", "zone": "a"}

    await cluster.patch(f"{FM}/qwen", {"spec": {"nodeSelector": {"pool": None}}})
    narrowed = await eventually(
        lambda: (
            (d := cluster.live("deployments", "qwen"))
            and d["spec"]["template"]["spec"].get("nodeSelector") == {"zone": "a"}
            and d
        ),
        within=20,
    )
    assert narrowed["spec"]["replicas"] == 1
    await cluster.patch(f"{FM}/qwen", {"spec": {"nodeSelector": None}})
    await eventually(
        lambda: (
            (d := cluster.live("deployments", "qwen"))
            and "nodeSelector" not in d["spec"]["template"]["spec"]
        ),
        within=20,
    )


def resyncs(operator: Operator) -> int:
    """Passes of the operator-wide resync so far."""
    return operator.output().count("Resync of ")


async def test_a_quantity_the_api_server_rewrote_is_not_patched_back(
    cluster: Cluster, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    _, operator = await started(cluster, sink, start_operator, gpu_node("gpu-1"))
    await cluster.create(FM, fleetmodel("qwen", resources={"requests": {"cpu": "0.5"}}))
    created = await eventually(lambda: cluster.live("deployments", "qwen"), within=20)
    if not cluster.real:
        # What a real API server stores for "0.5" is the canonical "500m" (a merge patch replaces
        # the containers list whole, so the whole list is sent).
        containers = created["spec"]["template"]["spec"]["containers"]
        containers[0]["resources"]["requests"]["cpu"] = "500m"
        patch = {"spec": {"template": {"spec": {"containers": containers}}}}
        await cluster.patch(f"{DEPLOYMENTS}/qwen", patch)
    before = resyncs(operator)
    patched = operator.output().count(" patched")
    # Three resync passes (--resync=1s) look at the Deployment, the Service and the
    # PodDisruptionBudget and leave them alone (a real API server omits a false
    # publishNotReadyAddresses: rendering it was a patch a resync).
    await eventually(lambda: resyncs(operator) >= before + 3, within=15)
    assert operator.output().count(" patched") == patched
    container = (cluster.live("deployments", "qwen") or {})["spec"]["template"]["spec"]
    assert container["containers"][0]["resources"]["requests"]["cpu"] == "500m"


async def test_no_fitting_node_is_scheduling_not_pending(
    cluster: Cluster, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    state, _ = await started(
        cluster, sink, start_operator, gpu_node("p100", major=6, minor=0), cpu_node("cpu-1")
    )
    await cluster.create(FM, fleetmodel("qwen"))
    status = await eventually(lambda: cluster.phase_of("qwen", "Scheduling"), within=20)
    assert "compute capability ≥ 7.5" in status["message"]

    await cluster.create(FM, fleetmodel("big", gpusPerReplica=16))
    await cluster.create(NODES, gpu_node("a100", gpus=8))
    too_big = "needs 16 GPUs per replica; the largest eligible node has 8"
    await eventually(
        lambda: (s := cluster.phase_of("big", "Scheduling")) and s["message"] == too_big, within=20
    )
    # The new node fixes the first model: it is placed now, so Pending (starting), not Scheduling.
    await eventually(lambda: cluster.phase_of("qwen", "Pending"), within=20)
    phases = {"big": "Scheduling", "qwen": "Pending"}
    report = await eventually(
        lambda: reported(state, lambda r: {d.name: d.phase for d in r.deployments} == phases),
        within=20,
    )
    assert len(report.nodes) == 3


async def test_an_unschedulable_pod_is_surfaced(
    cluster: Cluster, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    await started(cluster, sink, start_operator, gpu_node("gpu-1"))
    await cluster.create(FM, fleetmodel("qwen"))
    await eventually(lambda: cluster.phase_of("qwen", "Pending"), within=20)
    message = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    pod = await cluster.unschedulable("qwen", message)
    status = await eventually(lambda: cluster.phase_of("qwen", "Scheduling"), within=20)
    assert status["message"] == message
    assert status["reason"] == "Unschedulable"
    await cluster.delete(f"{PODS}/{pod}")
    await eventually(lambda: cluster.phase_of("qwen", "Pending"), within=20)


async def test_wrong_weight_format_fails_with_the_reason(
    cluster: Cluster, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    await started(cluster, sink, start_operator, gpu_node("gpu-1"))
    await cluster.create(FM, fleetmodel("gemma", weightFormat="gguf"))
    status = await eventually(lambda: cluster.phase_of("gemma", "Failed"), within=20)
    assert status["message"] == "vllm serves safetensors; this model is gguf"
    assert cluster.live("deployments", "gemma") is None


async def test_deleting_a_fleetmodel_removes_what_it_made(
    cluster: Cluster, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    state, _ = await started(cluster, sink, start_operator, gpu_node("gpu-1"))
    await cluster.create(FM, fleetmodel("qwen", engine="llamacpp", weightFormat="gguf"))
    await eventually(lambda: cluster.live("services", "qwen"), within=20)
    await eventually(lambda: cluster.live("poddisruptionbudgets", "qwen"), within=20)
    await eventually(lambda: reported(state, lambda r: len(r.deployments) == 1), within=20)

    await cluster.delete(f"{FM}/qwen")
    await eventually(lambda: cluster.live("fleetmodels", "qwen") is None, within=20)
    # A real garbage collector learns a new CRD's kind at its next discovery (every 30 s), so
    # the first cascade of a session can take that long.
    await eventually(lambda: cluster.live("deployments", "qwen") is None, within=60)
    await eventually(lambda: cluster.live("services", "qwen") is None, within=60)
    await eventually(lambda: cluster.live("poddisruptionbudgets", "qwen") is None, within=60)
    await eventually(lambda: reported(state, lambda r: not r.deployments), within=20)


async def test_a_replica_change_reaches_the_report_within_2s(
    cluster: Cluster, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    state, _ = await started(cluster, sink, start_operator, gpu_node("gpu-1"))
    await cluster.create(FM, fleetmodel("qwen", replicas=2))
    await eventually(lambda: cluster.live("deployments", "qwen"), within=20)
    await cluster.serve("qwen", ["10.0.0.1"])
    await eventually(
        lambda: reported(state, lambda r: r.deployments and r.deployments[0].endpoints), within=20
    )

    loop = asyncio.get_running_loop()
    changed_at = loop.time()
    await cluster.serve("qwen", ["10.0.0.1", "10.0.0.2"])

    def two(report: InventoryReport) -> bool:
        return len([e for e in report.deployments[0].endpoints if e.ready]) == 2

    await eventually(lambda: reported(state, two), within=2.0)
    assert loop.time() - changed_at < 2.0


async def test_control_plane_down_is_retried_not_fatal(
    cluster: Cluster, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    state, _ = sink
    state.failures = 3  # the control plane answers 503 three times, then recovers
    operator = (await started(cluster, sink, start_operator, gpu_node("gpu-1"), cpu_node("cpu-1")))[
        1
    ]
    report = await eventually(lambda: reported(state, lambda r: len(r.nodes) == 2), within=20)
    assert state.failures == 0
    assert operator.process.returncode is None
    gpus = {n.name: n.gpus for n in report.nodes}
    assert gpus["cpu-1"] == ()
    (a100,) = gpus["gpu-1"]
    assert (a100.count, a100.compute_capability, a100.memory_mib) == (8, "8.0", 81920)
