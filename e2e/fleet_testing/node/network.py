"""The node's own network namespace, joined to the host by one veth pair.

Everything a kubelet does to a network (the CNI bridge, iptables rules, ``ip_forward``,
kube-proxy's chains) happens inside ``/run/netns/<name>``, so the host's iptables and sysctls
stay untouched; the host only gains the veth's end (``198.19.A.B/30``) and routes for the node's
pod CIDR and the cluster's service CIDR through it, which go when the namespace is deleted.
Each node draws its own addresses, so nodes of several test sessions on one machine coexist.
"""

from __future__ import annotations

import contextlib
import ipaddress
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fleet_testing.node.tools import Tools

__all__ = ["NodeNetwork", "node_network"]

NETNS_DIR = Path("/run/netns")


@dataclass(frozen=True)
class NodeNetwork:
    netns: str
    """The namespace's name (``ip netns``); its path is :attr:`netns_path`."""
    host_link: str
    host_ip: str
    node_ip: str
    """The node's address: the kubelet's, CoreDNS's and the one the API server dials."""
    pod_cidr: str
    service_cidr: str

    @property
    def netns_path(self) -> Path:
        return NETNS_DIR / self.netns

    @property
    def dns_ip(self) -> str:
        """The cluster DNS Service's ClusterIP (the tenth of the service range, as kubeadm)."""
        return str(ipaddress.ip_network(self.service_cidr)[10])


def _ip(tools: Tools, *args: str, netns: str | None = None) -> None:
    prefix = ["-n", netns] if netns else []
    subprocess.run([tools["ip"], *prefix, *args], check=True, capture_output=True, text=True)


def _in_use(tools: Tools) -> list[ipaddress.IPv4Network]:
    routes = subprocess.run([tools["ip"], "-4", "route", "show", "table", "all"],
                            check=True, capture_output=True, text=True).stdout  # fmt: skip
    nets: list[ipaddress.IPv4Network] = []
    for line in routes.splitlines():
        word = line.split()[0] if line.split() else ""
        with contextlib.suppress(ValueError):
            if word not in ("default", "local", "broadcast", "unreachable"):
                nets.append(ipaddress.IPv4Network(word, strict=False))
    return nets


def _draw(tools: Tools) -> tuple[ipaddress.IPv4Network, ipaddress.IPv4Network, str]:
    used = _in_use(tools)
    for _ in range(50):
        link = ipaddress.IPv4Network(
            f"198.19.{secrets.randbelow(256)}.{secrets.randbelow(64) * 4}/30"
        )
        pods = ipaddress.IPv4Network(
            f"10.{128 + secrets.randbelow(128)}.{secrets.randbelow(256)}.0/24"
        )
        if not any(link.overlaps(n) or pods.overlaps(n) for n in used):
            return link, pods, secrets.token_hex(3)
    raise RuntimeError("no free 198.19.x.x/30 and 10.x.x.0/24 for a test node after 50 draws")


@contextlib.contextmanager
def node_network(tools: Tools, service_cidr: str) -> Iterator[NodeNetwork]:
    """A namespace, its veth pair and the host's routes into it; all deleted afterwards."""
    link, pods, tag = _draw(tools)
    host_ip, node_ip = str(link[1]), str(link[2])
    network = NodeNetwork(f"fleet-node-{tag}", f"fln{tag}", host_ip, node_ip, str(pods),
                          service_cidr)  # fmt: skip
    netns_dir_existed = NETNS_DIR.exists()
    _ip(tools, "netns", "add", network.netns)
    try:
        _ip(tools, "link", "add", network.host_link, "type", "veth", "peer", "name", "eth0",
            "netns", network.netns)  # fmt: skip
        _ip(tools, "addr", "add", f"{host_ip}/30", "dev", network.host_link)
        _ip(tools, "link", "set", network.host_link, "up")
        _ip(tools, "link", "set", "lo", "up", netns=network.netns)
        _ip(tools, "addr", "add", f"{node_ip}/30", "dev", "eth0", netns=network.netns)
        _ip(tools, "link", "set", "eth0", "up", netns=network.netns)
        _ip(tools, "route", "add", "default", "via", host_ip, netns=network.netns)
        _ip(tools, "route", "add", network.pod_cidr, "via", node_ip, "dev", network.host_link)
        try:
            _ip(tools, "route", "add", service_cidr, "via", node_ip, "dev", network.host_link)
        except subprocess.CalledProcessError as exc:
            if "File exists" not in exc.stderr:
                raise
            # Another node of the same cluster routes its Services already: any node's
            # kube-proxy serves every ClusterIP.
        yield network
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip(tools, "link", "del", network.host_link)  # its routes go with it
        _ip(tools, "netns", "del", network.netns)
        if not netns_dir_existed:
            _drop_netns_dir()


def _drop_netns_dir() -> None:
    """``ip netns add`` made /run/netns a mount of its own; take it back once it is empty (a
    namespace someone else made meanwhile keeps it)."""
    with contextlib.suppress(OSError):
        if not any(NETNS_DIR.iterdir()):
            subprocess.run(["umount", str(NETNS_DIR)], check=True, capture_output=True)
            NETNS_DIR.rmdir()
