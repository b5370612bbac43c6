"""Why a pod does not serve, from pods shaped as a real kubelet writes them: an engine killed for
its memory (OOMKilled) and one whose readiness probe fails (NotReady), in their order among the
other reasons, and how the view picks one among a model's pods."""

from __future__ import annotations

from typing import Any

import pytest

from fleet_serving import observing
from fleet_serving.view import ClusterView

from .conftest import fleetmodel, gpu_node

STARTED_AT = "2026-12-01T10:00:00Z"
OOM = {
    "terminated": {
        "exitCode": 137,
        "reason": "OOMKilled",
        "startedAt": "2026-12-01T09:58:00Z",
        "finishedAt": "2026-12-01T09:59:30Z",
        "containerID": "containerd://0f1e",
    }
}
CRASH_LOOP = {
    "waiting": {
        "reason": "CrashLoopBackOff",
        "message": "back-off 40s restarting failed container=engine pod=qwen-7d9f-x1_fleet-models",
    }
}
RUNNING = {"running": {"startedAt": STARTED_AT}}


def engine(
    state: dict[str, Any],
    *,
    last: dict[str, Any] | None = None,
    ready: bool = False,
    started: bool = False,
    restarts: int = 0,
) -> dict[str, Any]:
    """A containerStatuses entry as the kubelet writes it."""
    return {
        "name": "engine",
        "state": state,
        "lastState": last or {},
        "ready": ready,
        "restartCount": restarts,
        "image": "docker.io/vllm/vllm-openai:v0.11.0",
        "imageID": "docker.io/vllm/vllm-openai@sha256:6f1c",
        "containerID": "containerd://9a8b",
        "started": started,
    }


def pod(
    *statuses: dict[str, Any],
    limits: dict[str, str] | None = None,
    init: list[dict[str, Any]] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    """A model's pod: the rendered spec's engine container and the kubelet's status."""
    ready = all(s["ready"] for s in statuses)
    conditions = [
        {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": STARTED_AT}
        for kind in ("PodReadyToStartContainers", "Initialized", "PodScheduled")
    ] + [
        {"type": kind, "status": "True" if ready else "False", "lastProbeTime": None,
         "lastTransitionTime": STARTED_AT} | ({} if ready else {"reason": "ContainersNotReady"})
        for kind in ("Ready", "ContainersReady")
    ]  # fmt: skip
    resources = {"requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
                 "limits": {"nvidia.com/gpu": "1"} | (limits or {})}  # fmt: skip
    metadata: dict[str, Any] = {"name": "qwen-7d9f-x1", "namespace": "fleet-models"}
    if deleting:
        metadata |= {"deletionTimestamp": "2026-12-01T10:05:00Z", "deletionGracePeriodSeconds": 30}
    status: dict[str, Any] = {
        "phase": "Running",
        "conditions": conditions,
        "hostIP": "10.0.0.5",
        "podIP": "10.1.2.3",
        "startTime": STARTED_AT,
        "containerStatuses": list(statuses),
    }
    if init is not None:
        status["initContainerStatuses"] = init
    return {
        "metadata": metadata,
        "spec": {"containers": [{"name": "engine", "resources": resources}]},
        "status": status,
    }


LIMITED = (
    "container engine was killed at its memory limit of 24Gi (OOMKilled, restarts: 3); "
    "raise resources.limits.memory, or serve a smaller model or a shorter context"
)
UNLIMITED = (
    "container engine was killed with no memory limit, so its node ran out of memory "
    "(OOMKilled, restarts: 1); set resources.requests.memory and resources.limits.memory to what "
    "it needs, or serve a smaller model or a shorter context"
)
CRASHED = f"container engine: CrashLoopBackOff: {CRASH_LOOP['waiting']['message']}"
NOT_READY = "container engine is running but fails its readiness probe (restarts: 2)"


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        # Waiting in a crash loop after an OOM kill: the kill, not the back-off, is the reason.
        (pod(engine(CRASH_LOOP, last=OOM, restarts=3), limits={"memory": "24Gi"}),
         ("OOMKilled", LIMITED)),
        # Restarted after an OOM kill, not ready yet, and no limit in the spec.
        (pod(engine(RUNNING, last=OOM, restarts=1)), ("OOMKilled", UNLIMITED)),
        # Serving again: an old OOM kill is history.
        (pod(engine(RUNNING, last=OOM, ready=True, started=True, restarts=1)), None),
        # Past its startup probe, failing its readiness probe.
        (pod(engine(RUNNING, started=True, restarts=2)), ("NotReady", NOT_READY)),
        # Still behind its startup probe (loading weights): not a problem yet.
        (pod(engine(RUNNING, started=False)), None),
        # Being deleted: the kubelet marks it not ready on its way out.
        (pod(engine(RUNNING, started=True, restarts=2), deleting=True), None),
        (pod(engine(RUNNING, ready=True, started=True)), None),
        # A crash loop for another reason keeps its own reason.
        (pod(engine(CRASH_LOOP, last={"terminated": {"exitCode": 1, "reason": "Error"}},
                    restarts=3)),
         ("CrashLoopBackOff", CRASHED)),
    ],
)  # fmt: skip
def test_an_oom_kill_and_a_failing_readiness_probe_are_named(
    body: dict[str, Any], problem: tuple[str, str] | None
) -> None:
    assert observing.pod_problem(body) == problem


def test_a_failing_init_container_comes_before_an_oom_kill() -> None:
    fetch = {"name": "fetch-weights", "state": {"waiting": {"reason": "CrashLoopBackOff"}},
             "lastState": {"terminated": {"exitCode": 22, "reason": "Error"}}, "ready": False,
             "restartCount": 2, "image": "curlimages/curl:8.11.1", "imageID": ""}  # fmt: skip
    problem = observing.pod_problem(pod(engine(CRASH_LOOP, last=OOM, restarts=3), init=[fetch]))
    assert problem == ("FetchWeightsFailed", "init container fetch-weights: CrashLoopBackOff: "
                       "CrashLoopBackOff")  # fmt: skip


def test_the_view_names_an_oom_kill_before_a_replica_that_is_only_not_ready() -> None:
    view = ClusterView()
    view.put_node(gpu_node("gpu-1"), deleted=False)
    view.put_model(fleetmodel("qwen", replicas=2), deleted=False)
    key = ("default", "qwen")
    unready = observing.pod_problem(pod(engine(RUNNING, started=True, restarts=2)))
    killed = observing.pod_problem(pod(engine(CRASH_LOOP, last=OOM, restarts=3)))
    view.put_pod(key, "qwen-a", unready)
    view.put_pod(key, "qwen-b", killed)
    seen = view.observe(key)
    assert seen is not None
    assert seen.not_starting is not None
    assert seen.not_starting[0] == "OOMKilled"
