"""A Kubernetes API for the operator's tests: kmock's emulator, patched up where it falls short.

kmock (by kopf's author) keeps objects of declared resources and serves list/watch/create/
merge-patch/delete over real HTTP. What a real API server (and its controllers) would add is
emulated here, in the test fixture, never in the operator. Each workaround is named:

* WORKAROUND(uid): kmock assigns no ``uid``, ``creationTimestamp``, ``resourceVersion`` or
  ``generation``; ownerReferences need a uid, and kopf and ``kubectl get`` read the others.
  They are filled in on create.
* WORKAROUND(gc): kmock has no garbage collector; objects whose controller owner is gone are
  deleted after every request, as kube-controller-manager's GC would.
* WORKAROUND(discovery): resources are declared explicitly (kmock's discovery knows only what it
  is told), and core-group discovery is malformed for kubectl, so kubectl is used for custom
  resources only.
* WORKAROUND(namespaces): ``GET /api/v1/namespaces`` answers 500, so the operator runs
  cluster-wide in tests (a single named namespace needs no listing either).
"""

from __future__ import annotations

import datetime
import itertools
import uuid
from typing import Any

import kmock
from kmock._internal import enums, rendering
from kmock._internal.k8s import KubernetesEmulator

__all__ = ["FleetKubernetes", "declare_resources"]

_RESOURCES: dict[str, tuple[str, bool, set[str]]] = {
    "serving.fleet.dev/v1alpha1/fleetmodels": ("FleetModel", True, {"status"}),
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", False, set()),
    "apps/v1/deployments": ("Deployment", True, {"status"}),
    "discovery.k8s.io/v1/endpointslices": ("EndpointSlice", True, set()),
    "v1/services": ("Service", True, set()),
    "v1/pods": ("Pod", True, {"status"}),
    "v1/nodes": ("Node", False, {"status"}),
    "v1/events": ("Event", True, set()),
    # kopf's namespace observer waits until discovery shows namespaces, even cluster-wide.
    "v1/namespaces": ("Namespace", False, set()),
}
_VERBS = {"list", "watch", "get", "create", "patch", "delete"}


def declare_resources(k: KubernetesEmulator) -> None:
    """WORKAROUND(discovery): tell kmock which resources exist, as a cluster's discovery would."""
    for key, (kind, namespaced, subresources) in _RESOURCES.items():
        plural = key.rsplit("/", 1)[-1]
        k.resources[key] = kmock.ResourceInfo(
            kind=kind,
            namespaced=namespaced,
            singular=kind.lower(),
            verbs=_VERBS,
            subresources=subresources,
            shortnames={"fm"} if plural == "fleetmodels" else set(),
        )


class FleetKubernetes(KubernetesEmulator):
    """kmock's emulator plus the object metadata and garbage collection a real cluster has."""

    _versions = itertools.count(1)

    async def _handle(self, request: rendering.Request) -> Any:
        if request.resource is not None and request.action == enums.action.CREATE:
            self._stamp(request.data)
        try:
            return await super()._handle(request)
        finally:
            if request.action in (enums.action.DELETE, enums.action.UPDATE):
                await self._collect_garbage()

    def _stamp(self, obj: dict[str, Any]) -> None:
        """WORKAROUND(uid): what the API server adds to every new object."""
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        meta.setdefault("creationTimestamp", now)
        meta.setdefault("resourceVersion", str(next(self._versions)))
        meta.setdefault("generation", 1)

    async def _collect_garbage(self) -> None:
        """WORKAROUND(gc): delete what a deleted controller owner made."""
        while True:
            live = {
                obj.get("metadata", {}).get("uid")
                for obj in self.objects.values()
                if not obj.deleted
            }
            orphans = [
                (key, obj)
                for key, obj in self.objects.items()
                if not obj.deleted
                and any(
                    ref.get("uid") not in live
                    for ref in obj.get("metadata", {}).get("ownerReferences") or []
                    if ref.get("controller")
                )
            ]
            if not orphans:
                return
            for (resource, _, _), obj in orphans:
                raw = obj.raw
                obj.delete()
                await self._buses[resource].put({"type": "DELETED", "object": raw})
