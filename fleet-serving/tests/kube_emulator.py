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
* WORKAROUND(namespaces): kmock's URL parser reads ``/api/v1/namespaces`` as the start of
  ``/namespaces/{ns}/…`` and answers 500 (and ``/api/v1/namespaces/{name}`` as a namespace, not
  an object). kopf lists and watches Namespaces whenever it runs with ``--namespace``, even for
  an exact name, to learn which of the named ones exist. These two paths are parsed here and
  served by the emulator like any cluster-scoped resource, so a test creates its namespaces as
  ``kubectl create namespace`` would and kopf's watch sees them. Cluster-wide, kopf lists none.
"""

from __future__ import annotations

import datetime
import itertools
import json
import re
import uuid
from typing import Any

import aiohttp.web
import kmock
from kmock._internal import enums, parsing, rendering
from kmock._internal.k8s import KubernetesEmulator

__all__ = ["FleetKubernetes", "declare_resources"]

_RESOURCES: dict[str, tuple[str, bool, set[str]]] = {
    "serving.fleet.dev/v1alpha1/fleetmodels": ("FleetModel", True, {"status"}),
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", False, set()),
    "apps/v1/deployments": ("Deployment", True, {"status"}),
    "discovery.k8s.io/v1/endpointslices": ("EndpointSlice", True, set()),
    "v1/services": ("Service", True, set()),
    "policy/v1/poddisruptionbudgets": ("PodDisruptionBudget", True, {"status"}),
    "v1/pods": ("Pod", True, {"status"}),
    "v1/nodes": ("Node", False, {"status"}),
    "v1/events": ("Event", True, set()),
    # kopf's namespace observer waits until discovery shows namespaces, even cluster-wide.
    "v1/namespaces": ("Namespace", False, set()),
}
_VERBS = {"list", "watch", "get", "create", "patch", "delete"}
_NAMESPACES = re.compile(r"/api/v1/namespaces(?:/(?P<name>[^/]+))?/?")


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

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        match = _NAMESPACES.fullmatch(raw_request.path)
        if match is None:
            return await super().__call__(raw_request)
        return await self._serve_namespaces(raw_request, match["name"])

    async def _serve_namespaces(
        self, raw: aiohttp.web.BaseRequest, name: str | None
    ) -> aiohttp.web.StreamResponse:
        """WORKAROUND(namespaces): parse what kmock cannot, then serve it as kmock would."""
        body = await raw.read()
        path = parsing.ParsedPath(group="", version="v1", plural="namespaces", name=name)
        request = rendering.Request(
            id=len(self._requests),
            raw_request=raw,
            url=raw.url,
            method=raw.method,
            params=dict(raw.query),
            headers=dict(raw.headers),
            body=body,
            text=body.decode(),
            data=json.loads(body) if body else None,
            action=parsing.guess_k8s(path, enums.method(raw.method), dict(raw.query)),
            resource=kmock.resource("", "v1", "namespaces"),
            name=name,
        )
        self._requests.append(request)
        try:
            return await self._handle(request)
        except kmock.KubernetesError as exc:
            return await self._render_error(exc)

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
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
