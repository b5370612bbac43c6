"""The operator with exactly the RBAC of ``deploy/base/rbac.yaml``, on a real API server.

As shipped: its ServiceAccount in one namespace (``fleet-system``), the cluster-wide ClusterRole
bound by a ClusterRoleBinding, the namespaced one by a RoleBinding in the models namespace only,
and the operator run with ``--namespace`` for that namespace. The API server runs the
OwnerReferencesPermissionEnforcement admission plugin (as OpenShift and hardened clusters do): an
owner reference with ``blockOwnerDeletion`` is refused unless its author may update the owner's
``finalizers`` subresource. A missing grant shows as an object never made.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_contract import InventoryReport
from fleet_testing.fix_kube import KubeCluster, service_account_kubeconfig
from fleet_testing.waiting import eventually

from .cluster import RealCluster
from .conftest import FM, NODES, Sink, StartOperator, fleetmodel, gpu_node
from .shipped import Shipped, shipped_rbac

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


def with_deployments(sink: Sink) -> InventoryReport | None:
    report = sink.latest()
    return report if report is not None and report.deployments else None


@pytest.fixture
def shipped(
    fleet_crd: KubeCluster, kube_namespace: str, account_namespace: str
) -> Iterator[Shipped]:
    """The shipped RBAC: the ServiceAccount in ``account_namespace``, the RoleBinding in the
    test's namespace (the models namespace, which ``start_operator`` passes as ``--namespace``)."""
    with shipped_rbac(
        fleet_crd, account_namespace=account_namespace, models_namespace=kube_namespace
    ) as placed:
        yield placed


async def test_the_shipped_rbac_is_enough_to_serve_a_model(
    real_cluster: RealCluster,
    shipped: Shipped,
    sink: tuple[Sink, str],
    start_operator: StartOperator,
    tmp_path: Path,
) -> None:
    cluster = real_cluster
    credentials = service_account_kubeconfig(
        cluster.cluster, shipped.account_namespace, shipped.account, tmp_path / "sa.kubeconfig"
    )
    await cluster.create(NODES, gpu_node("gpu-1"))
    operator = await start_operator(sink[1], "--report-interval=30s", credentials=credentials)
    await cluster.create(FM, fleetmodel("qwen"))
    deployment = await eventually(lambda: cluster.live("deployments", "qwen"), within=30)
    assert deployment["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is True
    await eventually(lambda: cluster.live("services", "qwen"), within=20)
    budget = await eventually(lambda: cluster.live("poddisruptionbudgets", "qwen"), within=20)
    assert budget["metadata"]["ownerReferences"] == deployment["metadata"]["ownerReferences"]
    await cluster.serve("qwen", ["10.1.0.7"])
    status = await eventually(lambda: cluster.phase_of("qwen", "Ready"), within=30)
    assert status["endpoints"] == ["http://10.1.0.7:8000"]
    report = await eventually(lambda: with_deployments(sink[0]), within=30)
    assert [n.name for n in report.nodes] == ["gpu-1"]
    assert [(d.namespace, d.name) for d in report.deployments] == [(cluster.namespace, "qwen")]
    # Every request it made was allowed: kopf and the operator log a refused one (403 Forbidden).
    assert "Forbidden" not in operator.output()
