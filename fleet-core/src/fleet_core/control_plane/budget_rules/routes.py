"""HTTP edge of budget rules: create, list, read one, change its limit or window, delete."""

from __future__ import annotations

import msgspec
from psycopg_pool import AsyncConnectionPool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from fleet_core.control_plane.auth import guard
from fleet_core.control_plane.budget_rules.service import BudgetService
from fleet_core.control_plane.budget_rules.wire import BudgetRule, RuleCreate, RulePatch
from fleet_core.shared import paging, web

__all__ = ["budget_routes"]

_CREATE = msgspec.json.Decoder(RuleCreate)
_PATCH = msgspec.json.Decoder(RulePatch)


class _Rules:
    def __init__(self, service: BudgetService) -> None:
        self.service = service

    async def create(self, request: Request) -> Response:
        new = web.decode(_CREATE, await request.body())
        return web.json_response(await self.service.create(new), 201)

    async def list(self, request: Request) -> Response:
        page = paging.page(request.query_params, ["time", "text"])
        tenant_id = guard.tenant_scope(request, None)
        return web.json_response(await self.service.list(page, tenant_id=tenant_id))

    async def get(self, request: Request) -> Response:
        rule = await self.service.get(request.path_params["rule_id"])
        guard.require_tenant(request, owner(rule), param="rule_id")
        return web.json_response(rule)

    async def patch(self, request: Request) -> Response:
        patch = web.decode(_PATCH, await request.body())
        return web.json_response(await self.service.patch(request.path_params["rule_id"], patch))

    async def delete(self, request: Request) -> Response:
        return web.json_response(await self.service.delete(request.path_params["rule_id"]))


def owner(rule: BudgetRule) -> str:
    """The tenant a rule limits: its scope, or its project's tenant."""
    return rule.scope_id.partition("/")[0]


def budget_routes(pool: AsyncConnectionPool) -> list[BaseRoute]:
    rules = _Rules(BudgetService.on_pool(pool))
    one = "/api/v1/budget-rules/{rule_id}"
    return [
        Route("/api/v1/budget-rules", rules.create, methods=["POST"]),
        Route("/api/v1/budget-rules", rules.list, methods=["GET"]),
        Route(one, rules.get, methods=["GET"]),
        Route(one, rules.patch, methods=["PATCH"]),
        Route(one, rules.delete, methods=["DELETE"]),
    ]
