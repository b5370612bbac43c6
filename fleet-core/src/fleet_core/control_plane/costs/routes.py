"""HTTP edge of the cost pool: rates, and closing, reading and listing months (JSON or CSV)."""

from __future__ import annotations

import msgspec
from psycopg_pool import AsyncConnectionPool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from fleet_core.control_plane.auth import guard
from fleet_core.control_plane.costs.csv_export import render_csv
from fleet_core.control_plane.costs.service import CostService, CostSettings
from fleet_core.control_plane.costs.wire import CostReport, RateCreate
from fleet_core.shared import paging, web
from fleet_core.shared.errors import InvalidRequest

__all__ = ["cost_routes"]

_CREATE = msgspec.json.Decoder(RateCreate)


class _Costs:
    def __init__(self, service: CostService) -> None:
        self.service = service

    async def create_rate(self, request: Request) -> Response:
        new = web.decode(_CREATE, await request.body())
        created = await self.service.create_rate(new)
        guard.audit_detail(request, {"after": created})
        return web.json_response(created, 201)

    async def list_rates(self, request: Request) -> Response:
        page = paging.page(request.query_params, ["text", "start"])
        return web.json_response(
            await self.service.list_rates(request.query_params.get("cluster"), page)
        )

    async def list_periods(self, request: Request) -> Response:
        page = paging.page(request.query_params, ["text"])
        return web.json_response(await self.service.list_periods(page))

    async def get_period(self, request: Request) -> Response:
        as_csv = _wants_csv(request)
        return _render(await self.service.get(request.path_params["period"]), as_csv=as_csv)

    async def close_period(self, request: Request) -> Response:
        as_csv = _wants_csv(request)
        report = await self.service.close(
            request.path_params["period"], min_coverage=request.query_params.get("minCoverage")
        )
        return _render(report, as_csv=as_csv)


def _wants_csv(request: Request) -> bool:
    """``?format=csv`` or ``json`` decides; without it, ``Accept: text/csv`` does."""
    chosen = request.query_params.get("format")
    if chosen is not None and chosen not in ("csv", "json"):
        raise InvalidRequest(f"format must be csv or json, not {chosen[:20]!r}", param="format")
    if chosen is not None:
        return chosen == "csv"
    return "text/csv" in request.headers.get("accept", "")


def _render(report: CostReport, *, as_csv: bool) -> Response:
    if not as_csv:
        return web.json_response(report)
    return Response(
        render_csv(report),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="fleet-costs-{report.period}.csv"'},
    )


def cost_routes(pool: AsyncConnectionPool, settings: CostSettings) -> list[BaseRoute]:
    costs = _Costs(CostService.on_pool(pool, settings))
    one = "/api/v1/cost-periods/{period}"
    return [
        Route("/api/v1/cost-rates", costs.create_rate, methods=["POST"]),
        Route("/api/v1/cost-rates", costs.list_rates, methods=["GET"]),
        Route("/api/v1/cost-periods", costs.list_periods, methods=["GET"]),
        Route(one, costs.get_period, methods=["GET"]),
        Route(one, costs.close_period, methods=["PUT"]),
    ]
