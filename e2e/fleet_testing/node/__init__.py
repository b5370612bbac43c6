"""A real Kubernetes node for the tests: containerd, kubelet, kube-proxy, kube-scheduler and
CoreDNS on the test control plane (:mod:`fleet_testing.fix_kube`), all inside a network
namespace of their own, and taken down leaving nothing on the host.

:func:`running_node` starts, in order: the network (:mod:`.network`), the files
(:mod:`.config`: client certificates minted with the cluster's CA, containerd's CRI config,
the CNI bridge, the kubelet's and kube-proxy's configurations), a relay that answers for the
API server inside the namespace (:mod:`.relay`), containerd (the ``pause`` image imported), the
kubelet (Node ``Ready``; the ``not-ready`` taint lifted, as the node lifecycle controller that
fix_kube leaves off would), kube-proxy (iptables), the scheduler and CoreDNS behind the
``kube-system/kube-dns`` Service. Teardown (:mod:`.teardown`) reverses it all.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from fleet_testing import kube_build
from fleet_testing.fix_kube import KubeCluster, KubeError
from fleet_testing.node import config, host, teardown
from fleet_testing.node.daemons import Daemons
from fleet_testing.node.network import NodeNetwork, node_network
from fleet_testing.node.tools import MissingTool, Tools, find
from fleet_testing.waiting import eventually_blocking

__all__ = ["KubeNode", "MissingTool", "running_node"]

READY_WITHIN_S = 90.0


@dataclass(frozen=True)
class KubeNode:
    """A running node, with the commands a test needs on it."""

    name: str
    cluster: KubeCluster
    network: NodeNetwork
    files: config.NodeFiles
    tools: Tools
    binaries: Path
    daemons: Daemons

    def ctr(self, *args: str) -> str:
        argv = [self.tools["ctr"], "--address", str(self.files.containerd_socket), "-n", "k8s.io",
                *args]  # fmt: skip
        return subprocess.run(argv, check=True, capture_output=True, text=True).stdout

    def import_image(self, archive: Path) -> None:
        """Load an image archive (docker-archive or OCI) into the node's containerd."""
        self.ctr("images", "import", "--no-unpack", str(archive))

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        """The built kubectl, as the cluster's admin; its stdout."""
        argv = [str(self.binaries / "kubectl"), f"--kubeconfig={self.cluster.kubeconfig}",
                f"--cache-dir={self.files.root / 'kubectl-cache'}", *args]  # fmt: skip
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def expose(self, port: int) -> str:
        """A host process listening on the host's 127.0.0.1:``port``, reachable from pods (and
        the host) as the returned URL on the node's address."""
        self.daemons.relay(port, port, address=self.network.node_ip, name=f"relay-{port}")
        return f"http://{self.network.node_ip}:{port}"

    def container_pid(self, container_id: str) -> int | None:
        """The host PID of a container's process (``containerd://<id>`` from a pod's status)."""
        wanted = container_id.removeprefix("containerd://")
        for line in self.ctr("tasks", "list").splitlines()[1:]:
            task, pid, state = line.split()[:3]
            if task == wanted and state == "RUNNING":
                return int(pid)
        return None

    def pod_logs(self, namespace: str) -> dict[str, str]:
        """Every container log of ``namespace``'s pods on this node, by ``pod/container``."""
        logs = {}
        for path in sorted(self.files.pod_logs.glob(f"{namespace}_*/*/*.log")):
            pod = path.parent.parent.name.split("_")[1]
            logs[f"{pod}/{path.parent.name}/{path.stem}"] = path.read_text(errors="replace")
        return logs

    def report(self, namespaces: tuple[str, ...]) -> str:
        """What a failing test shows: pods and events of ``namespaces``, and the tail of each
        container's log, the previous run's of a restarted one too (kubectl logs --previous)."""
        parts = [self.kubectl("get", "pods", "-A", "-o", "wide", check=False)]
        for namespace in namespaces:
            parts.append(self.kubectl("-n", namespace, "get", "events", "--sort-by=.lastTimestamp",
                                      check=False)[-4000:])  # fmt: skip
            for name, text in self.pod_logs(namespace).items():
                parts.append(f"--- {name}\n{text[-3000:]}")
            pods = json.loads(self.kubectl("-n", namespace, "get", "pods", "-o", "json"))
            for pod in pods["items"]:
                name = pod["metadata"]["name"]
                for status in pod.get("status", {}).get("containerStatuses", []):
                    if status.get("restartCount"):
                        container = status["name"]
                        said = self.kubectl("-n", namespace, "logs", "--previous", "-c",
                                            container, name, check=False)  # fmt: skip
                        parts.append(f"--- {name}/{container} (previous)\n{said[-3000:]}")
        return "\n".join(parts)

    def logs(self) -> str:
        """The tail of every daemon's log (for a failing test's report)."""
        names = ("containerd", "kubelet", "kube-proxy", "kube-scheduler", "coredns", "relay")
        return "\n".join(f"--- {n}\n{self.daemons.log_tail(n)}" for n in names)


def _node_ready(cluster: KubeCluster, name: str, daemons: Daemons) -> bool:
    daemons.check()
    node = cluster.get(f"/api/v1/nodes/{name}")
    conditions = (node or {}).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _lift_not_ready_taint(cluster: KubeCluster, name: str) -> None:
    node = cluster.request("GET", f"/api/v1/nodes/{name}")
    taints = [t for t in node["spec"].get("taints", [])
              if not t["key"].startswith("node.kubernetes.io/not-ready")]  # fmt: skip
    cluster.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": taints or None}})


def _dns_service(cluster: KubeCluster, network: NodeNetwork) -> None:
    """``kube-system/kube-dns`` at the cluster's DNS address, its endpoint CoreDNS on the node
    (CoreDNS runs as a node daemon, not a pod: see docs/e2e.md)."""
    ports = [{"name": "dns", "port": 53, "protocol": "UDP"},
             {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]  # fmt: skip
    with contextlib.suppress(KubeError):  # a second node on the same cluster
        cluster.create("/api/v1/namespaces/kube-system/services", {
            "metadata": {"name": "kube-dns", "labels": {"k8s-app": "kube-dns"}},
            "spec": {"clusterIP": network.dns_ip, "ports": ports},
        })  # fmt: skip
    cluster.create("/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices", {
        "metadata": {"name": f"kube-dns-{network.netns}",
                     "labels": {"kubernetes.io/service-name": "kube-dns"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [network.node_ip], "conditions": {"ready": True}}],
        "ports": ports,
    })  # fmt: skip


def _api_for_pods(cluster: KubeCluster, network: NodeNetwork) -> None:
    """The ``kubernetes`` Service's endpoint: the relay on the node's address, so a pod's
    in-cluster client (the operator's) reaches the API server. The API server keeps no endpoints
    of its own (it listens on the host's loopback, ``--endpoint-reconciler-type=none``)."""
    cluster.create("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", {
        "metadata": {"name": f"kubernetes-{network.netns}",
                     "labels": {"kubernetes.io/service-name": "kubernetes"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [network.node_ip], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": config.API_PORT, "protocol": "TCP"}],
    })  # fmt: skip


def _start(node: KubeNode, api_port: int) -> None:
    files, bins, daemons, net = node.files, node.binaries, node.daemons, node.network
    daemons.relay(config.API_PORT, api_port)
    daemons.relay(config.API_PORT, api_port, address=net.node_ip, name="relay-api-pods")
    daemons.start(
        "containerd", [node.tools["containerd"], "--config", str(files.containerd_config)]
    )

    def containerd_answers() -> bool:
        daemons.check()
        with contextlib.suppress(subprocess.CalledProcessError):
            return bool(node.ctr("version"))
        return False

    eventually_blocking(containerd_answers, within=30, what="containerd answering", interval=0.1)
    node.import_image(bins / "pause.tar")
    daemons.start("kubelet", [
        str(bins / "kubelet"), f"--config={files.kubelet_config}",
        f"--kubeconfig={files.kubelet_kubeconfig}", f"--root-dir={files.kubelet_dir}",
        f"--cert-dir={files.root / 'kubelet-pki'}", f"--hostname-override={node.name}",
        f"--node-ip={net.node_ip}", "--node-labels=fleet.test/node=real", "--v=1",
    ])  # fmt: skip
    eventually_blocking(lambda: _node_ready(node.cluster, node.name, daemons),
                        within=READY_WITHIN_S, what=lambda: f"node Ready\n{node.logs()}",
                        interval=0.2)  # fmt: skip
    _lift_not_ready_taint(node.cluster, node.name)
    daemons.start("kube-proxy", [str(bins / "kube-proxy"), f"--config={files.proxy_config}",
                                 "--v=1"])  # fmt: skip
    kubeconfig = str(files.scheduler_kubeconfig)
    daemons.start("kube-scheduler", [
        str(bins / "kube-scheduler"), f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false", "--bind-address=127.0.0.1", "--v=1",
    ])  # fmt: skip
    daemons.start("coredns", [str(bins / "coredns"), "-conf", str(files.corefile)])
    _dns_service(node.cluster, net)
    _api_for_pods(node.cluster, net)


def _binaries() -> Path:
    absent = kube_build.missing(names=kube_build.NODE)
    if absent:
        raise MissingTool(f"no {', '.join(absent)} in {kube_build.bin_dir()}: run `make kube`")
    return kube_build.bin_dir()


@contextlib.contextmanager
def running_node(cluster: KubeCluster) -> Iterator[KubeNode]:
    """A node of ``cluster`` for the block; everything it started or changed undone after."""
    tools, binaries = find(), _binaries()
    sysctls = host.read_sysctls()
    kubelet_var = Path("/var/lib/kubelet")
    kubelet_var_existed = kubelet_var.exists()
    root = Path(tempfile.mkdtemp(prefix="fleet-node-", dir="/tmp"))
    try:
        with node_network(tools, cluster.service_cidr) as network:
            name = network.netns
            files = config.write_all(root, name, network, cluster.workdir, tools)
            host.make_cgroup_root(files.cgroup_root)
            daemons = Daemons(tools, network.netns_path, root)
            node = KubeNode(name, cluster, network, files, tools, binaries, daemons)
            try:
                _start(node, urlparse(cluster.server).port or 443)
                yield node
            finally:
                teardown.take_down(node)
    finally:
        host.restore_sysctls(sysctls)
        if not kubelet_var_existed:
            shutil.rmtree(kubelet_var, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
