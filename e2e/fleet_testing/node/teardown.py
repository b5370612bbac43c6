"""Taking a node down so that nothing of it stays on the host.

Shims and containers outlive containerd and the kubelet, so the order matters: the node's pods
are deleted (not forced: the kubelet stops their containers and sandboxes, and confirms), the
scheduler, CoreDNS and kube-proxy stop (``kube-proxy --cleanup`` flushes its chains), then the
kubelet; what containerd still runs is killed and deleted through ``ctr``; containerd and the
relay stop; any process still in the node's cgroups or naming its directory is killed; the mounts
under its directory are unmounted and its cgroups removed; the Node object is deleted. The
network namespace (its bridge, iptables and sysctls with it) goes when :func:`.network.node_network`
ends, and the kubelet's machine-wide sysctls are restored by :func:`..running_node`.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from typing import TYPE_CHECKING

from fleet_testing.fix_kube import KubeError
from fleet_testing.node import host

if TYPE_CHECKING:
    from fleet_testing.node import KubeNode

__all__ = ["take_down"]

PODS_GONE_WITHIN_S = 60.0


def _pods_on(node: KubeNode) -> list[tuple[str, str]]:
    answer = node.cluster.request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName={node.name}")
    return [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in answer["items"]]


def _delete_pods(node: KubeNode) -> None:
    kubelet = node.daemons.started.get("kubelet")
    if kubelet is None or kubelet.poll() is not None:
        return
    with contextlib.suppress(KubeError, OSError):
        for namespace, name in _pods_on(node):
            node.cluster.delete(f"/api/v1/namespaces/{namespace}/pods/{name}")
        deadline = time.monotonic() + PODS_GONE_WITHIN_S
        while _pods_on(node) and time.monotonic() < deadline:
            time.sleep(0.2)


def _ctr_lines(node: KubeNode, *args: str) -> list[str]:
    with contextlib.suppress(subprocess.CalledProcessError):
        return node.ctr(*args).split()
    return []


def _delete_containers(node: KubeNode) -> None:
    """What containerd still runs, through containerd itself (its shims then exit)."""
    if "containerd" not in node.daemons.started:
        return
    for task in _ctr_lines(node, "tasks", "list", "-q"):
        with contextlib.suppress(subprocess.CalledProcessError):
            node.ctr("tasks", "kill", "-s", "SIGKILL", task)
    for task in _ctr_lines(node, "tasks", "list", "-q"):
        with contextlib.suppress(subprocess.CalledProcessError):
            node.ctr("tasks", "delete", "-f", task)
    for container in _ctr_lines(node, "containers", "list", "-q"):
        with contextlib.suppress(subprocess.CalledProcessError):
            node.ctr("containers", "delete", container)


def take_down(node: KubeNode) -> None:
    daemons = node.daemons
    _delete_pods(node)
    for name in ("coredns", "kube-scheduler", "kube-proxy"):
        daemons.stop(name)
    if (node.binaries / "kube-proxy").exists():
        cleanup = daemons.start("kube-proxy-cleanup", [str(node.binaries / "kube-proxy"),
                                                       "--cleanup"])  # fmt: skip
        with contextlib.suppress(subprocess.TimeoutExpired):
            cleanup.wait(30)
        daemons.stop("kube-proxy-cleanup")
    daemons.stop("kubelet", grace=15)
    _delete_containers(node)
    daemons.stop_all()
    host.kill_processes_under(node.files.cgroup_root, node.files.root)
    host.unmount_under(node.files.root)
    host.remove_cgroup_root(node.files.cgroup_root)
    with contextlib.suppress(KubeError, OSError):
        node.cluster.delete(f"/api/v1/nodes/{node.name}")
        node.cluster.delete(
            f"/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices/kube-dns-{node.name}"
        )
