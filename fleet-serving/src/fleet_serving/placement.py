"""Can any node ever run one replica? A pure decision over the observed nodes.

``Scheduling`` (no node can ever satisfy the spec, so waiting will not help until the cluster
changes) is kept distinct from ``Pending`` (placed, still starting); this module supplies the
reason for the former. Readiness and cordons are ignored on purpose: they pass, capacity does not.
"""

from __future__ import annotations

from collections.abc import Iterable

from fleet_serving.observing import ObservedNode
from fleet_serving.profiles import EngineProfile
from fleet_serving.spec import FleetModelSpec

__all__ = ["unplaceable"]


def _selected(nodes: Iterable[ObservedNode], selector: dict[str, str]) -> list[ObservedNode]:
    return [n for n in nodes if all(n.labels.get(k) == v for k, v in selector.items())]


def unplaceable(
    spec: FleetModelSpec, profile: EngineProfile, nodes: Iterable[ObservedNode]
) -> str | None:
    """Why no node can take a replica of ``spec``, or None when some node can."""
    candidates = _selected(nodes, spec.node_selector)
    if not candidates:
        shown = ",".join(f"{k}={v}" for k, v in sorted(spec.node_selector.items()))
        return f"no node matches nodeSelector {shown}" if shown else "the cluster has no nodes"
    if profile.min_compute is not None:
        floor = profile.min_compute
        candidates = [n for n in candidates if n.compute is not None and n.compute >= floor]
        if not candidates:
            return (
                f"no GPU node of compute capability ≥ {floor[0]}.{floor[1]}, "
                f"which {profile.engine} needs"
            )
    wanted = spec.gpus_per_replica
    if wanted:
        largest = max(n.gpus for n in candidates)
        if largest < wanted:
            return f"needs {wanted} GPUs per replica; the largest eligible node has {largest}"
    return None
