"""Placement per accelerator: the resource each profile asks for, and compute checked only where
the vendor's labels say it (a cluster without GPU feature discovery still places vLLM)."""

from __future__ import annotations

from typing import Any

import pytest

from fleet_serving import observing, placement, profiles
from fleet_serving.spec import decode_spec

from .conftest import _node, cpu_node, fleetmodel, gpu_node


def plain_gpu_node(name: str, gpus: int = 4) -> dict[str, Any]:
    """The NVIDIA device plugin without GPU feature discovery: a count, no labels."""
    return _node(name, {}, {"nvidia.com/gpu": str(gpus), "cpu": "32"})


def mig_node(name: str, profile: str = "1g.10gb", count: int = 7) -> dict[str, Any]:
    return _node(name, {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                 {f"nvidia.com/mig-{profile}": str(count), "nvidia.com/gpu": "0"})  # fmt: skip


def amd_node(name: str, gpus: int = 8) -> dict[str, Any]:
    return _node(name, {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"},
                 {"amd.com/gpu": str(gpus)})  # fmt: skip


def ascend_node(name: str, chip: str | None = "910B3", npus: int = 8) -> dict[str, Any]:
    labels = {"node.kubernetes.io/npu.chip.name": chip} if chip else {}
    return _node(name, labels, {"huawei.com/Ascend910": str(npus)})


def decide(fields: dict[str, Any], *bodies: dict[str, Any]) -> str | None:
    spec = decode_spec(fleetmodel("m", **fields)["spec"])
    nodes = [observing.observe_node(b) for b in bodies]
    return placement.unplaceable(spec, profiles.check(spec), nodes)


def test_without_gpu_feature_discovery_vllm_is_placed_and_the_skip_is_named() -> None:
    assert decide({}, plain_gpu_node("g1"), cpu_node("c")) is None
    spec = decode_spec(fleetmodel("m")["spec"])
    nodes = [observing.observe_node(b) for b in (plain_gpu_node("g1"), gpu_node("a100"),
                                                  cpu_node("c"))]  # fmt: skip
    assert placement.compute_unchecked(spec, profiles.check(spec), nodes) == ["g1"]


def test_labels_saying_too_old_still_refuse() -> None:
    assert decide({}, gpu_node("v100", major=7, minor=0)) == (
        "no GPU node of compute capability ≥ 7.5, which vllm needs"
    )
    # An unlabelled node beside it is eligible; a labelled old one is not counted.
    assert decide({"gpusPerReplica": 8}, gpu_node("v100", major=7, gpus=8),
                  plain_gpu_node("g1", gpus=4)) == (
        "needs 8 GPUs per replica; the largest eligible node has 4")  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "cluster", "reason"),
    [
        ({"accelerator": {"migProfile": "1g.10gb"}}, [mig_node("h100")], None),
        ({"accelerator": {"migProfile": "3g.40gb"}}, [mig_node("h100"), gpu_node("a100")],
         "needs 1 nvidia.com/mig-3g.40gb per replica; the largest eligible node has 0"),
        ({"accelerator": {"vendor": "amd"}, "gpusPerReplica": 8}, [amd_node("mi300")], None),
        ({"accelerator": {"vendor": "amd"}}, [gpu_node("a100")],
         "needs 1 amd.com/gpu per replica; the largest eligible node has 0"),
        ({"accelerator": {"vendor": "amd"}, "gpusPerReplica": 16}, [amd_node("mi300")],
         "needs 16 amd.com/gpu per replica; the largest eligible node has 8"),
        ({"accelerator": {"vendor": "huawei"}}, [ascend_node("atlas")], None),
        ({"accelerator": {"vendor": "huawei"}}, [ascend_node("atlas", chip=None)], None),
        ({"accelerator": {"vendor": "huawei"}}, [ascend_node("old", chip="910A")],
         "no Ascend node of a chip vllm-ascend supports (910B, 910_93, 310P), by "
         "node.kubernetes.io/npu.chip.name"),
        ({"accelerator": {"vendor": "nvidia"}}, [amd_node("mi300"), ascend_node("atlas")],
         "no GPU node of compute capability ≥ 7.5, which vllm needs"),
    ],
)  # fmt: skip
def test_each_vendor_is_placed_by_its_own_resource(
    fields: dict[str, Any], cluster: list[dict[str, Any]], reason: str | None
) -> None:
    assert decide(fields, *cluster) == reason


def test_nodes_count_every_vendor_resource_from_allocatable() -> None:
    seen = observing.observe_node(_node("mixed", {}, {
        "nvidia.com/mig-1g.10gb": "7", "amd.com/gpu": "2", "huawei.com/Ascend910": "8",
        "nvidia.com/gpu": "0", "cpu": "64", "example.com/fpga": "1"}))  # fmt: skip
    assert seen.devices == {"amd.com/gpu": 2, "huawei.com/Ascend910": 8,
                            "nvidia.com/mig-1g.10gb": 7}  # fmt: skip
