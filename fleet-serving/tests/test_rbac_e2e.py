"""The operator with exactly the ClusterRole of ``deploy/base/rbac.yaml``, on a real API server.

The API server runs the OwnerReferencesPermissionEnforcement admission plugin (as OpenShift and
hardened clusters do): an owner reference with ``blockOwnerDeletion`` is refused unless its
author may update the owner's ``finalizers`` subresource. The operator runs as a ServiceAccount
bound to the shipped ClusterRole, so a missing grant shows as an object never made.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_testing.fix_kube import KubeCluster, service_account_kubeconfig
from fleet_testing.waiting import eventually

from .cluster import RealCluster
from .conftest import FM, NODES, Sink, StartOperator, fleetmodel, gpu_node
from .test_manifests import DEPLOY, kustomize

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]
RBAC = "/apis/rbac.authorization.k8s.io/v1"


@pytest.fixture
def shipped_role(fleet_crd: KubeCluster, kube_namespace: str) -> Iterator[str]:
    """The shipped ClusterRole under a name of the test's own, bound to a ServiceAccount
    ``fleet-serving`` in the test's namespace; both removed afterwards."""
    (role,) = [o for o in kustomize(DEPLOY / "base") if o["kind"] == "ClusterRole"]
    name = f"fleet-serving-{secrets.token_hex(3)}"
    role["metadata"] = {"name": name}
    fleet_crd.create(f"{RBAC}/clusterroles", role)
    account = {"metadata": {"name": "fleet-serving"}}
    fleet_crd.create(f"/api/v1/namespaces/{kube_namespace}/serviceaccounts", account)
    binding = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "fleet-serving",
                      "namespace": kube_namespace}],
    }  # fmt: skip
    fleet_crd.create(f"{RBAC}/clusterrolebindings", binding)
    yield name
    fleet_crd.delete(f"{RBAC}/clusterrolebindings/{name}")
    fleet_crd.delete(f"{RBAC}/clusterroles/{name}")


async def test_the_shipped_role_is_enough_to_serve_a_model(
    real_cluster: RealCluster,
    shipped_role: str,
    sink: tuple[Sink, str],
    start_operator: StartOperator,
    tmp_path: Path,
) -> None:
    cluster = real_cluster
    credentials = service_account_kubeconfig(
        cluster.cluster, cluster.namespace, "fleet-serving", tmp_path / "operator.kubeconfig"
    )
    await cluster.create(NODES, gpu_node("gpu-1"))
    # Cluster-wide, as deploy/ runs it (with --namespace kopf also lists namespaces, which the
    # shipped role does not grant).
    await start_operator(sink[1], "--report-interval=30s", credentials=credentials, scoped=False)
    await cluster.create(FM, fleetmodel("qwen"))
    deployment = await eventually(lambda: cluster.live("deployments", "qwen"), within=30)
    assert deployment["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is True
    await eventually(lambda: cluster.live("services", "qwen"), within=20)
    await cluster.serve("qwen", ["10.1.0.7"])
    status = await eventually(lambda: cluster.phase_of("qwen", "Ready"), within=30)
    assert status["endpoints"] == ["http://10.1.0.7:8000"]
