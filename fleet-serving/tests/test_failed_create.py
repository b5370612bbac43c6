"""Pods the API server refuses to create (a ResourceQuota, a LimitRange, Pod Security, an admission
policy) reach the FleetModel's status from the Deployment's ``ReplicaFailure`` condition, instead
of ``Pending/Starting 0/N`` forever."""

from __future__ import annotations

from typing import Any

import pytest

from fleet_serving import observing, statuses
from fleet_serving.spec import FleetModelStatus
from fleet_serving.view import ClusterView

from .conftest import cpu_node

QUOTA = ('pods "qwen-7d9c8-x2k4f" is forbidden: exceeded quota: gpu-quota, requested: '
         "requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=8, limited: "
         "requests.nvidia.com/gpu=8")  # fmt: skip
POD_SECURITY = ('pods "qwen-7d9c8-x2k4f" is forbidden: violates PodSecurity "restricted:latest":'
                " seccompProfile (pod or container \"engine\" must set securityContext."
                'seccompProfile.type to "RuntimeDefault" or "Localhost")')  # fmt: skip


def failure(reason: str, message: str, status: str = "True") -> dict[str, Any]:
    return {"type": "ReplicaFailure", "status": status, "reason": reason, "message": message}


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ([failure("FailedCreate", QUOTA)], "QuotaExceeded"),
        ([failure("FailedCreate", POD_SECURITY)], "FailedCreate"),
        ([failure("FailedCreate", QUOTA, status="False")], None),
        ([failure("FailedDelete", 'pods "x" not found')], None),
        ([{"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable"}], None),
        ([], None),
    ],
)
def test_the_replica_failure_condition_is_read(
    conditions: list[dict[str, Any]], expected: str | None
) -> None:
    found = observing.create_failure(conditions)
    assert (found[0] if found else None) == expected
    if found is not None:
        assert found[1] == f"the ReplicaSet cannot create pods: {conditions[0]['message']}"


def test_a_webhooks_endless_message_is_cut() -> None:
    found = observing.create_failure([failure("FailedCreate", "denied: " + "x" * 100_000)])
    assert found is not None
    assert len(found[1]) < 1100


def view_with(deployment_status: dict[str, Any]) -> ClusterView:
    view = ClusterView()
    view.put_node(cpu_node("cpu-1"), deleted=False)
    body = {
        "metadata": {"name": "qwen", "namespace": "models", "generation": 1},
        "spec": {"servedModelName": "qwen", "engine": "llamacpp", "weightFormat": "gguf",
                 "gpusPerReplica": 0, "source": {"uri": "s3://models/m.gguf"}},
    }  # fmt: skip
    view.put_model(body, deleted=False)
    deployment = {"metadata": {"generation": 1}, "spec": {"replicas": 1},
                  "status": deployment_status}  # fmt: skip
    view.put_deployment(("models", "qwen"), deployment, deleted=False)
    return view


def status_of(view: ClusterView) -> FleetModelStatus:
    seen = view.observe(("models", "qwen"))
    assert seen is not None
    return statuses.decide(seen, previous=FleetModelStatus(), now="2026-12-07T20:00:00Z")


def test_a_quota_refusal_is_the_models_reason_until_it_clears() -> None:
    view = view_with({"conditions": [failure("FailedCreate", QUOTA)]})
    view.put_pod(("models", "qwen"), "older", ("NotReady", "an older pod"))
    status = status_of(view)
    assert (status.phase, status.reason) == ("Pending", "QuotaExceeded")
    assert status.message == f"0/1 replicas ready; the ReplicaSet cannot create pods: {QUOTA}"

    view.put_deployment(("models", "qwen"), {"spec": {"replicas": 1}, "status": {}}, deleted=False)
    assert status_of(view).reason == "NotReady"
