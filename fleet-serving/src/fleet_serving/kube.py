"""The one module that talks to the Kubernetes API (besides kopf's own watching).

It reads, creates and merge-patches the objects the operator owns, and writes FleetModel status.
kubernetes-asyncio's exceptions are translated here, and only here, into
:class:`fleet_serving.errors.KubernetesError`. Objects stay plain dicts: the renderers make dicts,
and deciding whether and how to patch is pure (:mod:`fleet_serving.applying`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from fleet_serving import applying
from fleet_serving.errors import Conflict, ForeignObject, KubernetesError
from fleet_serving.spec import GROUP, PLURAL, VERSION

__all__ = ["Kube", "controlled_by", "object_path"]

logger = logging.getLogger(__name__)

_MERGE = "application/merge-patch+json"
_COLLECTIONS = {
    ("v1", "Service"): "/api/v1/namespaces/{ns}/services",
    ("apps/v1", "Deployment"): "/apis/apps/v1/namespaces/{ns}/deployments",
    ("policy/v1", "PodDisruptionBudget"): "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    (f"{GROUP}/{VERSION}", "FleetModel"): f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/{PLURAL}",
}


def object_path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    """The REST path of a collection, or of one object when ``name`` is given."""
    base = _COLLECTIONS[(api_version, kind)].format(ns=namespace)
    return f"{base}/{name}" if name else base


def _message(body: Any) -> str:
    """The API server's own explanation from a Status body (what was invalid, and why)."""
    try:
        message = json.loads(body).get("message") if body else None
    except (ValueError, AttributeError):
        return ""
    return f": {message}" if isinstance(message, str) and message else ""


def controlled_by(actual: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """True when ``actual`` names the controller that ``desired``'s ownerReference names."""
    wanted = {ref.get("uid") for ref in desired["metadata"].get("ownerReferences") or []
              if ref.get("controller")}  # fmt: skip
    refs = (actual.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("controller") and ref.get("uid") in wanted for ref in refs)


class Kube:
    """Thin access to the API through one kubernetes-asyncio ``ApiClient``."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    async def _call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = _MERGE if method == "PATCH" else "application/json"
        try:
            result = await self.api.call_api(
                path,
                method,
                header_params=headers,
                body=body,
                response_types_map={200: "object", 201: "object"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
            )
        except ApiException as exc:
            kind = Conflict if exc.status == 409 else KubernetesError
            said = f"{exc.status} {exc.reason}{_message(exc.body)}"
            raise kind(f"{method} {path}: {said}", status=exc.status) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KubernetesError(f"{method} {path}: {exc}", status=0) from exc
        return dict(result or {})

    async def get(self, path: str) -> dict[str, Any] | None:
        """The object at ``path``, or None when it does not exist."""
        try:
            return await self._call("GET", path)
        except KubernetesError as exc:
            if exc.status == 404:
                return None
            raise

    async def ensure(self, desired: Mapping[str, Any]) -> str:
        """Create ``desired`` or patch it back into shape; returns what was done.

        An object of that name that ``desired``'s controller does not control is left alone
        (:class:`ForeignObject`): patching would adopt it, and garbage collection would then
        delete it with the FleetModel.

        What is applied is recorded on the object, so a key dropped from ``desired`` since the
        last application is deleted from the live object too (:mod:`fleet_serving.applying`).
        """
        meta = desired["metadata"]
        kind, version = desired["kind"], desired["apiVersion"]
        path = object_path(version, kind, meta["namespace"], meta["name"])
        body = applying.with_applied(desired)
        actual = await self.get(path)
        if actual is None:
            await self._call("POST", object_path(version, kind, meta["namespace"]), body)
            return "created"
        if not controlled_by(actual, desired):
            raise ForeignObject(
                f"{kind} {meta['namespace']}/{meta['name']} exists and is not controlled by this "
                "FleetModel; the operator does not adopt it: delete or rename it"
            )
        if not applying.drifted(body, actual):  # the applied record is part of ``body``
            return "unchanged"
        await self._call("PATCH", path, applying.merge_patch(applying.previous(actual), body))
        return "patched"

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Merge-patch a FleetModel's status subresource."""
        path = object_path(f"{GROUP}/{VERSION}", "FleetModel", namespace, name) + "/status"
        await self._call("PATCH", path, {"status": dict(status)})
