"""HTTP edge of tenants and projects: decode, one service call, encode.

A project's id is ``tenant/name``; its routes take the rest of the path (``{project_id:path}``),
so both ``/projects/acme/chat`` and ``/projects/acme%2Fchat`` name it.
"""

from __future__ import annotations

import msgspec
from psycopg_pool import AsyncConnectionPool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from fleet_core.control_plane.auth import guard
from fleet_core.control_plane.tenants import wire
from fleet_core.control_plane.tenants.service import TenantService
from fleet_core.shared import paging, web

__all__ = ["tenants_routes"]

_TENANT_CREATE = msgspec.json.Decoder(wire.TenantCreate)
_TENANT_PATCH = msgspec.json.Decoder(wire.TenantPatch)
_PROJECT_CREATE = msgspec.json.Decoder(wire.ProjectCreate)
_PROJECT_PATCH = msgspec.json.Decoder(wire.ProjectPatch)


class _Tenants:
    def __init__(self, service: TenantService) -> None:
        self.service = service

    async def create(self, request: Request) -> Response:
        new = web.decode(_TENANT_CREATE, await request.body())
        return web.json_response(await self.service.create_tenant(new), 201)

    async def list(self, request: Request) -> Response:
        page, q = paging.page(request.query_params, ["text"]), paging.search(request.query_params)
        return web.json_response(await self.service.list_tenants(page, q=q))

    async def get(self, request: Request) -> Response:
        tenant_id = request.path_params["tenant_id"]
        guard.require_tenant(request, tenant_id)
        return web.json_response(await self.service.get_tenant(tenant_id))

    async def patch(self, request: Request) -> Response:
        patch = web.decode(_TENANT_PATCH, await request.body())
        tenant_id = request.path_params["tenant_id"]
        return web.json_response(await self.service.patch_tenant(tenant_id, patch))

    async def delete(self, request: Request) -> Response:
        tenant_id = request.path_params["tenant_id"]
        return web.json_response(await self.service.delete_tenant(tenant_id))


class _Projects:
    def __init__(self, service: TenantService) -> None:
        self.service = service

    async def create(self, request: Request) -> Response:
        new = web.decode(_PROJECT_CREATE, await request.body())
        return web.json_response(await self.service.create_project(new), 201)

    async def list(self, request: Request) -> Response:
        tenant_id = guard.tenant_scope(request, request.query_params.get("tenantId"))
        page, q = paging.page(request.query_params, ["text"]), paging.search(request.query_params)
        listed = await self.service.list_projects(page, tenant_id=tenant_id, q=q)
        return web.json_response(listed)

    async def get(self, request: Request) -> Response:
        project_id = request.path_params["project_id"]
        guard.require_tenant(request, project_id.partition("/")[0], param="project_id")
        return web.json_response(await self.service.get_project(project_id))

    async def patch(self, request: Request) -> Response:
        patch = web.decode(_PROJECT_PATCH, await request.body())
        project_id = request.path_params["project_id"]
        return web.json_response(await self.service.patch_project(project_id, patch))

    async def delete(self, request: Request) -> Response:
        project_id = request.path_params["project_id"]
        return web.json_response(await self.service.delete_project(project_id))


def tenants_routes(pool: AsyncConnectionPool) -> list[BaseRoute]:
    service = TenantService.on_pool(pool)
    tenants, projects = _Tenants(service), _Projects(service)
    one_tenant, one_project = "/api/v1/tenants/{tenant_id}", "/api/v1/projects/{project_id:path}"
    return [
        Route("/api/v1/tenants", tenants.create, methods=["POST"]),
        Route("/api/v1/tenants", tenants.list, methods=["GET"]),
        Route(one_tenant, tenants.get, methods=["GET"]),
        Route(one_tenant, tenants.patch, methods=["PATCH"]),
        Route(one_tenant, tenants.delete, methods=["DELETE"]),
        Route("/api/v1/projects", projects.create, methods=["POST"]),
        Route("/api/v1/projects", projects.list, methods=["GET"]),
        Route(one_project, projects.get, methods=["GET"]),
        Route(one_project, projects.patch, methods=["PATCH"]),
        Route(one_project, projects.delete, methods=["DELETE"]),
    ]
