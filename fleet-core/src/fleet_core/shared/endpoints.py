"""The endpoints document: which ready pod endpoints serve each model, as both servers read it.

The control plane derives it from the operators' inventory reports and serves it at
``GET /api/v1/endpoints`` (with an ETag); the gateway's discovery polls it and rebuilds its
routing table from it. One definition here keeps the two sides from drifting. It reuses the
contract's types for engines and endpoints.
"""

from __future__ import annotations

import msgspec

from fleet_contract import Endpoint, Engine

__all__ = ["DiscoveredEndpoints", "EndpointsDocument"]


class DiscoveredEndpoints(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    served_model_name: str
    engine: Engine
    endpoints: tuple[Endpoint, ...] = ()


class EndpointsDocument(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The body of ``GET /api/v1/endpoints``."""

    models: tuple[DiscoveredEndpoints, ...] = ()
