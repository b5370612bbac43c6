"""A FleetModel cannot reach the host, privilege or another ServiceAccount through its spec.

The spec has no field for volumes, security contexts, host namespaces or a ServiceAccount: on the
real API server a FleetModel carrying them has them pruned by the CRD's structural schema (and a
strictly validating client is refused). What it can set, ``image`` and ``engineArgs``, are an
image name and argv strings: they reach the engine container and nothing else. The Deployment the
operator renders from such a model keeps its hardening, and its pod is admitted by Pod Security
``restricted`` in the test's namespace (the ReplicaSet creates it; no FailedCreate).
"""

from __future__ import annotations

from typing import Any

import pytest

from fleet_serving import rendering
from fleet_testing.waiting import eventually

from .cluster import RealCluster
from .conftest import FM, NODES, Sink, StartOperator, fleetmodel, gpu_node
from .test_pod_security_e2e import restricted  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

HOSTILE: dict[str, Any] = {
    "serviceAccountName": "cluster-admin",
    "automountServiceAccountToken": True,
    "hostNetwork": True,
    "hostPID": True,
    "privileged": True,
    "securityContext": {"privileged": True, "runAsUser": 0},
    "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
    "volumeMounts": [{"name": "host", "mountPath": "/host"}],
}
"""Pod fields a FleetModel might try to smuggle into its spec."""
ARGS = ["--privileged", "--volume=/:/host", "--user=0", "--network=host"]


async def test_hostile_fields_are_pruned_and_the_pod_stays_restricted(
    real_cluster: RealCluster,
    restricted: str,  # noqa: F811 (the fixture imported above)
    sink: tuple[Sink, str],
    start_operator: StartOperator,
) -> None:
    await real_cluster.create(NODES, gpu_node("gpu-1"))
    await start_operator(sink[1], "--report-interval=30s")
    model = fleetmodel("qwen", image="ghcr.io/evil/root:1", engineArgs=ARGS)
    model["spec"] |= HOSTILE
    model["spec"]["resources"] = {"requests": {"cpu": "1"}, "securityContext": {"privileged": True}}
    created = await real_cluster.create(FM, model)
    assert not set(HOSTILE) & set(created["spec"]), "the CRD kept a field it does not define"
    assert "securityContext" not in created["spec"]["resources"]

    deployment = await eventually(lambda: real_cluster.live("deployments", "qwen"), within=30)
    pod = deployment["spec"]["template"]["spec"]
    assert "serviceAccountName" not in pod or pod["serviceAccountName"] == "default"
    assert pod["automountServiceAccountToken"] is False
    assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod)
    assert all("hostPath" not in volume for volume in pod["volumes"])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == rendering.RUN_AS
    (engine,) = pod["containers"]
    assert engine["image"] == "ghcr.io/evil/root:1"
    assert engine["args"][-len(ARGS) :] == ARGS  # argv of the engine, nothing more
    assert engine["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }
    assert {m["mountPath"] for m in engine["volumeMounts"]} == {"/models", "/dev/shm", "/tmp"}

    # The ReplicaSet's pod passes the namespace's Pod Security "restricted" admission.
    (admitted,) = await real_cluster.pods("qwen", 1)
    assert admitted["spec"]["securityContext"]["runAsUser"] == rendering.RUN_AS
    status = real_cluster.phase_of("qwen", "Pending")
    assert status is None or status["reason"] not in ("FailedCreate", "QuotaExceeded")
