"""A real node (containerd, kubelet, kube-proxy, kube-scheduler, CoreDNS) on the session's
control plane: :mod:`fleet_testing.node`. Needs root; without a tool it names the package to
install.

Fixture: ``kube_node`` (session), after ``kube_cluster``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleet_testing.fix_kube import KubeCluster
from fleet_testing.node import KubeNode, MissingTool, running_node

__all__ = ["kube_node"]


@pytest.fixture(scope="session")
def kube_node(kube_cluster: KubeCluster) -> Iterator[KubeNode]:
    """One node for the whole session."""
    try:
        context = running_node(kube_cluster)
        node = context.__enter__()
    except MissingTool as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield node
    finally:
        context.__exit__(None, None, None)
