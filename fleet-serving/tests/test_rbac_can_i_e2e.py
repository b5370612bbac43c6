"""What the operator's ServiceAccount may do, asked of the real API server: ``kubectl auth can-i``.

The shipped RBAC (``deploy/base/rbac.yaml``, placed by :func:`shipped.shipped_rbac`) on the real
kube-apiserver with RBAC, and the real kubectl impersonating the ServiceAccount
(``--as=system:serviceaccount:<ns>:fleet-serving``, as the admin may): each row of the matrix is
one question and its expected answer. Then ``kubectl auth can-i --list`` in the models namespace,
in the ServiceAccount's own namespace and in ``default``: what the account may do beyond what any
ServiceAccount may (an unbound one, asked the same) must be exactly the reviewed grants, so a new
grant cannot slip in unreviewed.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_testing import kube_build
from fleet_testing.fix_kube import KubeCluster

from .shipped import CLUSTER_GRANTS, MODELS_GRANTS, Shipped, shipped_rbac

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

MODELS, ACCOUNT, ANY, CLUSTER = "<models>", "<account>", "<any>", ""
"""Namespaces in the table: the models namespace (``fleet-models``), the ServiceAccount's
(``fleet-system``), every namespace (``--all-namespaces``), none (a cluster-scoped resource)."""

REFUSED: list[tuple[str, str, str]] = [
    # Workloads anywhere but the models namespace: a pod in kube-system is the cluster.
    ("create", "deployments.apps", "kube-system"),
    ("create", "deployments.apps", "default"),
    ("create", "deployments.apps", ACCOUNT),
    ("patch", "deployments.apps", "kube-system"),
    ("create", "pods", "kube-system"),
    ("create", "pods", "default"),
    ("create", "pods", MODELS),  # Deployments only, which Pod Security checks
    ("create", "daemonsets.apps", MODELS),
    ("create", "jobs.batch", MODELS),
    ("patch", "services", "default"),
    ("create", "poddisruptionbudgets.policy", "default"),
    ("patch", "poddisruptionbudgets.policy", "kube-system"),
    ("list", "fleetmodels.serving.fleet.dev", "default"),
    ("create", "events", "kube-system"),
    # No deletes (owner references do that), no replacing.
    ("delete", "deployments.apps", MODELS),
    ("update", "deployments.apps", MODELS),
    ("delete", "fleetmodels.serving.fleet.dev", MODELS),
    ("create", "fleetmodels.serving.fleet.dev", MODELS),
    ("delete", "services", MODELS),
    ("delete", "poddisruptionbudgets.policy", MODELS),
    ("update", "poddisruptionbudgets.policy", MODELS),
    # Evicting is a drain's job, not the operator's.
    ("create", "pods/eviction", MODELS),
    ("deletecollection", "pods", MODELS),
    # Secrets, anywhere, the models namespace included.
    ("get", "secrets", MODELS),
    ("list", "secrets", MODELS),
    ("watch", "secrets", MODELS),
    ("get", "secrets", ACCOUNT),
    ("list", "secrets", "kube-system"),
    ("get", "secrets", "default"),
    ("list", "secrets", ANY),
    ("get", "configmaps", MODELS),
    # Into running pods.
    ("create", "pods/exec", MODELS),
    ("get", "pods/exec", MODELS),
    ("create", "pods/attach", MODELS),
    ("create", "pods/portforward", MODELS),
    ("patch", "pods/ephemeralcontainers", MODELS),
    ("get", "pods/log", MODELS),
    ("patch", "pods", MODELS),
    # Nodes: read only.
    ("patch", "nodes", CLUSTER),
    ("update", "nodes", CLUSTER),
    ("delete", "nodes", CLUSTER),
    ("patch", "nodes/status", CLUSTER),
    ("get", "nodes/proxy", CLUSTER),
    # RBAC and identities: no way to grant itself more.
    ("create", "clusterroles.rbac.authorization.k8s.io", CLUSTER),
    ("escalate", "clusterroles.rbac.authorization.k8s.io", CLUSTER),
    ("bind", "clusterroles.rbac.authorization.k8s.io", CLUSTER),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", CLUSTER),
    ("create", "rolebindings.rbac.authorization.k8s.io", MODELS),
    ("patch", "rolebindings.rbac.authorization.k8s.io", MODELS),
    ("create", "roles.rbac.authorization.k8s.io", MODELS),
    ("escalate", "roles.rbac.authorization.k8s.io", MODELS),
    ("bind", "roles.rbac.authorization.k8s.io", MODELS),
    ("create", "serviceaccounts/token", MODELS),
    ("create", "serviceaccounts/token", ACCOUNT),
    ("create", "serviceaccounts", MODELS),
    ("impersonate", "users", CLUSTER),
    ("impersonate", "serviceaccounts", MODELS),
    ("create", "certificatesigningrequests.certificates.k8s.io", CLUSTER),
    # The cluster's shape.
    ("create", "customresourcedefinitions.apiextensions.k8s.io", CLUSTER),
    ("delete", "customresourcedefinitions.apiextensions.k8s.io", CLUSTER),
    ("patch", "customresourcedefinitions.apiextensions.k8s.io", CLUSTER),
    ("create", "namespaces", CLUSTER),
    ("delete", "namespaces", CLUSTER),
    ("patch", "namespaces", CLUSTER),
    ("create", "mutatingwebhookconfigurations.admissionregistration.k8s.io", CLUSTER),
    # Everything.
    ("*", "*", MODELS),
    ("*", "*", ANY),
]
"""(verb, resource[/subresource], namespace): each must be refused."""

ALLOWED: list[tuple[str, str, str]] = [
    *[(verb, name, MODELS) for name, verbs in MODELS_GRANTS.items() for verb in sorted(verbs)],
    *[(verb, name, CLUSTER) for name, verbs in CLUSTER_GRANTS.items() for verb in sorted(verbs)],
]
"""Each reviewed grant, asked in the namespace it is granted in."""

_ROW = re.compile(  # Resources, Non-Resource URLs, Resource Names, Verbs
    r"^(?P<resource>\S*)\s+\[(?P<urls>[^]]*)\]\s+\[(?P<names>[^]]*)\]\s+\[(?P<verbs>[^]]*)\]$"
)


def kubectl(cluster: KubeCluster, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real kubectl (from the Kubernetes build the fixtures use), as the admin."""
    if kube_build.missing(names=("kubectl",)):
        pytest.fail(f"no kubectl in {kube_build.bin_dir()}: run make kube", pytrace=False)
    argv = [str(kube_build.bin_dir() / "kubectl"), f"--kubeconfig={cluster.kubeconfig}",
            f"--cache-dir={cache}", *args]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


class CanI:
    """``kubectl auth can-i`` as one user, with the table's namespace placeholders filled in."""

    def __init__(
        self, cluster: KubeCluster, cache: Path, user: str, spaces: dict[str, str]
    ) -> None:
        self.cluster, self.cache, self.user, self.spaces = cluster, cache, user, spaces

    def _scope(self, namespace: str) -> list[str]:
        if namespace in (ANY, CLUSTER):  # no namespace: kubectl would add its context's
            return ["--all-namespaces"]
        return [f"--namespace={self.spaces.get(namespace, namespace)}"]

    def ask(self, verb: str, resource: str, namespace: str) -> bool:
        plural, _, sub = resource.partition("/")
        args = ["auth", "can-i", verb, plural, *([f"--subresource={sub}"] if sub else [])]
        args += [*self._scope(namespace), f"--as={self.user}"]
        done = kubectl(self.cluster, self.cache, *args)
        # An unknown resource (a typo in the table) is a warning and a "no": not a pass.
        assert not done.stderr, (args, done.stderr)
        answer = done.stdout.strip()
        assert answer in ("yes", "no") or answer.startswith("no -"), (args, answer)
        return answer == "yes"

    def listed(self, namespace: str) -> set[tuple[str, str]]:
        """(resource or non-resource URL, verb) for every row ``--list`` prints."""
        args = ["auth", "can-i", "--list", "--no-headers", f"--as={self.user}"]
        done = kubectl(self.cluster, self.cache, *args, *self._scope(namespace))
        assert done.returncode == 0, done.stderr
        found: set[tuple[str, str]] = set()
        for line in done.stdout.splitlines():
            row = _ROW.match(line.rstrip())
            assert row is not None, f"unparsed row: {line!r}"
            assert not row["names"], f"a grant limited to resource names: {line!r}"
            what = row["resource"] or row["urls"]
            found |= {(what, verb) for verb in row["verbs"].split()}
        return found


@pytest.fixture
def shipped(
    fleet_crd: KubeCluster, kube_namespace: str, account_namespace: str
) -> Iterator[Shipped]:
    """The shipped RBAC: the ServiceAccount in ``account_namespace`` (fleet-system), the
    RoleBinding in the test's namespace (fleet-models); plus an unbound ServiceAccount beside it,
    the baseline any ServiceAccount has."""
    fleet_crd.create(f"/api/v1/namespaces/{account_namespace}/serviceaccounts",
                     {"metadata": {"name": "unbound"}})  # fmt: skip
    with shipped_rbac(
        fleet_crd, account_namespace=account_namespace, models_namespace=kube_namespace
    ) as placed:
        yield placed


def can_i(cluster: KubeCluster, tmp_path: Path, shipped: Shipped, account: str) -> CanI:
    spaces = {MODELS: shipped.models_namespace, ACCOUNT: shipped.account_namespace}
    user = f"system:serviceaccount:{shipped.account_namespace}:{account}"
    return CanI(cluster, tmp_path / "kubectl-cache", user, spaces)


def test_the_api_server_answers_the_matrix(
    fleet_crd: KubeCluster, shipped: Shipped, tmp_path: Path
) -> None:
    operator = can_i(fleet_crd, tmp_path, shipped, shipped.account)
    wrong = [f"{verb} {resource} in {namespace or '(cluster)'}: expected {expected}"
             for expected, rows in (("yes", ALLOWED), ("no", REFUSED))
             for verb, resource, namespace in rows
             if operator.ask(verb, resource, namespace) != (expected == "yes")]  # fmt: skip
    assert not wrong, "\n".join(wrong)


def test_the_listed_grants_are_exactly_the_reviewed_ones(
    fleet_crd: KubeCluster, shipped: Shipped, tmp_path: Path
) -> None:
    operator = can_i(fleet_crd, tmp_path, shipped, shipped.account)
    unbound = can_i(fleet_crd, tmp_path, shipped, "unbound")
    cluster_wide = {(name, verb) for name, verbs in CLUSTER_GRANTS.items() for verb in verbs}
    in_models = {(name, verb) for name, verbs in MODELS_GRANTS.items() for verb in verbs}
    expected = {MODELS: cluster_wide | in_models, ACCOUNT: cluster_wide, "default": cluster_wide}
    for namespace, wanted in expected.items():
        beyond = operator.listed(namespace) - unbound.listed(namespace)
        unreviewed, missing = sorted(beyond - wanted), sorted(wanted - beyond)
        assert beyond == wanted, f"in {namespace}: unreviewed {unreviewed}, missing {missing}"
