"""Reading cluster objects into typed facts: nodes with GPUs, ready endpoints, unschedulable pods.

Kubernetes objects arrive as dicts from watches; these pure functions are the only place that
knows their field paths (capacity, NVIDIA GPU feature-discovery labels, EndpointSlice conditions).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from fleet_contract import Endpoint, Gpu, MigSlice, Node, NodeLabels
from fleet_serving import accelerators, devices

__all__ = [
    "PROBLEM_REASONS",
    "DeploymentFacts",
    "ObservedNode",
    "create_failure",
    "deployment_facts",
    "observe_node",
    "pod_problem",
    "slice_endpoints",
    "unschedulable_message",
]

GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
_LABEL_PRODUCT = "nvidia.com/gpu.product"
_LABEL_MEMORY = "nvidia.com/gpu.memory"
_LABEL_MAJOR = "nvidia.com/gpu.compute.major"
_LABEL_MINOR = "nvidia.com/gpu.compute.minor"
_LABEL_REPLICAS = "nvidia.com/gpu.replicas"
"""Set by GPU feature discovery under time-slicing or MPS sharing: how many ``nvidia.com/gpu``
each physical GPU is advertised as."""
_INT = re.compile(r"^[0-9]+$")
_DEVICE = re.compile(r"^(nvidia|amd|huawei)\.com/[A-Za-z0-9][-A-Za-z0-9_.+]*$")
"""The vendors' extended resources a FleetModel may ask for (:mod:`fleet_serving.devices`)."""


class ObservedNode(msgspec.Struct, kw_only=True, frozen=True):
    """A node as the contract reports it, plus what placement needs (all labels, GPU count)."""

    node: Node
    labels: dict[str, str]
    gpus: int
    compute: tuple[int, int] | None
    devices: dict[str, int] = {}
    """Allocatable accelerators by extended resource (``nvidia.com/mig-1g.10gb``, ``amd.com/gpu``,
    ``huawei.com/Ascend910``…), as the scheduler counts them."""


def _count(value: Any) -> int:
    """A whole-number quantity (``"8"``); anything fractional or odd counts as none."""
    text = str(value)
    return int(text) if _INT.match(text) else 0


def _compute(labels: Mapping[str, str]) -> tuple[int, int] | None:
    major, minor = labels.get(_LABEL_MAJOR, ""), labels.get(_LABEL_MINOR, "")
    if _INT.match(major) and _INT.match(minor):
        return int(major), int(minor)
    return None


def physical_gpus(allocatable: Mapping[str, Any], labels: Mapping[str, str]) -> int:
    """Physical NVIDIA GPUs: ``nvidia.com/gpu`` divided by the sharing replicas, so a node whose
    4 GPUs are each time-sliced 8 ways (32 allocatable) counts 4 in the report (P8's pool)."""
    count = _count(allocatable.get(GPU, 0))
    replicas = _count(labels.get(_LABEL_REPLICAS, 1))
    return count // replicas if replicas > 1 else count


def _gpus(allocatable: Mapping[str, Any], labels: Mapping[str, str]) -> tuple[Gpu, ...]:
    count = physical_gpus(allocatable, labels)
    product = labels.get(_LABEL_PRODUCT)
    slices = tuple(
        MigSlice(
            profile=(profile := key.removeprefix(MIG_PREFIX)),
            count=_count(value),
            share=devices.card_share(profile, product),
        )
        for key, value in sorted(allocatable.items())
        if key.startswith(MIG_PREFIX) and len(key) > len(MIG_PREFIX)
    )
    others = accelerators.other_accelerators(allocatable, labels)
    if not count and not slices:
        return tuple(others)
    compute = _compute(labels)
    gpu = Gpu(
        vendor="nvidia",
        product=product or "unknown",
        memory_mib=_count(labels.get(_LABEL_MEMORY, 0)),
        count=count,
        compute_capability=f"{compute[0]}.{compute[1]}" if compute else None,
        mig_slices=slices,
        resource=GPU,
    )
    return (gpu, *others)


def observe_node(obj: Mapping[str, Any]) -> ObservedNode:
    """A Node object as facts; GPUs from allocatable (else capacity) and GFD labels."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    labels: dict[str, str] = dict(meta.get("labels") or {})
    allocatable = status.get("allocatable") or status.get("capacity") or {}
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    node = Node(
        name=meta["name"],
        ready=ready,
        schedulable=not (obj.get("spec") or {}).get("unschedulable", False),
        labels=NodeLabels(
            zone=labels.get("topology.kubernetes.io/zone"),
            instance_type=labels.get("node.kubernetes.io/instance-type"),
        ),
        gpus=_gpus(allocatable, labels),
    )
    gpus = _count(allocatable.get(GPU, 0))
    found = {k: _count(v) for k, v in sorted(allocatable.items()) if _DEVICE.match(k)}
    return ObservedNode(node=node, labels=labels, gpus=gpus, compute=_compute(labels),
                        devices={k: n for k, n in found.items() if n})  # fmt: skip


def slice_endpoints(obj: Mapping[str, Any]) -> tuple[Endpoint, ...]:
    """Pod URLs of an EndpointSlice (P3: the gateway picks pods), ready or not."""
    ports = [p for p in obj.get("ports") or [] if p.get("port")]
    port = next((p["port"] for p in ports if p.get("name") == "http"), None)
    if port is None and ports:
        port = ports[0]["port"]
    if port is None:
        return ()
    found = []
    for endpoint in obj.get("endpoints") or []:
        ready = (endpoint.get("conditions") or {}).get("ready") is not False
        for address in endpoint.get("addresses") or []:
            host = f"[{address}]" if ":" in address else address
            found.append(Endpoint(url=f"http://{host}:{port}", ready=ready))
    return tuple(found)


class DeploymentFacts(msgspec.Struct, kw_only=True, frozen=True):
    """What a Deployment's status says about its rollout."""

    desired: int
    ready: int
    stalled: str | None = None
    """The controller's message when the rollout passed its progress deadline."""
    create_failure: tuple[str, str] | None = None
    """(reason, message) when the ReplicaSet cannot create pods (:func:`create_failure`)."""
    rolled_out: bool = True
    """The controller has seen the current spec (observedGeneration), every replica runs it
    (updatedReplicas) and no pod of the previous spec is left (replicas): until then ready
    replicas may be the previous spec's. The last, as ``kubectl rollout status`` checks it,
    because a surging rollout counts its new pod as updated before it is Ready, while the old
    one serves."""


def deployment_facts(deployment: Mapping[str, Any]) -> DeploymentFacts:
    """Desired and ready replicas of a Deployment, and whether its rollout is stalled."""
    spec, status = deployment.get("spec") or {}, deployment.get("status") or {}
    desired = int(spec.get("replicas", 1))
    generation = int((deployment.get("metadata") or {}).get("generation") or 0)
    observed = int(status.get("observedGeneration") or 0)
    updated = int(status.get("updatedReplicas") or 0)
    old_left = int(status.get("replicas") or 0) > updated
    stalled = next(
        (str(c.get("message") or "the rollout made no progress")
         for c in status.get("conditions") or []
         if c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded"),
        None,
    )  # fmt: skip
    return DeploymentFacts(
        desired=desired,
        ready=int(status.get("readyReplicas") or 0),
        stalled=stalled,
        create_failure=create_failure(status.get("conditions") or []),
        rolled_out=observed >= generation and updated >= desired and not old_left,
    )


_MESSAGE_LIMIT = 1024
"""The longest admission message kept for a status (a webhook's can be any length)."""


def create_failure(conditions: list[Mapping[str, Any]]) -> tuple[str, str] | None:
    """Why the Deployment's ReplicaSet cannot create pods, from the ``ReplicaFailure`` condition
    the Deployment controller copies from it (the API server refused the pod: a ResourceQuota, a
    LimitRange, Pod Security or another admission policy), as ``QuotaExceeded`` or
    ``FailedCreate`` with the server's own message; else None."""
    for condition in conditions:
        failing = condition.get("type") == "ReplicaFailure" and condition.get("status") == "True"
        if failing and condition.get("reason") in (None, "", "FailedCreate"):
            said = str(condition.get("message") or condition.get("reason") or "FailedCreate")
            said = said[:_MESSAGE_LIMIT]
            reason = "QuotaExceeded" if "exceeded quota" in said else "FailedCreate"
            return reason, f"the ReplicaSet cannot create pods: {said}"
    return None


PROBLEM_REASONS = frozenset({
    "CreateContainerConfigError", "CreateContainerError", "ImagePullBackOff", "ErrImagePull",
    "InvalidImageName", "CrashLoopBackOff", "RunContainerError",
})  # fmt: skip
"""Kubelet waiting reasons that mean a container will not start without a change. A pod's
problem reasons are these, ``Unschedulable``, ``FetchWeightsFailed`` / ``InitContainerFailed``,
``OOMKilled`` and ``NotReady`` (:func:`pod_problem`)."""


def _init_reason(name: str) -> str:
    return "FetchWeightsFailed" if name == "fetch-weights" else "InitContainerFailed"


def _waiting_problem(status: Mapping[str, Any], *, init: bool) -> tuple[str, str] | None:
    name = str(status.get("name") or "?")
    what = f"init container {name}" if init else f"container {name}"
    state = status.get("state") or {}
    waiting = state.get("waiting") or {}
    reason = str(waiting.get("reason") or "")
    if reason in PROBLEM_REASONS:
        detail = f"{what}: {reason}: {waiting.get('message') or reason}"
        return (_init_reason(name) if init else reason), detail
    ended = (status.get("lastState") or {}).get("terminated") or state.get("terminated") or {}
    if init and ended.get("exitCode") not in (None, 0):
        said = ended.get("message") or ended.get("reason") or "no message"
        return _init_reason(name), f"{what} exited with {ended['exitCode']}: {said}"
    return None


def _memory_limit(pod: Mapping[str, Any], container: str) -> str | None:
    for spec in (pod.get("spec") or {}).get("containers") or []:
        if spec.get("name") == container:
            limit = ((spec.get("resources") or {}).get("limits") or {}).get("memory")
            return str(limit) if limit else None
    return None


def _oom_problem(pod: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[str, str] | None:
    """The container was last killed for its memory and does not serve again yet (waiting in a
    crash loop, or restarted and not ready). A ready container's old OOM kill is history."""
    state = status.get("state") or {}
    ended = (status.get("lastState") or {}).get("terminated") or state.get("terminated") or {}
    if ended.get("reason") != "OOMKilled" or status.get("ready"):
        return None
    name = str(status.get("name") or "?")
    restarts = int(status.get("restartCount") or 0)
    limit = _memory_limit(pod, name)
    if limit is None:
        why = "with no memory limit, so its node ran out of memory"
        fix = "set resources.requests.memory and resources.limits.memory to what it needs"
    else:
        why = f"at its memory limit of {limit}"
        fix = "raise resources.limits.memory"
    return "OOMKilled", (
        f"container {name} was killed {why} (OOMKilled, restarts: {restarts}); {fix}, or serve "
        "a smaller model or a shorter context"
    )


def _not_ready_problem(status: Mapping[str, Any]) -> tuple[str, str] | None:
    """Running and past its startup probe (``started``), yet not ready: the readiness probe
    fails. A container still starting (``started`` false or absent) is not flagged."""
    running = "running" in (status.get("state") or {})
    if not running or status.get("started") is not True or status.get("ready"):
        return None
    name = str(status.get("name") or "?")
    restarts = int(status.get("restartCount") or 0)
    return "NotReady", (
        f"container {name} is running but fails its readiness probe (restarts: {restarts})"
    )


def pod_problem(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """Why a pod does not start or serve, as (reason, message), the first of: the scheduler's
    Unschedulable, a failing init container (``fetch-weights``), a container killed for its
    memory (OOMKilled), one the kubelet cannot start or keeps restarting (a missing Secret, an
    image that cannot be pulled, a crash loop), one running whose readiness probe fails
    (NotReady, unless the pod is being deleted); else None."""
    message = unschedulable_message(pod)
    if message is not None:
        return "Unschedulable", message
    status = pod.get("status") or {}
    containers = status.get("containerStatuses") or []
    deleting = bool((pod.get("metadata") or {}).get("deletionTimestamp"))
    found = itertools.chain(
        (_waiting_problem(c, init=True) for c in status.get("initContainerStatuses") or []),
        (_oom_problem(pod, c) for c in containers),
        (_waiting_problem(c, init=False) for c in containers),
        (_not_ready_problem(c) for c in containers if not deleting),
    )
    return next((problem for problem in found if problem is not None), None)


def unschedulable_message(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's message when a pod is Unschedulable, else None."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return str(condition.get("message") or "the scheduler found no node for this pod")
    return None
