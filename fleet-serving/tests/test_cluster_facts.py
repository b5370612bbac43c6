"""Nodes, endpoints, placement and status phases: pure decisions over observed objects."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

import fleet_contract
from fleet_serving import observing, placement, profiles, statuses
from fleet_serving.spec import FleetModelStatus, decode_spec
from fleet_serving.view import ClusterView

from .conftest import cpu_node, fleetmodel, gpu_node


def node_with(allocatable: dict[str, str], labels: dict[str, str] | None = None) -> Any:
    return {"metadata": {"name": "n", "labels": labels or {}},
            "status": {"allocatable": allocatable}}  # fmt: skip


def test_a_gpu_node_reports_count_product_memory_and_compute() -> None:
    seen = observing.observe_node(gpu_node("a100", gpus=4, major=8, minor=0))
    (gpu,) = seen.node.gpus
    assert (gpu.vendor, gpu.product, gpu.memory_mib, gpu.count) == (
        "nvidia", "NVIDIA-A100-SXM4-80GB", 81920, 4)  # fmt: skip
    assert gpu.compute_capability == "8.0"
    assert seen.node.ready
    assert seen.node.schedulable
    assert seen.node.labels.zone == "eu-west-1a"
    assert (seen.gpus, seen.compute) == (4, (8, 0))


def test_mig_slices_are_reported_and_a_cpu_node_has_no_gpus() -> None:
    mig = observing.observe_node(node_with({"nvidia.com/mig-1g.10gb": "7", "nvidia.com/gpu": "0"}))
    (gpu,) = mig.node.gpus
    share = fleet_contract.CardShare(numerator=1, denominator=7)
    assert gpu.mig_slices == (fleet_contract.MigSlice(profile="1g.10gb", count=7, share=share),)
    cpu = observing.observe_node(cpu_node("c"))
    assert cpu.node.gpus == ()
    assert cpu.node.labels.instance_type == "c6i.large"
    assert not observing.observe_node(node_with({})).node.ready


def test_a_cordoned_node_is_not_schedulable() -> None:
    node = gpu_node("g") | {"spec": {"unschedulable": True}}
    assert not observing.observe_node(node).node.schedulable


def test_endpoint_slices_become_pod_urls() -> None:
    body = {
        "ports": [{"name": "http", "port": 8000}],
        "endpoints": [
            {"addresses": ["10.0.0.1"], "conditions": {"ready": True}},
            {"addresses": ["fd00::2"], "conditions": {"ready": False}},
        ],
    }
    assert [(e.url, e.ready) for e in observing.slice_endpoints(body)] == [
        ("http://10.0.0.1:8000", True), ("http://[fd00::2]:8000", False)]  # fmt: skip
    assert observing.slice_endpoints({"endpoints": body["endpoints"]}) == ()


def test_unschedulable_pod_message() -> None:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    pod = {"status": {"conditions": [condition | {"message": "no GPUs"}]}}
    assert observing.unschedulable_message(pod) == "no GPUs"
    assert observing.unschedulable_message({"status": {}}) is None


def test_amd_and_ascend_cards_are_counted_with_vendor_and_product() -> None:
    amd = observing.observe_node(
        node_with(
            {"amd.com/gpu": "8", "cpu": "96"},
            {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM", "amd.com/gpu.vram": "192G"},
        )
    )
    ascend = observing.observe_node(
        node_with(
            {"huawei.com/Ascend910": "8", "huawei.com/Ascend910-2c": "4"},
            {"node.kubernetes.io/npu.chip.name": "910B3", "kubernetes.io/arch": "arm64"},
        )
    )
    (mi300,) = amd.node.gpus
    (npu,) = ascend.node.gpus  # vNPU slices are not whole cards
    assert (mi300.vendor, mi300.product, mi300.memory_mib, mi300.count, mi300.resource) == (
        "amd",
        "AMD_Instinct_MI300X_OAM",
        192 * 1024,
        8,
        "amd.com/gpu",
    )
    assert (npu.vendor, npu.product, npu.count, npu.resource) == (
        "huawei",
        "910B3",
        8,
        "huawei.com/Ascend910",
    )
    assert mi300.compute_capability is None
    assert npu.compute_capability is None
    # Neither node offers nvidia.com/gpu; each offers its own resource to its own profile.
    assert (amd.gpus, amd.compute, ascend.gpus) == (0, None, 0)
    assert (amd.devices, ascend.devices) == (
        {"amd.com/gpu": 8},
        {"huawei.com/Ascend910": 8, "huawei.com/Ascend910-2c": 4},
    )
    report = fleet_contract.decode_report(
        fleet_contract.encode_report(
            fleet_contract.InventoryReport(
                schema_version=fleet_contract.SCHEMA_VERSION,
                cluster_id="c",
                observed_at=datetime(2026, 11, 30, tzinfo=UTC),
                reporter_version="t",
                nodes=(amd.node, ascend.node),
            )
        )
    )
    assert [g.vendor for n in report.nodes for g in n.gpus] == ["amd", "huawei"]


def test_time_sliced_gpus_count_as_physical_ones_in_the_report() -> None:
    labels = {"nvidia.com/gpu.replicas": "8", "nvidia.com/gpu.sharing-strategy": "time-slicing",
              "nvidia.com/gpu.product": "NVIDIA-L4"}  # fmt: skip
    seen = observing.observe_node(node_with({"nvidia.com/gpu": "32"}, labels))
    (gpu,) = seen.node.gpus
    assert gpu.count == 4
    assert seen.gpus == 32  # the scheduler still places by the advertised slices


def container(name: str, state: dict[str, Any], last: dict[str, Any] | None = None) -> Any:
    return {"name": name, "state": state, "lastState": last or {}}


@pytest.mark.parametrize(
    ("status", "problem"),
    [
        ({"containerStatuses": [container("engine", {"running": {}})]}, None),
        ({"containerStatuses": [container("engine", {"waiting": {"reason": "ContainerCreating"}})]},
         None),
        ({"containerStatuses": [container("engine", {"waiting": {
            "reason": "CreateContainerConfigError", "message": 'secret "k" not found'}})]},
         ("CreateContainerConfigError",
          'container engine: CreateContainerConfigError: secret "k" not found')),
        ({"initContainerStatuses": [container("fetch-weights", {"running": {}},
                                              {"terminated": {"exitCode": 1, "reason": "Error"}})]},
         ("FetchWeightsFailed", "init container fetch-weights exited with 1: Error")),
        ({"initContainerStatuses": [container("fetch-weights", {"waiting": {
            "reason": "CrashLoopBackOff"}})]},
         ("FetchWeightsFailed",
          "init container fetch-weights: CrashLoopBackOff: CrashLoopBackOff")),
    ],
)  # fmt: skip
def test_why_a_pod_does_not_start(status: dict[str, Any], problem: Any) -> None:
    assert observing.pod_problem({"status": status}) == problem


def test_a_stalled_rollout() -> None:
    condition = {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                 "message": "timed out"}  # fmt: skip
    facts = observing.deployment_facts({"spec": {"replicas": 2},
                                        "status": {"conditions": [condition]}})  # fmt: skip
    assert (facts.desired, facts.ready, facts.stalled) == (2, 0, "timed out")


@pytest.mark.parametrize(
    ("metadata", "status", "rolled_out"),
    [
        ({"generation": 2}, {"observedGeneration": 2, "updatedReplicas": 2, "readyReplicas": 2},
         True),
        ({"generation": 3}, {"observedGeneration": 2, "updatedReplicas": 2, "readyReplicas": 2},
         False),
        ({"generation": 2}, {"observedGeneration": 2, "updatedReplicas": 1, "readyReplicas": 2},
         False),
        # A surging rollout: the new pod is updated (not yet Ready), an old one still serves.
        ({"generation": 2}, {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 2,
                             "readyReplicas": 2}, False),
        ({"generation": 2}, {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2,
                             "readyReplicas": 2}, True),
    ],
)  # fmt: skip
def test_ready_replicas_count_once_the_current_spec_is_rolled_out(
    metadata: dict[str, int], status: dict[str, int], rolled_out: bool
) -> None:
    body = {"metadata": metadata, "spec": {"replicas": 2}, "status": status}
    assert observing.deployment_facts(body).rolled_out is rolled_out


def nodes(*bodies: dict[str, Any]) -> list[observing.ObservedNode]:
    return [observing.observe_node(b) for b in bodies]


@pytest.mark.parametrize(
    ("fields", "cluster", "reason"),
    [
        ({}, [gpu_node("a100")], None),
        ({}, [gpu_node("t4", major=7, minor=5)], None),
        ({}, [gpu_node("v100", major=7, minor=0), cpu_node("c")],
         "no GPU node of compute capability ≥ 7.5, which vllm needs"),
        ({"gpusPerReplica": 16}, [gpu_node("a100", gpus=8)],
         "needs 16 GPUs per replica; the largest eligible node has 8"),
        ({"nodeSelector": {"pool": "h100"}}, [gpu_node("a100")],
         "no node matches nodeSelector pool=h100"),
        ({"engine": "llamacpp", "weightFormat": "gguf", "gpusPerReplica": 0}, [cpu_node("c")],
         None),
        ({"engine": "llamacpp", "weightFormat": "gguf", "gpusPerReplica": 2},
         [gpu_node("p100", gpus=1, major=6)],
         "needs 2 GPUs per replica; the largest eligible node has 1"),
        ({}, [], "the cluster has no nodes"),
    ],
)  # fmt: skip
def test_placement(fields: dict[str, Any], cluster: list[Any], reason: str | None) -> None:
    spec = decode_spec(fleetmodel("m", **fields)["spec"])
    assert placement.unplaceable(spec, profiles.check(spec), nodes(*cluster)) == reason


@pytest.mark.parametrize(
    ("seen", "phase", "reason"),
    [
        (statuses.Observation(generation=1, spec_error="bad"), "Failed", "InvalidSpec"),
        (statuses.Observation(generation=1, unplaceable="no", desired=1), "Scheduling",
         "NoFittingNode"),
        (statuses.Observation(generation=1, unschedulable="no", desired=1), "Scheduling",
         "Unschedulable"),
        (statuses.Observation(generation=1, desired=2, ready=1), "Pending", "Starting"),
        (statuses.Observation(generation=1, desired=1, not_starting=("ImagePullBackOff", "x")),
         "Pending", "ImagePullBackOff"),
        (statuses.Observation(generation=1, blocked=("ForeignObject", "x")), "Failed",
         "ForeignObject"),
        (statuses.Observation(generation=1, desired=2, ready=2), "Ready", "ReplicasReady"),
        (statuses.Observation(generation=1, desired=2, ready=2, rolled_out=False), "Pending",
         "RollingOut"),
        (statuses.Observation(generation=1, desired=1, ready=1, unplaceable="lost a GPU"),
         "Ready", "ReplicasReady"),
    ],
)  # fmt: skip
def test_phases(seen: statuses.Observation, phase: str, reason: str) -> None:
    status = statuses.decide(seen, previous=FleetModelStatus(), now="T1")
    assert (status.phase, status.reason, status.observed_generation) == (phase, reason, 1)


def test_condition_transition_times_hold_while_the_condition_holds() -> None:
    ready = statuses.Observation(generation=1, desired=1, ready=1)
    first = statuses.decide(ready, previous=FleetModelStatus(), now="T1")
    again = statuses.decide(ready, previous=first, now="T2")
    assert again == first  # nothing changed: nothing to write
    lost = statuses.Observation(generation=1, desired=1, ready=0)
    down = statuses.decide(lost, previous=again, now="T3")
    (cond,) = [c for c in down.conditions if c.type == "Ready"]
    assert (cond.status, cond.last_transition_time) == ("False", "T3")


def test_the_view_builds_a_report_that_the_contract_accepts() -> None:
    view = ClusterView()
    view.put_node(gpu_node("gpu-1"), deleted=False)
    view.put_node(cpu_node("cpu-1"), deleted=False)
    fm = fleetmodel("qwen", replicas=2)
    fm["metadata"]["generation"] = 3
    view.put_model(fm, deleted=False)
    bad = fleetmodel("gemma", weightFormat="gguf")
    view.put_model(bad, deleted=False)
    deployment = {"spec": {"replicas": 2}, "status": {"readyReplicas": 1}}
    view.put_deployment(("default", "qwen"), deployment, deleted=False)
    endpoint_slice = {"ports": [{"port": 8000}], "endpoints": [{"addresses": ["10.0.0.9"]}]}
    view.put_slice(("default", "qwen-x"), "qwen", endpoint_slice, deleted=False)
    report = view.report(cluster_id="c1", now=datetime(2026, 11, 30, tzinfo=UTC))
    decoded = fleet_contract.decode_report(fleet_contract.encode_report(report))
    assert decoded == report
    by_name = {d.name: d for d in report.deployments}
    assert by_name["qwen"].phase == "Pending"
    assert by_name["qwen"].ready_replicas == 1
    assert [e.url for e in by_name["qwen"].endpoints] == ["http://10.0.0.9:8000"]
    assert by_name["gemma"].phase == "Failed"
    assert by_name["gemma"].reason == "vllm serves safetensors; this model is gguf"
    assert [n.name for n in report.nodes] == ["cpu-1", "gpu-1"]
    view.put_model(fm, deleted=True)
    assert [d.name for d in view.report(cluster_id="c1", now=report.observed_at).deployments] == [
        "gemma"
    ]


def test_a_model_whose_deployment_is_not_seen_yet_is_pending_not_ready() -> None:
    view = ClusterView()
    view.put_node(gpu_node("gpu-1"), deleted=False)
    view.put_model(fleetmodel("qwen", replicas=2), deleted=False)
    seen = view.observe(("default", "qwen"))
    assert seen is not None
    assert (seen.desired, seen.ready) == (2, 0)
    assert statuses.decide(seen, previous=FleetModelStatus(), now="T").phase == "Pending"


def test_a_node_heartbeat_changes_nothing_and_wakes_no_report() -> None:
    view = ClusterView()
    node = gpu_node("gpu-1")
    assert view.put_node(node, deleted=False)
    view.changed.clear()
    heartbeat = node | {"status": node["status"] | {"daemonEndpoints": {"kubeletEndpoint": {}}}}
    assert not view.put_node(heartbeat, deleted=False)
    assert not view.changed.is_set()
    assert view.put_node(gpu_node("gpu-1", gpus=4), deleted=False)
    assert view.changed.is_set()
