"""``fleet-serving run --namespace``: the operator reconciles and reports only what it watches.

A real operator process against kmock, started with ``--namespace=team-a``, and a FleetModel of
the same name in ``team-a`` and in ``default``: only the first gets a Deployment, a status and a
place in the report. Nodes are cluster-scoped, so they are still watched and reported.
On a real API server (``real_cluster``, the operator started with ``--namespace`` set to the
test's namespace, as the admin), the same split is observed on the objects and the report.
"""

from __future__ import annotations

import copy
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from kmock import action

from fleet_contract import InventoryReport
from fleet_testing.waiting import eventually

from .cluster import RealCluster
from .conftest import FM, NODES, KubeApi, Sink, StartOperator, fleetmodel, gpu_node
from .kube_emulator import FleetKubernetes

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

WATCHED = "team-a"
WATCHED_FM = f"/apis/serving.fleet.dev/v1alpha1/namespaces/{WATCHED}/fleetmodels"
CLUSTER_SCOPED = {"nodes", "namespaces", "customresourcedefinitions"}


def in_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    moved = copy.deepcopy(obj)
    moved["metadata"]["namespace"] = namespace
    return moved


def live(kube: FleetKubernetes, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
    for (resource, ns, obj_name), obj in kube.objects.items():
        if (resource.plural, ns, obj_name) == (plural, namespace, name) and not obj.deleted:
            return dict(obj.raw)
    return None


def status_of(kube: FleetKubernetes, namespace: str, name: str) -> dict[str, Any] | None:
    return (live(kube, "fleetmodels", namespace, name) or {}).get("status") or None


def with_deployments(state: Sink) -> InventoryReport | None:
    report = state.latest()
    return report if report is not None and report.deployments else None


def listed_or_watched(kube: FleetKubernetes) -> set[tuple[str, str | None]]:
    """(plural, namespace) of every list and watch request kmock served; None is cluster-wide."""
    return {
        (r.resource.plural, r.namespace)
        for r in kube
        if r.action in (action.LIST, action.WATCH)
        and r.resource is not None
        and r.resource.plural is not None
    }


async def test_only_the_watched_namespace_is_reconciled_and_reported(
    kube: FleetKubernetes, kube_api: KubeApi, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    state, url = sink
    await kube_api.create(NODES, gpu_node("gpu-1"))
    # kopf lists the named namespaces before it watches in them, as a real cluster would have them.
    await kube_api.create("/api/v1/namespaces", {"metadata": {"name": WATCHED}})
    await start_operator(url, f"--namespace={WATCHED}", "--resync=1s", "--report-interval=30s")
    # The unwatched one first: an operator that saw it would get to it no later than the other.
    unwatched = await kube_api.create(FM, fleetmodel("qwen"))
    await kube_api.create(WATCHED_FM, in_namespace(fleetmodel("qwen"), WATCHED))

    deployment = await eventually(lambda: live(kube, "deployments", WATCHED, "qwen"), within=20)
    assert deployment["metadata"]["namespace"] == WATCHED
    status = await eventually(lambda: status_of(kube, WATCHED, "qwen"), within=20)
    assert status["phase"] == "Pending"
    report = await eventually(lambda: with_deployments(state), within=20)

    # The operator has demonstrably been running; the other namespace's model was left alone.
    assert live(kube, "deployments", "default", "qwen") is None
    assert live(kube, "services", "default", "qwen") is None
    assert status_of(kube, "default", "qwen") is None
    assert live(kube, "fleetmodels", "default", "qwen") == unwatched  # no finalizer, no patch
    assert [(d.namespace, d.name) for d in report.deployments] == [(WATCHED, "qwen")]
    assert [n.name for n in report.nodes] == ["gpu-1"]
    # Not even read: namespaced resources were listed and watched in team-a only.
    looked = listed_or_watched(kube)
    assert {("fleetmodels", WATCHED), ("nodes", None)} <= looked
    assert {ns for plural, ns in looked if plural not in CLUSTER_SCOPED} == {WATCHED}


@pytest.fixture
def other_namespace(real_cluster: RealCluster) -> Iterator[str]:
    """A second namespace on the real API server, which the operator is not told to watch."""
    name = f"u-{secrets.token_hex(4)}"
    real_cluster.cluster.create("/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    real_cluster.cluster.delete(f"/api/v1/namespaces/{name}")


async def test_on_a_real_api_server_only_the_watched_namespace_is_reconciled(
    real_cluster: RealCluster,
    other_namespace: str,
    sink: tuple[Sink, str],
    start_operator: StartOperator,
) -> None:
    state, url = sink
    watched = real_cluster.namespace
    await real_cluster.create(NODES, gpu_node("gpu-1"))
    # start_operator passes --namespace=<the test's namespace> on the real server.
    await start_operator(url, "--resync=1s", "--report-interval=30s")
    other_fm = f"/apis/serving.fleet.dev/v1alpha1/namespaces/{other_namespace}/fleetmodels"
    unwatched = await real_cluster.create(
        other_fm, in_namespace(fleetmodel("qwen"), other_namespace)
    )
    await real_cluster.create(FM, fleetmodel("qwen"))

    deployment = await eventually(lambda: real_cluster.live("deployments", "qwen"), within=20)
    assert deployment["metadata"]["namespace"] == watched
    status = await eventually(lambda: real_cluster.phase_of("qwen", "Pending"), within=20)
    assert status["phase"] == "Pending"
    report = await eventually(lambda: with_deployments(state), within=20)

    assert real_cluster.live("deployments", "qwen", other_namespace) is None
    assert real_cluster.live("services", "qwen", other_namespace) is None
    left = real_cluster.live("fleetmodels", "qwen", other_namespace)
    assert left is not None
    assert "status" not in left
    assert left["metadata"].get("finalizers") is None  # kopf never took it on
    assert left["metadata"]["resourceVersion"] == unwatched["metadata"]["resourceVersion"]
    assert [(d.namespace, d.name) for d in report.deployments] == [(watched, "qwen")]
    assert [n.name for n in report.nodes] == ["gpu-1"]
