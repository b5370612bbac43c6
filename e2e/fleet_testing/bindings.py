"""Binding a cluster, as an admin does before its operator reports (ADR 0020).

A cluster without a binding serves nothing: its reports are refused while they list a deployment.
Every test that reports deployments binds its cluster first, with what it will report: the
served model names, and where the endpoints are (a CIDR, or a host name). Also the engine key a
cluster's engines hold, derived from the fleet engine secret.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import urllib.request
from collections.abc import Iterable

__all__ = ["bind_cluster", "binding_body", "cluster_engine_key"]


def cluster_engine_key(fleet_secret: str, cluster_id: str) -> str:
    """The key a cluster's engines hold: HMAC-SHA256 of its id under the fleet engine secret
    (``fleet_core.shared.engine_keys``, recomputed here: the harness imports no fleet-core)."""
    return hmac.new(fleet_secret.encode(), cluster_id.encode(), hashlib.sha256).hexdigest()


def binding_body(models: Iterable[str], endpoints: Iterable[str]) -> dict[str, list[str]]:
    return {"servedModels": list(models), "endpoints": list(endpoints)}


def bind_cluster(
    control_plane: str,
    admin_token: str,
    cluster: str,
    models: Iterable[str],
    endpoints: Iterable[str] = ("127.0.0.0/8",),
) -> dict[str, object]:
    """``PUT /api/v1/clusters/{cluster}/binding`` with the admin's token; blocking (call it
    through ``asyncio.to_thread`` from a coroutine). Endpoints default to loopback, where the
    harness runs its engines."""
    request = urllib.request.Request(
        f"{control_plane.rstrip('/')}/api/v1/clusters/{cluster}/binding",
        data=json.dumps(binding_body(models, endpoints)).encode(),
        method="PUT",
        headers={"Authorization": f"Bearer {admin_token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        found: dict[str, object] = json.loads(response.read())
    return found
