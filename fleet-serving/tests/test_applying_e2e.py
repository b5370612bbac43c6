"""What a first real cluster does to the operator's objects: names in the way, names the API
server refuses, objects it rejects. Run on kmock and on a real API server (``cluster``) where
both can show it; the rules only a real server enforces (CEL, object validation) run there only.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleet_testing.fix_kube import KubeCluster, KubeError
from fleet_testing.waiting import eventually

from .cluster import Cluster, RealCluster
from .conftest import (
    FM,
    NODES,
    PDBS,
    SERVICES,
    KubeApi,
    Sink,
    StartOperator,
    fleetmodel,
    gpu_node,
    live,
    phase_of,
)
from .kube_emulator import FleetKubernetes

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


def foreign_service(name: str) -> dict[str, Any]:
    """A Service someone else made, with the name the operator would give the model's."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "labels": {"team": "web"}},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80}]},
    }


async def left_alone(
    cluster: Cluster, sink: tuple[Sink, str], start_operator: StartOperator, theirs: dict[str, Any]
) -> dict[str, Any]:
    """Create ``theirs`` (named ``qwen``), then the FleetModel ``qwen``: the model is Failed,
    naming it, and ``theirs`` is left as it was, unowned. Returns it as it is now."""
    kind = theirs["kind"]
    plural = {"Service": "services", "PodDisruptionBudget": "poddisruptionbudgets"}[kind]
    await cluster.create(SERVICES if kind == "Service" else PDBS, theirs)
    await cluster.create(NODES, gpu_node("gpu-1"))
    await start_operator(sink[1], "--resync=1s", "--report-interval=30s")
    await cluster.create(FM, fleetmodel("qwen"))

    status = await eventually(lambda: cluster.phase_of("qwen", "Failed"), within=20)
    assert status["reason"] == "ForeignObject"
    assert f"{kind} {cluster.namespace}/qwen exists and is not controlled" in status["message"]
    found = cluster.live(plural, "qwen")
    assert found is not None
    assert "ownerReferences" not in found["metadata"]
    assert found["spec"]["selector"] == theirs["spec"]["selector"]
    return found


async def test_a_foreign_object_is_never_adopted_and_the_status_names_it(
    cluster: Cluster, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    await left_alone(cluster, sink, start_operator, foreign_service("qwen"))

    # Deleting the FleetModel leaves the foreign Service alone (the garbage collector would
    # delete an adopted one); the operator's Deployment goes.
    await cluster.delete(f"{FM}/qwen")
    await eventually(lambda: cluster.live("fleetmodels", "qwen") is None, within=60)
    # On the real server the garbage collector deletes it (background propagation).
    await eventually(lambda: cluster.live("deployments", "qwen") is None, within=60)
    assert cluster.live("services", "qwen") is not None

    # Once the foreign Service is gone, the model gets its own.
    await cluster.delete(f"{SERVICES}/qwen")
    await eventually(lambda: cluster.live("services", "qwen") is None, within=20)
    await cluster.create(FM, fleetmodel("qwen"))
    ours = await eventually(lambda: cluster.live("services", "qwen"), within=20)
    assert ours["metadata"]["ownerReferences"][0]["kind"] == "FleetModel"
    await eventually(lambda: cluster.phase_of("qwen", "Pending"), within=20)


async def test_a_foreign_disruption_budget_is_never_adopted(
    cluster: Cluster, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    """A budget someone else made for the model's name (say, ``maxUnavailable: 0`` while they
    plan maintenance) is theirs: the operator neither patches nor adopts it."""
    theirs = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "qwen", "namespace": "default", "labels": {"team": "ops"}},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "maxUnavailable": 0},
    }
    budget = await left_alone(cluster, sink, start_operator, theirs)
    assert budget["spec"]["maxUnavailable"] == 0


@pytest.mark.parametrize("name", ["7b", "llama-3.1-8b", "qwen2.5-7b"])
def test_the_crd_refuses_names_a_service_cannot_have(
    fleet_crd: KubeCluster, kube_namespace: str, name: str
) -> None:
    model = fleetmodel(name)
    model["metadata"]["namespace"] = kube_namespace
    with pytest.raises(KubeError) as refused:
        fleet_crd.create(f"/apis/serving.fleet.dev/v1alpha1/namespaces/{kube_namespace}/fleetmodels",
                         model)  # fmt: skip
    assert refused.value.status == 422
    assert "metadata.name names the model's Service" in refused.value.body


async def test_a_name_a_service_cannot_have_fails_up_front_without_the_crd_rule(
    kube: FleetKubernetes, kube_api: KubeApi, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    """Where the CRD's rule is not enforced (an older CRD; kmock), the operator refuses the name
    itself before making anything, instead of a Deployment and a Service refused forever."""
    await kube_api.create(NODES, gpu_node("gpu-1"))
    await start_operator(sink[1], "--resync=1s", "--report-interval=30s")
    await kube_api.create(FM, fleetmodel("qwen2.5-7b"))
    status = await eventually(lambda: phase_of(kube, "qwen2.5-7b", "Failed"), within=20)
    assert status["reason"] == "InvalidSpec"
    assert "DNS-1035" in status["message"]
    assert live(kube, "deployments", "qwen2.5-7b") is None


async def test_an_object_the_api_server_refuses_is_a_permanent_failure_in_the_status(
    real_cluster: RealCluster, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    """A 422 is not retried every 15 s behind a status that says nothing: the model is Failed,
    with the API server's own explanation."""
    cluster = real_cluster
    await cluster.create(NODES, gpu_node("gpu-1"))
    await start_operator(sink[1], "--report-interval=30s")
    await cluster.create(FM, fleetmodel("qwen", nodeSelector={"not a label key": "x"}))
    status = await eventually(lambda: cluster.phase_of("qwen", "Failed"), within=20)
    assert status["reason"] == "Rejected"
    assert "422" in status["message"]
    assert "nodeSelector" in status["message"]
    assert cluster.live("deployments", "qwen") is None
