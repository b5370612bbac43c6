"""Can any node ever run one replica? A pure decision over the observed nodes.

``Scheduling`` (no node can ever satisfy the spec, so waiting will not help until the cluster
changes) is kept distinct from ``Pending`` (placed, still starting); this module supplies the
reason for the former. Readiness and cordons are ignored on purpose: they pass, capacity does not.

Each replica asks for its accelerator's extended resource (:mod:`fleet_serving.devices`), counted
from each node's allocatable. Compute is checked where the vendor's labels say it: NVIDIA's GPU
feature discovery (GFD) labels for vLLM's floor, the Ascend chip label for vllm-ascend's chips. A
node without those labels is not refused: compute unknown is not too old, and
:func:`compute_unchecked` says so for the log.
"""

from __future__ import annotations

from collections.abc import Iterable

from fleet_serving import devices
from fleet_serving.observing import ObservedNode
from fleet_serving.profiles import EngineProfile
from fleet_serving.spec import FleetModelSpec

__all__ = ["compute_unchecked", "unplaceable"]

ASCEND_CHIP = "node.kubernetes.io/npu.chip.name"
ASCEND_VLLM_CHIPS = ("910B", "910_93", "310P")
"""Chip names (label prefixes) of the Atlas A2, A3 and 300I series vllm-ascend supports."""


def _selected(nodes: Iterable[ObservedNode], selector: dict[str, str]) -> list[ObservedNode]:
    return [n for n in nodes if all(n.labels.get(k) == v for k, v in selector.items())]


def _offers(node: ObservedNode, resource: str) -> int:
    return node.devices.get(resource, node.gpus if resource == devices.NVIDIA_GPU else 0)


def _compute_ok(
    spec: FleetModelSpec, profile: EngineProfile, node: ObservedNode, resource: str
) -> bool | None:
    """True when the node's labels say its devices can run the engine, False when they say it
    cannot, None when they say nothing (no GFD, no chip label) or nothing is checked."""
    device = devices.device_profile(spec)
    if device.nvidia_compute and profile.min_compute is not None and spec.gpus_per_replica:
        if node.compute is None:
            return None if _offers(node, resource) else False
        return node.compute >= profile.min_compute
    if device.kind == "huawei" and profile.engine == "vllm" and spec.gpus_per_replica:
        chip = node.labels.get(ASCEND_CHIP)
        return None if not chip else chip.startswith(ASCEND_VLLM_CHIPS)
    return True


def _floor_reason(spec: FleetModelSpec, profile: EngineProfile) -> str:
    if devices.device_profile(spec).kind == "huawei":
        chips = ", ".join(ASCEND_VLLM_CHIPS)
        return f"no Ascend node of a chip vllm-ascend supports ({chips}), by {ASCEND_CHIP}"
    major, minor = profile.min_compute or (0, 0)
    return f"no GPU node of compute capability ≥ {major}.{minor}, which {profile.engine} needs"


def unplaceable(
    spec: FleetModelSpec, profile: EngineProfile, nodes: Iterable[ObservedNode]
) -> str | None:
    """Why no node can take a replica of ``spec``, or None when some node can."""
    candidates = _selected(nodes, spec.node_selector)
    if not candidates:
        shown = ",".join(f"{k}={v}" for k, v in sorted(spec.node_selector.items()))
        return f"no node matches nodeSelector {shown}" if shown else "the cluster has no nodes"
    resource = devices.resource_name(spec)
    candidates = [n for n in candidates if _compute_ok(spec, profile, n, resource) is not False]
    if not candidates:
        return _floor_reason(spec, profile)
    wanted = spec.gpus_per_replica
    if wanted:
        largest = max(_offers(n, resource) for n in candidates)
        if largest < wanted:
            what = "GPUs" if resource == devices.NVIDIA_GPU else resource
            return f"needs {wanted} {what} per replica; the largest eligible node has {largest}"
    return None


def compute_unchecked(
    spec: FleetModelSpec, profile: EngineProfile, nodes: Iterable[ObservedNode]
) -> list[str]:
    """The eligible nodes offering the spec's accelerator whose compute is unknown (no GFD or
    chip labels), so the engine's compute check was skipped for them; sorted names."""
    resource = devices.resource_name(spec)
    return sorted(
        n.node.name
        for n in _selected(nodes, spec.node_selector)
        if _offers(n, resource) and _compute_ok(spec, profile, n, resource) is None
    )
