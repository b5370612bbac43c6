"""The endpoints document: which ready pod endpoints serve each model, as both servers read it.

The control plane derives it from the operators' inventory reports and serves it at
``GET /api/v1/endpoints`` (with an ETag); the gateway's discovery polls it and rebuilds its
routing table from it. One definition here keeps the two sides from drifting. It reuses the
contract's types for engines and endpoints.

A model served by several clusters has one entry per cluster, naming it: the gateway sends each
cluster's endpoints that cluster's engine key and no other (`engine_keys`, ADR 0020).
"""

from __future__ import annotations

import msgspec

from fleet_contract import Endpoint, Engine

__all__ = ["DiscoveredAdapter", "DiscoveredEndpoints", "EndpointsDocument"]


class DiscoveredAdapter(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A LoRA adapter the endpoints serve beside the model, under its own name (ADR 0028)."""

    name: str
    index: int
    """Its position in the deployment's ``adapters``: llama-server's id for it."""


class DiscoveredEndpoints(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    served_model_name: str
    engine: Engine
    endpoints: tuple[Endpoint, ...] = ()
    cluster_id: str | None = None
    """The cluster whose binding admitted these endpoints (None from a control plane older than
    per-cluster engine keys: the gateway then sends them no key at all)."""
    adapters: tuple[DiscoveredAdapter, ...] = ()
    """The adapters the cluster's binding admits; a gateway that predates them routes none."""


class EndpointsDocument(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The body of ``GET /api/v1/endpoints``."""

    models: tuple[DiscoveredEndpoints, ...] = ()
