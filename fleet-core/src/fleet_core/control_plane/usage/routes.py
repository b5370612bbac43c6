"""``GET /api/v1/usage?tenantId=&projectId=&model=&from=&to=&groupBy=hour|day|model|project``.

``from`` and ``to`` are ISO-8601 instants (a date means its UTC midnight); the window is
``[from, to)`` and defaults to the last 24 hours. ``projectId`` is ``tenant/name``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from psycopg_pool import AsyncConnectionPool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from fleet_core.control_plane.auth import guard
from fleet_core.control_plane.usage import store
from fleet_core.control_plane.usage.wire import GroupBy
from fleet_core.shared import inputs, web
from fleet_core.shared.errors import InvalidRequest

__all__ = ["usage_routes"]

_GROUPS: tuple[GroupBy, ...] = ("hour", "day", "model", "project")


def _instant(request: Request, name: str, default: datetime) -> datetime:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    return inputs.parse_instant(raw, name=name)


def _group(request: Request) -> GroupBy:
    raw = request.query_params.get("groupBy", "day")
    for group in _GROUPS:
        if raw == group:
            return group
    raise InvalidRequest(f"groupBy must be one of {', '.join(_GROUPS)}", param="groupBy")


def usage_routes(pool: AsyncConnectionPool) -> list[BaseRoute]:
    async def usage(request: Request) -> Response:
        start, end = _window(request)
        project_id = request.query_params.get("projectId")
        tenant = guard.tenant_scope(request, request.query_params.get("tenantId"))
        project = None
        if project_id is not None:
            owner, sep, project = project_id.partition("/")
            if not sep or not owner or not project:
                raise InvalidRequest("projectId is tenant/name", param="projectId")
            guard.require_tenant(request, owner, param="projectId")
            if tenant is not None and tenant != owner:
                raise InvalidRequest("projectId belongs to another tenant", param="projectId")
            tenant = owner
        group_by = _group(request)
        rows = await store.usage(
            pool,
            group_by=group_by,
            start=start,
            end=end,
            tenant=tenant,
            project=project,
            model=request.query_params.get("model"),
        )
        return web.json_response(
            {
                "object": "list",
                "groupBy": group_by,
                "from": start.isoformat(),
                "to": end.isoformat(),
                "data": rows,
            }
        )

    async def agreement(request: Request) -> Response:
        start, end = _window(request)
        rows = await store.agreement(
            pool, start=start, end=end, model=request.query_params.get("model")
        )
        return web.json_response(
            {"object": "list", "from": start.isoformat(), "to": end.isoformat(), "data": rows}
        )

    return [
        Route("/api/v1/usage", usage, methods=["GET"]),
        Route("/api/v1/usage-agreement", agreement, methods=["GET"]),
    ]


def _window(request: Request) -> tuple[datetime, datetime]:
    """``[from, to)`` from the query (default: the last 24 hours); NULs were refused by the
    guard, and `inputs.parse_instant` keeps both ends where no rounding overflows."""
    now = datetime.now(UTC)
    start = _instant(request, "from", now - timedelta(days=1))
    end = _instant(request, "to", now)
    if end <= start:
        raise InvalidRequest("to must be after from", param="to")
    return start, end
