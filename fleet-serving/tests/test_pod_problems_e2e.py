"""Why pods do not start reaches the FleetModel's status (not ``Pending/Starting 0/N`` forever).

The kubelet's waiting reasons (a missing key Secret, an image that cannot be pulled, a crash
loop), an engine killed for its memory, one failing its readiness probe, a failing
``fetch-weights`` init container and a rollout past its progress deadline, each
written as the kubelet or the Deployment controller would, on kmock and on a real API server.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleet_testing.waiting import eventually

from .cluster import Cluster
from .conftest import FM, NODES, Sink, StartOperator, fleetmodel, gpu_node

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


def waiting(container: str, reason: str, message: str, *, init: bool = False) -> dict[str, Any]:
    state = {"waiting": {"reason": reason, "message": message}}
    status = {"name": container, "ready": False, "restartCount": 3, "image": "x", "imageID": "",
              "state": state}  # fmt: skip
    key = "initContainerStatuses" if init else "containerStatuses"
    return {"phase": "Pending", key: [status]}


def oom_killed() -> dict[str, Any]:
    """Back-off after the kernel killed the engine for its memory."""
    status = waiting("engine", "CrashLoopBackOff", CRASH)
    killed = {"exitCode": 137, "reason": "OOMKilled", "startedAt": "2026-12-01T09:58:00Z",
              "finishedAt": "2026-12-01T09:59:30Z"}  # fmt: skip
    status["containerStatuses"][0]["lastState"] = {"terminated": killed}
    return status


def not_ready() -> dict[str, Any]:
    """Running past its startup probe, failing its readiness probe."""
    state = {"running": {"startedAt": "2026-12-01T10:00:00Z"}}
    status = {"name": "engine", "ready": False, "started": True, "restartCount": 2, "image": "x",
              "imageID": "", "state": state}  # fmt: skip
    return {"phase": "Running", "containerStatuses": [status]}


SECRET = 'secret "fleet-engine-key" not found'
PULL = 'Back-off pulling image "vllm/vllm-openai:v0.0.0"'
CRASH = "back-off 5m0s restarting failed container=engine"
FETCH = "back-off 40s restarting failed container=fetch-weights"
CASES = {
    "missing-secret": (waiting("engine", "CreateContainerConfigError", SECRET),
                       "CreateContainerConfigError", SECRET),
    "image-pull": (waiting("engine", "ImagePullBackOff", PULL), "ImagePullBackOff", PULL),
    "crash-loop": (waiting("engine", "CrashLoopBackOff", CRASH), "CrashLoopBackOff", CRASH),
    "fetch-weights": (waiting("fetch-weights", "CrashLoopBackOff", FETCH, init=True),
                      "FetchWeightsFailed", FETCH),
    "oom-killed": (oom_killed(), "OOMKilled",
                   "container engine was killed with no memory limit"),
    "not-ready": (not_ready(), "NotReady",
                  "container engine is running but fails its readiness probe (restarts: 2)"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
async def test_a_pod_that_cannot_start_says_why(
    cluster: Cluster, sink: tuple[Sink, str], start_operator: StartOperator, case: str
) -> None:
    status, reason, message = CASES[case]
    await cluster.create(NODES, gpu_node("gpu-1"))
    await start_operator(sink[1], "--report-interval=30s")
    source = {"uri": "s3://weights/qwen"} if case == "fetch-weights" else None
    spec = {"source": source} if source else {}
    await cluster.create(FM, fleetmodel("qwen", **spec))
    await eventually(lambda: cluster.phase_of("qwen", "Pending"), within=20)

    await cluster.pod_status("qwen", status)
    said = await eventually(
        lambda: (s := cluster.phase_of("qwen", "Pending")) and s["reason"] == reason and s,
        within=20,
    )
    assert message in said["message"]
    assert said["message"].startswith("0/1 replicas ready; ")


async def test_a_rollout_past_its_progress_deadline_says_so(
    cluster: Cluster, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    await cluster.create(NODES, gpu_node("gpu-1"))
    await start_operator(sink[1], "--report-interval=30s")
    await cluster.create(FM, fleetmodel("qwen"))
    await eventually(lambda: cluster.live("deployments", "qwen"), within=20)
    await cluster.stall("qwen")
    said = await eventually(
        lambda: (
            (s := cluster.phase_of("qwen", "Pending"))
            and s["reason"] == "ProgressDeadlineExceeded"
            and s
        ),
        within=30,
    )
    assert "has timed out progressing" in said["message"]
