"""A kubelet (and scheduler) stand-in for end-to-end tests on the real API server.

The tests' Kubernetes control plane (:mod:`fleet_testing.fix_kube`) has no scheduler and no
kubelet. This stand-in plays both for the namespaces it is given, through the API like the real
ones: it registers its Node objects (one with fake ``nvidia.com/gpu`` capacity and GPU
feature-discovery labels, one CPU node), binds each pending pod to a node that fits
(:mod:`.scheduling`), runs the pod's containers as local processes (:mod:`.pods`,
:mod:`.containers`, images by the table in :mod:`.images`), and writes the pod's status — phase,
container states and restart counts, readiness from the pod's own probes, pod IP — so the
kube-controller-manager's EndpointSlice controller and the operator see real endpoints. A pod
deleted through the API has its processes stopped, then is removed (grace period 0), as a
kubelet confirms a deletion.

**Addresses.** Each pod gets its own address, where the engine listens on the port its spec
declares. EndpointSlices refuse loopback addresses (the API server answers ``may not be in the
loopback range (127.0.0.0/8, ::1/128)``), so the stand-in adds a /24 of the benchmarking range
(198.18.0.0/15, RFC 2544; never routed) to the loopback interface for its lifetime —
``198.18.N.0/24``, ``N`` picked free at random, the node's address ``.1``, pods from ``.2`` —
and removes it at the end. That needs root (CAP_NET_ADMIN); without it the stand-in refuses to
start, saying so.

It is a test harness, never part of the product. It is polled, not watched: every 0.2 s it lists
the pods of its namespaces, which keeps it short and is plenty for a test.
"""

from __future__ import annotations

import contextlib
import logging
import random
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from fleet_testing.fix_kube import KubeCluster, KubeError

from . import scheduling
from .containers import PodContext
from .images import Image, fleet_images
from .pods import PodRunner

__all__ = ["Image", "Kubelet", "KubeletError", "fleet_images", "running_kubelet"]

log = logging.getLogger("fleet_testing.kubelet")
INTERVAL_S = 0.2
GPU_LABELS = {
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
    "nvidia.com/gpu.memory": "81920",
    "nvidia.com/gpu.compute.major": "8",
    "nvidia.com/gpu.compute.minor": "0",
    "nvidia.com/gpu.count": "2",
}


class KubeletError(Exception):
    """The stand-in cannot run here."""


def _node(name: str, ip: str, labels: dict[str, str], capacity: dict[str, str]) -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady",
             "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "status": {"capacity": capacity, "allocatable": capacity, "conditions": [ready],
                   "addresses": [{"type": "InternalIP", "address": ip},
                                 {"type": "Hostname", "address": name}]},
    }  # fmt: skip


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise KubeletError(
            f"kubelet stand-in: `ip {' '.join(args)}` failed ({done.stderr.strip()}): pods need "
            "addresses on lo that EndpointSlices accept, which needs root (CAP_NET_ADMIN)"
        )


def _free_subnet() -> str:
    taken = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=False)
    for third in random.sample(range(1, 255), 254):
        prefix = f"198.18.{third}."
        if prefix not in taken.stdout:
            return prefix
    raise KubeletError("kubelet stand-in: no free 198.18.N.0/24 for pod addresses")


class Kubelet:
    """Runs the pods of ``namespaces`` on its two nodes until :meth:`stop`."""

    def __init__(self, cluster: KubeCluster, namespaces: list[str], *, images: Mapping[str, Image],
                 workdir: Path, name: str = "standin") -> None:  # fmt: skip
        self.cluster = cluster
        self.namespaces = namespaces
        self.images = images
        self.workdir = workdir
        self.prefix = _free_subnet()
        self.node_ip = self.prefix + "1"
        self.gpu_node, self.cpu_node = f"{name}-gpu", f"{name}-cpu"
        self.runners: dict[str, PodRunner] = {}
        self.errors: list[str] = []
        self._free = [f"{self.prefix}{n}" for n in range(2, 255)]
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kubelet", daemon=True)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        _ip("addr", "add", f"{self.node_ip}/24", "dev", "lo")
        gpu = {"nvidia.com/gpu": "2", "cpu": "8", "memory": "32Gi", "pods": "110"}
        cpu = {"cpu": "4", "memory": "16Gi", "pods": "110"}
        labels = {"node.kubernetes.io/instance-type": "standin.cpu"}
        for node in (_node(self.gpu_node, self.node_ip, GPU_LABELS, gpu),
                     _node(self.cpu_node, self.node_ip, labels, cpu)):  # fmt: skip
            self.cluster.create_node(node)
            # The API server taints a new node not-ready (TaintNodesByCondition); the node
            # lifecycle controller, off in these tests, would lift it once the node is Ready.
            self.cluster.patch(f"/api/v1/nodes/{node['metadata']['name']}",
                               {"spec": {"taints": None}})  # fmt: skip
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        with self._lock:
            for runner in self.runners.values():
                runner.stop()
            self.runners.clear()
        for node in (self.gpu_node, self.cpu_node):
            self.cluster.delete(f"/api/v1/nodes/{node}")
        with contextlib.suppress(KubeletError):
            _ip("addr", "del", f"{self.node_ip}/24", "dev", "lo")

    def process(self, namespace: str, pod: str, container: str) -> subprocess.Popen[bytes] | None:
        """The running process of a container (a test kills it to see the restart)."""
        with self._lock:
            for runner in self.runners.values():
                if (runner.context.namespace, runner.context.name) == (namespace, pod):
                    return runner.process(container)
        raise KeyError(f"{namespace}/{pod} does not run here")

    # -- the loop ----------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self._sync()
            except Exception as exc:  # the loop outlives a failed round; a test reads errors
                self.errors.append(repr(exc))
                log.exception("kubelet stand-in round failed")
            self._stopping.wait(INTERVAL_S)

    def _pods(self) -> list[dict[str, Any]]:
        pods: list[dict[str, Any]] = []
        for namespace in self.namespaces:
            pods += self.cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
        return pods

    def _sync(self) -> None:
        pods = self._pods()
        mine = (self.gpu_node, self.cpu_node)
        by_node: dict[str, list[dict[str, Any]]] = {n: [] for n in mine}
        for pod in pods:
            if pod["spec"].get("nodeName") in by_node and not _finished(pod):
                by_node[pod["spec"]["nodeName"]].append(pod)
        for pod in pods:
            node = pod["spec"].get("nodeName")
            if pod["metadata"].get("deletionTimestamp"):
                self._finish(pod)
            elif not node:
                self._schedule(pod, by_node)
            elif node in mine:
                self._run(pod)
        live = {p["metadata"]["uid"] for p in pods}
        with self._lock:
            for uid in [u for u in self.runners if u not in live]:
                self._release(self.runners.pop(uid))

    def _schedule(self, pod: dict[str, Any], by_node: dict[str, list[dict[str, Any]]]) -> None:
        nodes = [self.cluster.request("GET", f"/api/v1/nodes/{n}") for n in by_node]
        chosen, why = scheduling.choose_node(pod, nodes, by_node)
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        if chosen is None:
            condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                         "message": why}  # fmt: skip
            self.cluster.patch(f"{path}/status", {"status": {"conditions": [condition]}})
            return
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": meta["name"]},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": chosen}}  # fmt: skip
        with contextlib.suppress(KubeError):  # bound meanwhile, or deleted
            self.cluster.create(f"{path}/binding", binding)
            by_node[chosen].append(pod)

    def _run(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        with self._lock:
            runner = self.runners.get(meta["uid"])
            if runner is None:
                ip = self._free.pop(0)
                root = self.workdir / meta["namespace"] / meta["name"]
                context = PodContext(meta["namespace"], meta["name"], ip, pod["spec"]["nodeName"],
                                     root)  # fmt: skip
                runner = PodRunner(pod, context=context, images=self.images, fetch=self._get)
                self.runners[meta["uid"]] = runner
            runner.step()
            status = runner.status()
        if status != runner.reported:
            path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
            with contextlib.suppress(KubeError):  # deleted meanwhile: the next round sees it
                self.cluster.patch(path, {"status": status})
                runner.reported = status

    def _finish(self, pod: dict[str, Any]) -> None:
        """A deleted pod: stop its processes, then let the API server forget it."""
        meta = pod["metadata"]
        with self._lock:
            runner = self.runners.pop(meta["uid"], None)
            if runner is not None:
                self._release(runner)
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                "preconditions": {"uid": meta["uid"]}}  # fmt: skip
        with contextlib.suppress(KubeError):
            self.cluster.request("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/"
                                 f"{meta['name']}", body)  # fmt: skip

    def _release(self, runner: PodRunner) -> None:
        runner.stop()
        self._free.append(runner.context.ip)

    def _get(self, path: str) -> dict[str, Any] | None:
        return self.cluster.get(path)


def _finished(pod: Mapping[str, Any]) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


@contextlib.contextmanager
def running_kubelet(
    cluster: KubeCluster, namespaces: list[str], *, images: Mapping[str, Image],
    workdir: Path | None = None,
) -> Iterator[Kubelet]:  # fmt: skip
    """A started stand-in for the block; every process it started is stopped afterwards."""
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="fleet-kubelet-"))
            )
        kubelet = Kubelet(cluster, namespaces, images=images, workdir=workdir)
        try:
            kubelet.start()
            yield kubelet
        finally:
            kubelet.stop()
