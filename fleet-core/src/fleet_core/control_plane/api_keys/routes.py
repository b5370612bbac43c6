"""HTTP edge of API keys: issue (201, the only response holding the secret), list, revoke."""

from __future__ import annotations

import msgspec
from psycopg_pool import AsyncConnectionPool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from fleet_core.control_plane.api_keys.service import KeyService
from fleet_core.control_plane.api_keys.wire import KeyCreate
from fleet_core.control_plane.auth import guard
from fleet_core.shared import paging, web

__all__ = ["keys_routes"]

_CREATE = msgspec.json.Decoder(KeyCreate)


class _Keys:
    def __init__(self, service: KeyService) -> None:
        self.service = service

    async def create(self, request: Request) -> Response:
        new = web.decode(_CREATE, await request.body())
        return web.json_response(await self.service.issue(new), 201)

    async def list(self, request: Request) -> Response:
        project_id = request.query_params.get("projectId")
        if project_id is not None:
            guard.require_tenant(request, project_id.partition("/")[0], param="projectId")
        tenant_id = guard.tenant_scope(request, None)
        page = paging.page(request.query_params, ["time", "text"])
        keys = await self.service.list(page, project_id=project_id, tenant_id=tenant_id)
        return web.json_response(keys)

    async def delete(self, request: Request) -> Response:
        return web.json_response(await self.service.revoke(request.path_params["key_id"]))


def keys_routes(pool: AsyncConnectionPool) -> list[BaseRoute]:
    keys = _Keys(KeyService.on_pool(pool))
    return [
        Route("/api/v1/keys", keys.create, methods=["POST"]),
        Route("/api/v1/keys", keys.list, methods=["GET"]),
        Route("/api/v1/keys/{key_id}", keys.delete, methods=["DELETE"]),
    ]
