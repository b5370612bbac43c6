"""One face for the two Kubernetes APIs the operator's end-to-end tests run against.

``KmockCluster`` is kmock over loopback (fast; the tests play every controller), ``RealCluster`` is
a real etcd + kube-apiserver + kube-controller-manager (``fleet_testing.fix_kube``), where the
Deployment, ReplicaSet, EndpointSlice and garbage-collection controllers are real and the tests
play only the scheduler and the kubelet. Tests are written once against this face, with paths in
the ``default`` namespace; the real cluster moves them into the test's own namespace.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fleet_testing.fix_kube import KubeCluster

from .kube_emulator import FleetKubernetes

__all__ = ["Cluster", "KmockCluster", "RealCluster"]

_PATHS = {
    "fleetmodels": "/apis/serving.fleet.dev/v1alpha1/namespaces/{ns}/fleetmodels",
    "deployments": "/apis/apps/v1/namespaces/{ns}/deployments",
    "services": "/api/v1/namespaces/{ns}/services",
    "poddisruptionbudgets": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    "endpointslices": "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
    "pods": "/api/v1/namespaces/{ns}/pods",
    "secrets": "/api/v1/namespaces/{ns}/secrets",
    "nodes": "/api/v1/nodes",
    "customresourcedefinitions": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
}


def _unschedulable(message: str) -> dict[str, Any]:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    return {"phase": "Pending", "conditions": [condition | {"message": message}]}


class Cluster:
    """What a test does to, and reads from, the cluster."""

    real = False
    namespace = "default"
    kubeconfig: Path

    def live(self, plural: str, name: str, namespace: str = "default") -> dict[str, Any] | None:
        raise NotImplementedError

    async def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def delete(self, path: str) -> None:
        raise NotImplementedError

    async def serve(self, model: str, ips: list[str], *, node: str = "gpu-1") -> None:
        """Make ``len(ips)`` of the model's replicas ready at these pod IPs."""
        raise NotImplementedError

    async def unschedulable(self, model: str, message: str) -> str:
        """Have the scheduler say one of the model's pods cannot be placed; the pod's name."""
        return await self.pod_status(model, _unschedulable(message))

    async def pod_status(self, model: str, status: dict[str, Any]) -> str:
        """Have the kubelet (or the scheduler) write ``status`` on one of the model's pods."""
        raise NotImplementedError

    async def stall(self, model: str) -> None:
        """Have the Deployment controller find the model's rollout past its progress deadline."""
        raise NotImplementedError

    def phase_of(self, name: str, phase: str) -> dict[str, Any] | None:
        status = (self.live("fleetmodels", name) or {}).get("status") or {}
        return status if status.get("phase") == phase else None


class KmockCluster(Cluster):
    def __init__(self, kube: FleetKubernetes, kube_api: Any, kubeconfig: Path) -> None:
        self.kube = kube
        self.api = kube_api
        self.kubeconfig = kubeconfig

    def live(self, plural: str, name: str, namespace: str = "default") -> dict[str, Any] | None:
        for (resource, ns, obj_name), obj in self.kube.objects.items():
            found = (resource.plural, obj_name) == (plural, name) and ns in (namespace, None)
            if found and not obj.deleted:
                return dict(obj.raw)
        return None

    async def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        return dict(await self.api.create(path, obj))

    async def patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        return dict(await self.api.patch(path, patch))

    async def delete(self, path: str) -> None:
        await self.api.delete(path)

    async def serve(self, model: str, ips: list[str], *, node: str = "gpu-1") -> None:
        deployments = _PATHS["deployments"].format(ns="default")
        generation = (self.live("deployments", model) or {})["metadata"]["generation"]
        rollout = {"readyReplicas": len(ips), "updatedReplicas": len(ips),
                   "observedGeneration": generation}  # fmt: skip
        await self.patch(f"{deployments}/{model}/status", {"status": rollout})
        slices = _PATHS["endpointslices"].format(ns="default")
        body = endpoint_slice(model, *ips)
        if self.live("endpointslices", f"{model}-abcde") is None:
            await self.create(slices, body)
        else:
            await self.patch(f"{slices}/{model}-abcde", body)

    async def pod_status(self, model: str, status: dict[str, Any]) -> str:
        name = f"{model}-7d9f-x1"
        pods = _PATHS["pods"].format(ns="default")
        if self.live("pods", name) is not None:
            await self.patch(f"{pods}/{name}/status", {"status": status})
            return name
        labels = {"app.kubernetes.io/managed-by": "fleet-serving", "serving.fleet.dev/model": model}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": labels},
            "status": status,
        }
        await self.create(pods, pod)
        return name

    async def stall(self, model: str) -> None:
        deployments = _PATHS["deployments"].format(ns="default")
        condition = {"type": "Progressing", "status": "False",
                     "reason": "ProgressDeadlineExceeded",
                     "message": f'ReplicaSet "{model}-1" has timed out progressing.'}  # fmt: skip
        await self.patch(f"{deployments}/{model}/status", {"status": {"conditions": [condition]}})


class RealCluster(Cluster):
    real = True

    def __init__(self, cluster: KubeCluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.kubeconfig = cluster.kubeconfig

    def path(self, path: str) -> str:
        return path.replace("/namespaces/default/", f"/namespaces/{self.namespace}/")

    def live(self, plural: str, name: str, namespace: str = "default") -> dict[str, Any] | None:
        ns = self.namespace if namespace == "default" else namespace
        return self.cluster.get(f"{_PATHS[plural].format(ns=ns)}/{name}")

    async def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        if path == _PATHS["nodes"]:
            return self.cluster.create_node(obj)
        meta = obj.get("metadata") or {}
        if meta.get("namespace") == "default":
            obj = obj | {"metadata": meta | {"namespace": self.namespace}}
        return self.cluster.create(self.path(path), obj)

    async def patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.cluster.patch(self.path(path), patch)

    async def delete(self, path: str) -> None:
        self.cluster.delete(self.path(path))

    async def pods(self, model: str, count: int) -> list[dict[str, Any]]:
        """The model's first ``count`` live pods (by name), once the ReplicaSet made them."""
        selector = f"serving.fleet.dev/model={model}"
        path = f"{_PATHS['pods'].format(ns=self.namespace)}?labelSelector={selector}"
        for _ in range(400):
            items = [p for p in self.cluster.request("GET", path)["items"]
                     if not p["metadata"].get("deletionTimestamp")]  # fmt: skip
            if len(items) >= count:
                return sorted(items, key=lambda p: str(p["metadata"]["name"]))[:count]
            await asyncio.sleep(0.05)
        raise AssertionError(f"the ReplicaSet of {model} never made {count} pods")

    async def serve(self, model: str, ips: list[str], *, node: str = "gpu-1") -> None:
        for pod, ip in zip(await self.pods(model, len(ips)), ips, strict=True):
            self.cluster.run_pod(self.namespace, pod["metadata"]["name"], node, ip)

    async def pod_status(self, model: str, status: dict[str, Any]) -> str:
        (pod,) = await self.pods(model, 1)
        name = str(pod["metadata"]["name"])
        path = f"{_PATHS['pods'].format(ns=self.namespace)}/{name}/status"
        self.cluster.patch(path, {"status": status})
        return name

    async def stall(self, model: str) -> None:
        """A one-second progress deadline: the real controller marks the rollout (whose pods
        never become ready) ProgressDeadlineExceeded. The operator does not set this field, so
        it does not put it back."""
        path = f"{_PATHS['deployments'].format(ns=self.namespace)}/{model}"
        self.cluster.patch(path, {"spec": {"progressDeadlineSeconds": 1}})

    def clean(self) -> None:
        """Let the test's FleetModels go: a test may have put an earlier release's finalizer on
        them, and the operator that would remove it is stopped by now."""
        models = self.cluster.request("GET", _PATHS["fleetmodels"].format(ns=self.namespace))
        for fm in models["items"]:
            path = f"{_PATHS['fleetmodels'].format(ns=self.namespace)}/{fm['metadata']['name']}"
            self.cluster.patch(path, {"metadata": {"finalizers": None}})


def endpoint_slice(model: str, *ips: str, ready: bool = True) -> dict[str, Any]:
    """What the EndpointSlice controller writes for the model's Service (labels mirrored)."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{model}-abcde",
            "namespace": "default",
            "labels": {
                "kubernetes.io/service-name": model,
                "app.kubernetes.io/managed-by": "fleet-serving",
                "serving.fleet.dev/model": model,
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": ready}} for ip in ips],
    }
