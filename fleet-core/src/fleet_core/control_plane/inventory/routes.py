"""HTTP edge of the inventory: PUT from the operator, GETs for people and for the gateway."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

import fleet_contract
from fleet_core.control_plane.auth import guard
from fleet_core.control_plane.inventory import bindings, service
from fleet_core.control_plane.inventory.store import InventoryStore
from fleet_core.shared import inputs, paging, web
from fleet_core.shared.errors import InvalidRequest, NotFound

__all__ = ["inventory_routes"]

_MAX_REPORT_BYTES = 16 * 1024 * 1024
_binding_decoder = msgspec.json.Decoder(bindings.BindingBody)


class _Inventory:
    def __init__(self, store: InventoryStore, *, max_gap_s: int) -> None:
        self.store = store
        self.max_gap_s = max_gap_s

    async def put(self, request: Request) -> Response:
        body = await request.body()
        if len(body) > _MAX_REPORT_BYTES:
            raise InvalidRequest(f"an inventory report is limited to {_MAX_REPORT_BYTES} bytes")
        try:
            report = fleet_contract.decode_report(body)
        except fleet_contract.UnsupportedSchemaVersion as exc:
            raise InvalidRequest(
                str(exc), param="schemaVersion", code="unsupported_schema_version"
            ) from exc
        except fleet_contract.DecodeError as exc:
            raise InvalidRequest(f"invalid inventory report: {exc}", code="invalid_report") from exc
        request.state.audit_target = f"/api/v1/clusters/{report.cluster_id[:200]}"
        guard.require_cluster(request, report.cluster_id)
        service.check_bounds(report)
        service.require_interval(report, max_interval_s=self.max_gap_s)
        bindings.check_report(report, await self.store.binding(report.cluster_id))
        now = datetime.now(UTC)

        def check(newest: datetime | None, closed_until: datetime | None) -> None:
            service.check_time(report, now=now, newest=newest, closed_until=closed_until)

        await self.store.save(report, check=check)
        return web.json_response(service.summarize(report))

    async def list(self, request: Request) -> Response:
        """One summary per cluster, paged by ``cluster_id`` (a cluster's report is bounded by
        `service.check_bounds`, so the clusters are what grows; ADR 0015)."""
        page = paging.page(request.query_params, ["text"])
        listed = paging.listing(await self.store.page(page), page, lambda r: (r.cluster_id,))
        data = [service.summarize(r) for r in listed.data]
        return web.json_response(paging.Listing(object="list", data=data, next=listed.next))

    async def cluster(self, request: Request) -> Response:
        cluster_id = request.path_params["cluster_id"]
        report = await self.store.get(cluster_id)
        if report is None:
            raise NotFound(f"no inventory report from cluster {cluster_id!r} yet")
        return web.json_response({"summary": service.summarize(report), "report": report})

    async def decommission(self, request: Request) -> Response:
        """The cluster left the fleet (at ``?at=``, else now): its lifetime, over which a month's
        coverage is computed, ends there, and its endpoints leave discovery."""
        cluster_id = request.path_params["cluster_id"]
        at = _instant(request.query_params.get("at"))
        if not await self.store.decommission(cluster_id, at=at):
            raise NotFound(f"cluster {cluster_id!r} has no current inventory report")
        return web.json_response(service.Decommission(cluster_id=cluster_id, decommissioned_at=at))

    async def bind(self, request: Request) -> Response:
        """Replace the cluster's binding: what it may serve and where its endpoints may be."""
        cluster_id = _cluster_id(request)
        body = web.decode(_binding_decoder, await request.body())
        patterns = bindings.parse_patterns(body.endpoints)  # 400 naming a bad one
        binding = bindings.Binding(
            cluster_id=cluster_id,
            served_models=sorted(set(body.served_models)),
            endpoints=[p.text for p in patterns],
            updated_at=datetime.now(UTC),
            updated_by=guard.principal(request).id,
        )
        return web.json_response(await self.store.bind(binding))

    async def binding(self, request: Request) -> Response:
        cluster_id = _cluster_id(request)
        found = await self.store.binding(cluster_id)
        if found is None:
            raise NotFound(f"cluster {cluster_id!r} has no binding: it serves nothing")
        return web.json_response(found)

    async def unbind(self, request: Request) -> Response:
        """Remove the binding: the cluster serves nothing from now on (its endpoints leave
        discovery at once; its reports are refused while they list a deployment)."""
        cluster_id = _cluster_id(request)
        found = await self.store.binding(cluster_id)
        if found is None or not await self.store.unbind(cluster_id):
            raise NotFound(f"cluster {cluster_id!r} has no binding")
        return web.json_response(found)

    async def endpoints(self, request: Request) -> Response:
        reports = await self.store.latest()
        document = service.endpoints_document(reports, await self.store.bindings())
        body = msgspec.json.encode(document)
        tag = service.etag(body)
        if request.headers.get("if-none-match") == tag:
            return Response(status_code=304, headers={"ETag": tag})
        return Response(
            body, headers={"ETag": tag, "Cache-Control": "no-cache"}, media_type="application/json"
        )


def _cluster_id(request: Request) -> str:
    cluster_id: str = request.path_params["cluster_id"]
    if not 0 < len(cluster_id) <= 253:
        raise NotFound(f"no cluster {cluster_id[:64]!r}")
    return cluster_id


def _instant(text: str | None) -> datetime:
    now = datetime.now(UTC)
    if text is None:
        return now
    at = inputs.parse_instant(text, name="at", naive_utc=False)
    if at > now:
        raise InvalidRequest(f"at must be a past instant, not {text[:40]!r}", param="at")
    return at


def inventory_routes(store: InventoryStore, *, max_gap_s: int) -> list[BaseRoute]:
    ep = _Inventory(store, max_gap_s=max_gap_s)
    return [
        Route("/api/v1/inventory", ep.put, methods=["PUT"]),
        Route("/api/v1/inventory", ep.list, methods=["GET"]),
        Route("/api/v1/clusters/{cluster_id}", ep.cluster, methods=["GET"]),
        Route("/api/v1/clusters/{cluster_id}", ep.decommission, methods=["DELETE"]),
        Route("/api/v1/clusters/{cluster_id}/binding", ep.bind, methods=["PUT"]),
        Route("/api/v1/clusters/{cluster_id}/binding", ep.binding, methods=["GET"]),
        Route("/api/v1/clusters/{cluster_id}/binding", ep.unbind, methods=["DELETE"]),
        Route("/api/v1/endpoints", ep.endpoints, methods=["GET"]),
    ]
