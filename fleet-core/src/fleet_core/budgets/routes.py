"""HTTP edge of budget rules: create, list, read one, delete."""

from __future__ import annotations

import msgspec
from psycopg_pool import AsyncConnectionPool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from fleet_core import web
from fleet_core.budgets.service import BudgetService
from fleet_core.budgets.wire import RuleCreate

__all__ = ["budget_routes"]

_CREATE = msgspec.json.Decoder(RuleCreate)


class _Rules:
    def __init__(self, service: BudgetService) -> None:
        self.service = service

    async def create(self, request: Request) -> Response:
        new = web.decode(_CREATE, await request.body())
        return web.json_response(await self.service.create(new), 201)

    async def list(self, request: Request) -> Response:
        return web.json_response({"object": "list", "data": await self.service.list()})

    async def get(self, request: Request) -> Response:
        return web.json_response(await self.service.get(request.path_params["rule_id"]))

    async def delete(self, request: Request) -> Response:
        return web.json_response(await self.service.delete(request.path_params["rule_id"]))


def budget_routes(pool: AsyncConnectionPool) -> list[BaseRoute]:
    rules = _Rules(BudgetService.on_pool(pool))
    one = "/api/v1/budget-rules/{rule_id}"
    return [
        Route("/api/v1/budget-rules", rules.create, methods=["POST"]),
        Route("/api/v1/budget-rules", rules.list, methods=["GET"]),
        Route(one, rules.get, methods=["GET"]),
        Route(one, rules.delete, methods=["DELETE"]),
    ]
