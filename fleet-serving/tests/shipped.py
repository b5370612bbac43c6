"""``deploy/`` as it ships: kustomize's rendering, the operator's reviewed grants, and its RBAC
placed on the real API server.

The grants below are the reviewed list: ``test_manifests`` holds the rendered roles to it and
``test_rbac_can_i_e2e`` holds the API server's answers to it, so a grant added to
``deploy/base/rbac.yaml`` fails both until it is added here too.

On the real API server (shared by the test session) the cluster-scoped objects get names of the
test's own, and the two namespaces (``fleet-system`` for the ServiceAccount, ``fleet-models`` for
the RoleBinding) become the test's: the rules and the shape of the bindings stay as shipped.
"""

from __future__ import annotations

import contextlib
import copy
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet_testing.fix_kube import KubeCluster

__all__ = [
    "CLUSTER_GRANTS",
    "DEPLOY",
    "MODELS_GRANTS",
    "RBAC",
    "Shipped",
    "kustomize",
    "rendered_rbac",
    "shipped_rbac",
]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBECTL = shutil.which("kubectl")
RBAC = "/apis/rbac.authorization.k8s.io/v1"

# Resources as `kubectl auth can-i --list` names them (resource[.group][/subresource]) → verbs.
CLUSTER_GRANTS: dict[str, frozenset[str]] = {
    "nodes": frozenset({"list", "watch"}),  # the inventory, placement
    "customresourcedefinitions.apiextensions.k8s.io": frozenset({"list", "watch"}),  # kopf
    "namespaces": frozenset({"list", "watch"}),  # kopf with --namespace
}
"""The ClusterRole ``fleet-serving``, bound cluster-wide."""
MODELS_GRANTS: dict[str, frozenset[str]] = {
    "fleetmodels.serving.fleet.dev": frozenset({"get", "list", "watch", "patch"}),
    "fleetmodels.serving.fleet.dev/status": frozenset({"get", "patch"}),
    "fleetmodels.serving.fleet.dev/finalizers": frozenset({"update"}),  # blockOwnerDeletion
    "deployments.apps": frozenset({"get", "list", "watch", "create", "patch"}),
    "services": frozenset({"get", "create", "patch"}),
    "poddisruptionbudgets.policy": frozenset({"get", "create", "patch"}),
    "pods": frozenset({"list", "watch"}),
    "endpointslices.discovery.k8s.io": frozenset({"list", "watch"}),
    "events": frozenset({"create"}),  # kopf's handler failures
}
"""The ClusterRole ``fleet-serving-models``, bound in each models namespace only."""

_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "RoleBinding")


def kustomize(path: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize path`` renders."""
    if KUBECTL is None:
        pytest.fail("kubectl (with kustomize) is needed to check deploy/")
    out = subprocess.run([KUBECTL, "kustomize", str(path)], capture_output=True, text=True,
                         check=True, timeout=60).stdout  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out) if doc]


def rendered_rbac() -> dict[str, list[dict[str, Any]]]:
    """The RBAC objects of ``kubectl kustomize deploy/base``, by kind."""
    objects = kustomize(DEPLOY / "base")
    return {kind: [o for o in objects if o["kind"] == kind] for kind in _KINDS}


@dataclass(frozen=True)
class Shipped:
    """Where the shipped RBAC was placed for one test."""

    account_namespace: str
    """Stands for ``fleet-system``: the ServiceAccount's namespace."""
    models_namespace: str
    """Stands for ``fleet-models``: the only namespace with a RoleBinding."""
    account: str

    @property
    def user(self) -> str:
        """The ServiceAccount's user name, for impersonation (``--as``)."""
        return f"system:serviceaccount:{self.account_namespace}:{self.account}"


def _placed(
    rbac: dict[str, list[dict[str, Any]]], names: dict[str, str], account_ns: str, models_ns: str
) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object) for each shipped RBAC object, moved to the test's names."""
    (account,) = copy.deepcopy(rbac["ServiceAccount"])
    account["metadata"]["namespace"] = account_ns
    placed = [(f"/api/v1/namespaces/{account_ns}/serviceaccounts", account)]
    for role in copy.deepcopy(rbac["ClusterRole"]):
        role["metadata"]["name"] = names[role["metadata"]["name"]]
        placed.append((f"{RBAC}/clusterroles", role))
    for binding in copy.deepcopy(rbac["ClusterRoleBinding"] + rbac["RoleBinding"]):
        ref = binding["roleRef"]["name"]
        binding["roleRef"]["name"] = names.get(ref, ref)  # a built-in role keeps its name
        for subject in binding["subjects"]:
            subject["namespace"] = account_ns
        if binding["kind"] == "ClusterRoleBinding":
            binding["metadata"]["name"] = names[binding["metadata"]["name"]]
            placed.append((f"{RBAC}/clusterrolebindings", binding))
        else:
            binding["metadata"]["namespace"] = models_ns
            placed.append((f"{RBAC}/namespaces/{models_ns}/rolebindings", binding))
    return placed


@contextlib.contextmanager
def shipped_rbac(
    cluster: KubeCluster, *, account_namespace: str, models_namespace: str
) -> Iterator[Shipped]:
    """Create the shipped RBAC for the block; the cluster-scoped objects are deleted afterwards
    (the namespaced ones go with the test's namespaces)."""
    rbac = rendered_rbac()
    suffix = secrets.token_hex(3)
    cluster_scoped = rbac["ClusterRole"] + rbac["ClusterRoleBinding"]
    names = {o["metadata"]["name"]: f"{o['metadata']['name']}-{suffix}" for o in cluster_scoped}
    placed = _placed(rbac, names, account_namespace, models_namespace)
    try:
        for path, obj in placed:
            cluster.create(path, obj)
        yield Shipped(account_namespace, models_namespace, placed[0][1]["metadata"]["name"])
    finally:
        for path, obj in reversed(placed):
            if "/namespaces/" not in path:
                cluster.delete(f"{path}/{obj['metadata']['name']}")  # a 404 is ignored
