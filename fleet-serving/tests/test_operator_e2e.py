"""The operator end to end: a real ``fleet-serving run`` process against kmock over HTTP.

The tests play the parts of a real cluster the emulator lacks (the Deployment controller's
status, the EndpointSlice controller, the scheduler's pod conditions) by writing those objects
through the API, and assert on the objects and reports that reach the API and the sink.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fleet_contract import InventoryReport

from .conftest import (
    DEPLOYMENTS,
    FM,
    NODES,
    PODS,
    SLICES,
    Api,
    Operator,
    Sink,
    StartOperator,
    cpu_node,
    eventually,
    fleetmodel,
    gpu_node,
)
from .kube_emulator import FleetKubernetes

pytestmark = pytest.mark.timeout(60)


def live(kube: FleetKubernetes, plural: str, name: str) -> dict[str, Any] | None:
    for (resource, _ns, obj_name), obj in kube.objects.items():
        if obj_name == name and resource.plural == plural and not obj.deleted:
            return dict(obj.raw)
    return None


def phase_of(kube: FleetKubernetes, name: str, phase: str) -> dict[str, Any] | None:
    obj = live(kube, "fleetmodels", name)
    status = (obj or {}).get("status") or {}
    return status if status.get("phase") == phase else None


def endpoint_slice(model: str, *ips: str, ready: bool = True) -> dict[str, Any]:
    """What the EndpointSlice controller writes for the model's Service (labels mirrored)."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{model}-abcde",
            "namespace": "default",
            "labels": {
                "kubernetes.io/service-name": model,
                "app.kubernetes.io/managed-by": "fleet-serving",
                "serving.fleet.dev/model": model,
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": ready}} for ip in ips],
    }


async def started(
    api: Api, sink: tuple[Sink, str], start_operator: StartOperator, *nodes: dict[str, Any]
) -> tuple[Sink, Operator]:
    for node in nodes:
        await api.create(NODES, node)
    state, url = sink
    return state, await start_operator(url, "--resync=1s", "--report-interval=30s")


def reported(state: Sink, check: Any) -> InventoryReport | None:
    report = state.latest()
    return report if report is not None and check(report) else None


async def test_a_fleetmodel_becomes_a_deployment_a_service_and_ready(
    kube: FleetKubernetes, api: Api, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    state, _ = await started(api, sink, start_operator, gpu_node("gpu-1"))
    await api.create(FM, fleetmodel("qwen"))

    deployment = await eventually(lambda: live(kube, "deployments", "qwen"))
    service = await eventually(lambda: live(kube, "services", "qwen"))
    fm = live(kube, "fleetmodels", "qwen")
    assert fm is not None
    owner = deployment["metadata"]["ownerReferences"][0]
    assert owner["uid"] == fm["metadata"]["uid"]
    assert owner["kind"] == "FleetModel"
    assert service["metadata"]["ownerReferences"][0]["uid"] == fm["metadata"]["uid"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][container["args"].index("--served-model-name") + 1] == "qwen"
    assert container["env"] == [
        {
            "name": "VLLM_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": "qwen-api-key", "key": "api-key"}},
        }
    ]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert service["spec"]["ports"][0]["port"] == 8000
    await eventually(lambda: phase_of(kube, "qwen", "Pending"))

    # The Deployment controller and the EndpointSlice controller report one ready pod.
    await api.patch(f"{DEPLOYMENTS}/qwen/status", {"status": {"readyReplicas": 1}})
    await api.create(SLICES, endpoint_slice("qwen", "10.1.2.3"))
    status = await eventually(
        lambda: (s := phase_of(kube, "qwen", "Ready")) and s["endpoints"] and s
    )
    assert status["readyReplicas"] == 1
    assert status["endpoints"] == ["http://10.1.2.3:8000"]
    report = await eventually(
        lambda: reported(state, lambda r: r.deployments and r.deployments[0].endpoints)
    )
    (model,) = report.deployments
    assert model.phase == "Ready"
    assert (model.served_model_name, model.engine, model.ready_replicas) == ("qwen", "vllm", 1)
    assert [e.url for e in model.endpoints] == ["http://10.1.2.3:8000"]


async def test_scaling_and_drift_update_the_deployment(
    kube: FleetKubernetes, api: Api, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    await started(api, sink, start_operator, gpu_node("gpu-1"))
    await api.create(FM, fleetmodel("qwen"))
    await eventually(lambda: live(kube, "deployments", "qwen"))

    await api.patch(f"{FM}/qwen", {"spec": {"replicas": 3, "engineArgs": ["--max-num-seqs=8"]}})
    scaled = await eventually(
        lambda: (d := live(kube, "deployments", "qwen")) and d["spec"]["replicas"] == 3 and d
    )
    assert scaled["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "--max-num-seqs=8"

    # Someone edits an owned object by hand; the resync puts it back.
    drift = {"spec": {"template": {"spec": {"containers": [{"name": "engine", "image": "evil"}]}}}}
    await api.patch(f"{DEPLOYMENTS}/qwen", drift)
    restored = await eventually(
        lambda: (
            (d := live(kube, "deployments", "qwen"))
            and d["spec"]["template"]["spec"]["containers"][0]["image"] != "evil"
            and d
        )
    )
    assert restored["spec"]["template"]["spec"]["containers"][0]["image"].startswith("vllm/")


async def test_a_field_removed_from_the_spec_is_removed_from_the_deployment(
    kube: FleetKubernetes, api: Api, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    await started(api, sink, start_operator, gpu_node("gpu-1"))
    await api.create(FM, fleetmodel("qwen", nodeSelector={"pool": "h100", "zone": "a"}))
    created = await eventually(lambda: live(kube, "deployments", "qwen"))
    assert created["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "h100", "zone": "a"}

    await api.patch(f"{FM}/qwen", {"spec": {"nodeSelector": {"pool": None}}})
    narrowed = await eventually(
        lambda: (
            (d := live(kube, "deployments", "qwen"))
            and d["spec"]["template"]["spec"].get("nodeSelector") == {"zone": "a"}
            and d
        )
    )
    assert narrowed["spec"]["replicas"] == 1
    await api.patch(f"{FM}/qwen", {"spec": {"nodeSelector": None}})
    await eventually(
        lambda: (
            (d := live(kube, "deployments", "qwen"))
            and "nodeSelector" not in d["spec"]["template"]["spec"]
        )
    )


def requests_to(kube: FleetKubernetes, method: str, path: str) -> int:
    return sum(1 for r in kube if r.method.value == method and r.url.path == path)


async def test_a_quantity_the_api_server_rewrote_is_not_patched_back(
    kube: FleetKubernetes, api: Api, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    await started(api, sink, start_operator, gpu_node("gpu-1"))
    await api.create(FM, fleetmodel("qwen", resources={"requests": {"cpu": "0.5"}}))
    created = await eventually(lambda: live(kube, "deployments", "qwen"))
    # What a real API server stores for "0.5" is the canonical "500m" (a merge patch replaces the
    # containers list whole, so the whole list is sent).
    containers = created["spec"]["template"]["spec"]["containers"]
    containers[0]["resources"]["requests"]["cpu"] = "500m"
    path = f"{DEPLOYMENTS}/qwen"
    await api.patch(path, {"spec": {"template": {"spec": {"containers": containers}}}})
    gets, patches = requests_to(kube, "GET", path), requests_to(kube, "PATCH", path)
    # Three resyncs (--resync=1s) look at the Deployment and leave it alone.
    await eventually(lambda: requests_to(kube, "GET", path) >= gets + 3, within=10)
    assert requests_to(kube, "PATCH", path) == patches
    container = (live(kube, "deployments", "qwen") or {})["spec"]["template"]["spec"]
    assert container["containers"][0]["resources"]["requests"]["cpu"] == "500m"


async def test_no_fitting_node_is_scheduling_not_pending(
    kube: FleetKubernetes, api: Api, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    state, _ = await started(
        api, sink, start_operator, gpu_node("p100", major=6, minor=0), cpu_node("cpu-1")
    )
    await api.create(FM, fleetmodel("qwen"))
    status = await eventually(lambda: phase_of(kube, "qwen", "Scheduling"))
    assert "compute capability ≥ 7.5" in status["message"]

    await api.create(FM, fleetmodel("big", gpusPerReplica=16))
    await api.create(NODES, gpu_node("a100", gpus=8))
    too_big = "needs 16 GPUs per replica; the largest eligible node has 8"
    await eventually(lambda: (s := phase_of(kube, "big", "Scheduling")) and s["message"] == too_big)
    # The new node fixes the first model: it is placed now, so Pending (starting), not Scheduling.
    await eventually(lambda: phase_of(kube, "qwen", "Pending"))
    phases = {"big": "Scheduling", "qwen": "Pending"}
    report = await eventually(
        lambda: reported(state, lambda r: {d.name: d.phase for d in r.deployments} == phases)
    )
    assert len(report.nodes) == 3


async def test_an_unschedulable_pod_is_surfaced(
    kube: FleetKubernetes, api: Api, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    await started(api, sink, start_operator, gpu_node("gpu-1"))
    await api.create(FM, fleetmodel("qwen"))
    await eventually(lambda: phase_of(kube, "qwen", "Pending"))
    message = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "qwen-7d9f-x1",
            "namespace": "default",
            "labels": {
                "app.kubernetes.io/managed-by": "fleet-serving",
                "serving.fleet.dev/model": "qwen",
            },
        },
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                }
            ],
        },
    }
    await api.create(PODS, pod)
    status = await eventually(lambda: phase_of(kube, "qwen", "Scheduling"))
    assert status["message"] == message
    assert status["reason"] == "Unschedulable"
    await api.delete(f"{PODS}/qwen-7d9f-x1")
    await eventually(lambda: phase_of(kube, "qwen", "Pending"))


async def test_wrong_weight_format_fails_with_the_reason(
    kube: FleetKubernetes, api: Api, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    await started(api, sink, start_operator, gpu_node("gpu-1"))
    await api.create(FM, fleetmodel("gemma", weightFormat="gguf"))
    status = await eventually(lambda: phase_of(kube, "gemma", "Failed"))
    assert status["message"] == "vllm serves safetensors; this model is gguf"
    assert live(kube, "deployments", "gemma") is None


async def test_deleting_a_fleetmodel_removes_what_it_made(
    kube: FleetKubernetes, api: Api, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    state, _ = await started(api, sink, start_operator, gpu_node("gpu-1"))
    await api.create(FM, fleetmodel("qwen", engine="llamacpp", weightFormat="gguf"))
    await eventually(lambda: live(kube, "services", "qwen"))
    await eventually(lambda: reported(state, lambda r: len(r.deployments) == 1))

    await api.delete(f"{FM}/qwen")
    await eventually(lambda: live(kube, "fleetmodels", "qwen") is None)
    await eventually(lambda: live(kube, "deployments", "qwen") is None)
    await eventually(lambda: live(kube, "services", "qwen") is None)
    await eventually(lambda: reported(state, lambda r: not r.deployments))


async def test_a_replica_change_reaches_the_report_within_2s(
    kube: FleetKubernetes, api: Api, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    state, _ = await started(api, sink, start_operator, gpu_node("gpu-1"))
    await api.create(FM, fleetmodel("qwen", replicas=2))
    await api.create(SLICES, endpoint_slice("qwen", "10.0.0.1"))
    await eventually(
        lambda: reported(state, lambda r: r.deployments and r.deployments[0].endpoints)
    )

    loop = asyncio.get_running_loop()
    changed_at = loop.time()
    await api.patch(f"{SLICES}/qwen-abcde", endpoint_slice("qwen", "10.0.0.1", "10.0.0.2"))

    def two(report: InventoryReport) -> bool:
        return len([e for e in report.deployments[0].endpoints if e.ready]) == 2

    await eventually(lambda: reported(state, two), within=2.0)
    assert loop.time() - changed_at < 2.0


async def test_control_plane_down_is_retried_not_fatal(
    kube: FleetKubernetes, api: Api, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    state, _ = sink
    state.failures = 3  # the control plane answers 503 three times, then recovers
    operator = (await started(api, sink, start_operator, gpu_node("gpu-1"), cpu_node("cpu-1")))[1]
    report = await eventually(lambda: reported(state, lambda r: len(r.nodes) == 2))
    assert state.failures == 0
    assert operator.process.returncode is None
    gpus = {n.name: n.gpus for n in report.nodes}
    assert gpus["cpu-1"] == ()
    (a100,) = gpus["gpu-1"]
    assert (a100.count, a100.compute_capability, a100.memory_mib) == (8, "8.0", 81920)
