"""A namespace whose admission refuses the model's pods says so in the FleetModel's status.

On the real API server and controller manager: a ResourceQuota with no GPUs left, and an admission
policy refusing every pod (what a Kyverno or Gatekeeper rule does; a ValidatingAdmissionPolicy
here). The ReplicaSet controller's ``FailedCreate`` reaches the Deployment's ``ReplicaFailure``
condition, which the operator already watches under its shipped role: the status is ``Pending``
with ``QuotaExceeded`` naming the quota, or ``FailedCreate`` with the policy's message.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator

import pytest

from fleet_testing.fix_kube import KubeError
from fleet_testing.waiting import eventually, eventually_blocking

from .cluster import RealCluster
from .conftest import FM, NODES, Sink, StartOperator, fleetmodel, gpu_node

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
REFUSAL = "engine pods need the platform team's approval"


async def refused_with(cluster: RealCluster, start: StartOperator, sink: str, reason: str) -> str:
    """Start the operator, create a one-GPU model; its status message once ``reason`` shows."""
    await cluster.create(NODES, gpu_node("gpu-1"))
    await start(sink, "--report-interval=30s")
    await cluster.create(FM, fleetmodel("qwen"))
    said = await eventually(
        lambda: (s := cluster.phase_of("qwen", "Pending")) and s["reason"] == reason and s,
        within=45,
        what=f"the model Pending with {reason}",
    )
    assert cluster.live("deployments", "qwen") is not None
    return str(said["message"])


async def test_a_quota_that_refuses_the_pod_is_named(
    real_cluster: RealCluster, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    quotas = f"/api/v1/namespaces/{real_cluster.namespace}/resourcequotas"
    quota = {
        "metadata": {"name": "no-gpus-left"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "0"}},
    }
    real_cluster.cluster.create(quotas, quota)

    message = await refused_with(real_cluster, start_operator, sink[1], "QuotaExceeded")
    assert message.startswith("0/1 replicas ready; the ReplicaSet cannot create pods: pods ")
    assert "exceeded quota: no-gpus-left" in message
    assert "requested: requests.nvidia.com/gpu=1" in message


@pytest.fixture
def refusing_policy(real_cluster: RealCluster) -> Iterator[str]:
    """A ValidatingAdmissionPolicy refusing every pod created in the test's namespace, enforced
    (a dry-run pod is refused) before the test goes on."""
    name = f"refuse-{secrets.token_hex(4)}"
    namespace = real_cluster.namespace
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
              "resources": ["pods"]}]  # fmt: skip
    policy = {
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": rules},
            "validations": [{"expression": "false", "message": REFUSAL}],
        },
    }
    selector = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    binding = {
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": selector}},
    }  # fmt: skip
    kube = real_cluster.cluster
    kube.create(POLICIES, policy)
    kube.create(BINDINGS, binding)
    probe = {"metadata": {"name": "probe"},
             "spec": {"containers": [{"name": "c", "image": "probe:1"}]}}  # fmt: skip

    def refused() -> bool:
        try:
            kube.create(f"/api/v1/namespaces/{namespace}/pods?dryRun=All", probe)
        except KubeError as exc:
            return exc.status in (403, 422) and REFUSAL in json.loads(exc.body)["message"]
        return False

    try:
        eventually_blocking(refused, within=30, what="the admission policy enforced")
        yield name
    finally:
        kube.delete(f"{BINDINGS}/{name}")
        kube.delete(f"{POLICIES}/{name}")


async def test_an_admission_policy_that_refuses_the_pod_is_quoted(
    real_cluster: RealCluster,
    refusing_policy: str,
    sink: tuple[Sink, str],
    start_operator: StartOperator,
) -> None:
    message = await refused_with(real_cluster, start_operator, sink[1], "FailedCreate")
    assert message.startswith("0/1 replicas ready; the ReplicaSet cannot create pods: pods ")
    assert f"ValidatingAdmissionPolicy '{refusing_policy}'" in message
    assert REFUSAL in message
