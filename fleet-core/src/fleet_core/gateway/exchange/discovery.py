"""Endpoint discovery from the control plane (``FLEET_CONTROL_PLANE_URL``).

The control plane derives, from the operators' inventory reports, the ready pod endpoints of every
served model and serves them at ``GET /api/v1/endpoints`` with an ETag. The gateway polls it with
``If-None-Match`` (a 304 costs almost nothing), rebuilds its routing table when the document
changes and swaps it in atomically, so a scale-up reaches routing within about one poll interval
and nothing restarts. The document reuses the contract's types for engines and endpoints.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp
import msgspec

from fleet_core.gateway.exchange.routing.table import DiscoveredModel
from fleet_core.shared import stopping
from fleet_core.shared.endpoints import EndpointsDocument

__all__ = ["poll_endpoints", "ready_models"]

log = logging.getLogger("fleet.gateway.discovery")


def ready_models(document: EndpointsDocument) -> list[DiscoveredModel]:
    """The document's ready endpoints per model, as the routing table takes them."""
    return [
        DiscoveredModel(
            m.served_model_name,
            m.engine,
            tuple(e.url.rstrip("/") for e in m.endpoints if e.ready),
            m.cluster_id,
            tuple((a.name, a.index) for a in m.adapters),
        )
        for m in document.models
    ]


_decoder = msgspec.json.Decoder(EndpointsDocument)


async def poll_endpoints(
    session: aiohttp.ClientSession,
    base_url: str,
    apply: Callable[[list[DiscoveredModel]], None],
    *,
    interval: float,
    token: str | None = None,
) -> None:
    """Poll forever; ``apply`` is called with every changed document. Errors keep the last one.
    ``token``: the gateway's control-plane credential (FLEET_CONTROL_PLANE_TOKEN)."""
    etag: str | None = None
    url = base_url.rstrip("/") + "/api/v1/endpoints"
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    while True:
        headers = {**auth, "If-None-Match": etag} if etag else auth
        try:
            async with session.get(url, headers=headers) as response:
                if response.status == 200:
                    document = _decoder.decode(await response.read())
                    etag = response.headers.get("ETag")
                    apply(ready_models(document))
                elif response.status != 304:
                    log.warning("control plane answered %s for %s", response.status, url)
        except (aiohttp.ClientError, TimeoutError, msgspec.DecodeError) as exc:
            log.warning("endpoint discovery failed, keeping the last table: %s", exc)
        stopping.raise_if_cancelled()
        await asyncio.sleep(interval)
