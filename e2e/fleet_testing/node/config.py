"""The node's files: client certificates and kubeconfigs minted against the test cluster's CA,
containerd's config (CRI, its own root and state), the CNI bridge network, the kubelet's and
kube-proxy's configurations and CoreDNS's Corefile. Pure writing: nothing here starts a process.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from fleet_testing.kube_build import PAUSE_IMAGE
from fleet_testing.node.network import NodeNetwork
from fleet_testing.node.tools import Tools

__all__ = ["NodeFiles", "write_all"]

API_PORT = 6443
"""Where the relay (:mod:`fleet_testing.node.relay`) answers for the API server in the node."""


@dataclass(frozen=True)
class NodeFiles:
    root: Path
    name: str
    containerd_config: Path
    containerd_socket: Path
    kubelet_config: Path
    kubelet_kubeconfig: Path
    proxy_config: Path
    scheduler_kubeconfig: Path
    dns_kubeconfig: Path
    corefile: Path
    cgroup_root: str

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"


def _client_cert(cluster_dir: Path, out: Path, name: str, subject: str) -> tuple[Path, Path]:
    """``name``.crt/.key for ``subject``, signed by the test cluster's CA."""
    key, csr, crt = out / f"{name}.key", out / f"{name}.csr", out / f"{name}.crt"
    subprocess.run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", subject],
                   check=True, capture_output=True)  # fmt: skip
    subprocess.run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(cluster_dir / "ca.crt"),
                    "-CAkey", str(cluster_dir / "ca.key"), "-CAcreateserial", "-days", "2",
                    "-out", str(crt)], check=True, capture_output=True)  # fmt: skip
    key.chmod(0o600)
    return crt, key


def _kubeconfig(path: Path, ca: Path, user: str, crt: Path, key: Path) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {
            "server": f"https://127.0.0.1:{API_PORT}", "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {
            "client-certificate": str(crt), "client-key": str(key)}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}],
        "current-context": "test",
    }  # fmt: skip
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


def _containerd(root: Path, tools: Tools) -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{root}/containerd/root"
state = "{root}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{root}/containerd/containerd.sock"
[ttrpc]
  address = "{root}/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/containerd/opt"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # Root here lacks CAP_SYS_RESOURCE: without this runc fails every sandbox on oom_score_adj.
  restrict_oom_score_adj = true
  # Pods' network namespaces under the state dir, not /run/netns: teardown unmounts them with
  # everything else under the node's directory, even when the kubelet could not stop a sandbox.
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "{tools["runc"]}"
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{tools.cni_bin}"
    conf_dir = "{root}/cni/net.d"
"""


def _cni(root: Path, network: NodeNetwork) -> str:
    return json.dumps({
        "cniVersion": "1.0.0",
        "name": "fleet",
        "plugins": [{
            "type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
            "hairpinMode": True,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": network.pod_cidr}]],
                     "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(root / "cni" / "ipam")},
        }],
    }, indent=1)  # fmt: skip


def _kubelet(files: NodeFiles, network: NodeNetwork, ca: Path) -> dict[str, object]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,  # this machine has cgroup v1 only
        "cgroupRoot": files.cgroup_root,
        "containerRuntimeEndpoint": f"unix://{files.containerd_socket}",
        "podLogsDir": str(files.pod_logs),
        "address": network.node_ip,
        "healthzBindAddress": "127.0.0.1",
        "readOnlyPort": 0,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "AlwaysAllow"},  # any client the cluster's CA signed
        "clusterDNS": [network.dns_ip],
        "clusterDomain": "cluster.local",
        "resolvConf": str(files.root / "resolv.conf"),
        "failSwapOn": False,
        "maxPods": 30,
        "imageGCHighThresholdPercent": 100,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
        },
        "serializeImagePulls": False,
        "shutdownGracePeriod": "0s",
    }


def _proxy(network: NodeNetwork, kubeconfig: Path, name: str) -> dict[str, object]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": name,
        "clusterCIDR": network.pod_cidr,
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": "127.0.0.1:10256",
        # Leave the machine-wide conntrack sysctls alone.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }


def _corefile(network: NodeNetwork, kubeconfig: Path) -> str:
    return f""".:53 {{
    bind {network.node_ip}
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} test
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
}}
"""


def write_all(root: Path, name: str, network: NodeNetwork, cluster_dir: Path,
              tools: Tools) -> NodeFiles:  # fmt: skip
    """Every file of node ``name`` under ``root``."""
    pki = root / "pki"
    for sub in ("pki", "cni/net.d", "cni/ipam", "containerd", "kubelet", "pod-logs"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    ca = cluster_dir / "ca.crt"
    kubelet_cert = _client_cert(
        cluster_dir, pki, "kubelet", f"/O=system:nodes/CN=system:node:{name}"
    )
    proxy_cert = _client_cert(cluster_dir, pki, "proxy", "/CN=system:kube-proxy")
    scheduler_cert = _client_cert(cluster_dir, pki, "scheduler", "/CN=system:kube-scheduler")
    files = NodeFiles(
        root=root,
        name=name,
        containerd_config=root / "containerd" / "config.toml",
        containerd_socket=root / "containerd" / "containerd.sock",
        kubelet_config=root / "kubelet.yaml",
        kubelet_kubeconfig=_kubeconfig(root / "kubelet.kubeconfig", ca, "kubelet", *kubelet_cert),
        proxy_config=root / "kube-proxy.yaml",
        scheduler_kubeconfig=_kubeconfig(
            root / "scheduler.kubeconfig", ca, "scheduler", *scheduler_cert
        ),
        dns_kubeconfig=_kubeconfig(
            root / "coredns.kubeconfig",
            ca,
            "admin",
            cluster_dir / "admin.crt",
            cluster_dir / "admin.key",
        ),
        corefile=root / "Corefile",
        cgroup_root=f"/{name}",
    )
    proxy_kubeconfig = _kubeconfig(root / "proxy.kubeconfig", ca, "proxy", *proxy_cert)
    files.containerd_config.write_text(_containerd(root, tools))
    (root / "cni" / "net.d" / "10-fleet.conflist").write_text(_cni(root, network))
    (root / "resolv.conf").write_text("options ndots:1\n")
    files.kubelet_config.write_text(json.dumps(_kubelet(files, network, ca), indent=1))
    files.proxy_config.write_text(json.dumps(_proxy(network, proxy_kubeconfig, name), indent=1))
    files.corefile.write_text(_corefile(network, files.dns_kubeconfig))
    return files
