"""HTTP edge of credentials and the audit trail (admin only), and ``whoami`` (anyone)."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from fleet_core.control_plane.auth import guard
from fleet_core.control_plane.auth.service import AuthService
from fleet_core.control_plane.auth.wire import CredentialCreate
from fleet_core.shared import paging, web
from fleet_core.shared.errors import InvalidRequest

__all__ = ["auth_routes"]

_CREATE = msgspec.json.Decoder(CredentialCreate)
MAX_PAGE = 1000


class _Credentials:
    def __init__(self, service: AuthService) -> None:
        self.service = service

    async def create(self, request: Request) -> Response:
        new = web.decode(_CREATE, await request.body())
        issued = await self.service.issue(new, by=guard.principal(request))
        return web.json_response(issued, 201)

    async def list(self, request: Request) -> Response:
        page = paging.page(request.query_params, ["time", "text"])
        return web.json_response(await self.service.credentials(page))

    async def revoke(self, request: Request) -> Response:
        return web.json_response(await self.service.revoke(request.path_params["credential_id"]))

    async def events(self, request: Request) -> Response:
        limit = _bounded(request, "limit", default=100, most=MAX_PAGE)
        before = _bounded(request, "before", default=None, most=2**53 - 1)
        events = await self.service.events(limit=limit or MAX_PAGE, before=before)
        return web.json_response({"object": "list", "data": events})

    async def whoami(self, request: Request) -> Response:
        return web.json_response(guard.principal(request))


def _bounded(request: Request, name: str, *, default: int | None, most: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > 16 or not 0 < int(raw) <= most:
        raise InvalidRequest(f"{name} must be an integer from 1 to {most}", param=name)
    return int(raw)


def auth_routes(service: AuthService) -> list[BaseRoute]:
    ep = _Credentials(service)
    return [
        Route("/api/v1/credentials", ep.create, methods=["POST"]),
        Route("/api/v1/credentials", ep.list, methods=["GET"]),
        Route("/api/v1/credentials/{credential_id}", ep.revoke, methods=["DELETE"]),
        Route("/api/v1/audit-events", ep.events, methods=["GET"]),
        Route("/api/v1/whoami", ep.whoami, methods=["GET"]),
    ]
