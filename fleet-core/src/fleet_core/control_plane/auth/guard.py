"""The control plane's door: every ``/api/v1`` route runs behind the policy the table gives it.

``protect`` wraps each route's endpoint when the app is built; a route the table does not name
stops the app from being built at all. A guarded call is, in order: authenticated (401), its role
checked against the route's policy (403), its path and query checked for NUL and a write's
body for its ``Content-Type`` (415: a browser's cross-site form or ``text/plain`` fetch cannot be
one; a write without a body needs none), depth and NUL (400, ``shared.inputs``), then served; a
write that succeeded is written to the audit trail with the caller's credential id (and, where the
policy says ``audit_refusals``, a write the handler refused, with its code and field; a handler
may name the target with ``request.state.audit_target``). Handlers that read per-tenant data
narrow it with ``tenant_scope``; the inventory PUT checks its cluster with ``require_cluster``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from fleet_core.control_plane.auth.service import AuthService, NewEvent
from fleet_core.control_plane.auth.wire import Principal, Role
from fleet_core.shared import inputs
from fleet_core.shared.errors import FleetError, PermissionDenied, UnsupportedMediaType

__all__ = [
    "Policy",
    "allow",
    "audit_detail",
    "guard",
    "principal",
    "protect",
    "require_cluster",
    "require_tenant",
    "tenant_scope",
]

log = logging.getLogger("fleet.auth")

Endpoint = Callable[[Request], Awaitable[Response]]
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_ACTIONS = {"POST": "create", "PUT": "replace", "PATCH": "update", "DELETE": "delete"}


@dataclass(frozen=True)
class Policy:
    """Who may call one route: ``admin`` always, plus ``roles``; ``public`` needs no credential."""

    roles: frozenset[Role] = frozenset()
    public: bool = False
    action: str | None = None
    """The audit trail's verb for a write (default from the method: POST create …)."""
    audited: bool = True
    """Whether a write that succeeded is recorded in the audit trail."""
    audit_refusals: bool = False
    """Whether a write the handler refused (a 4xx after authentication) is recorded too, with
    the error's code and field: the operator's inventory report, where a refusal is a cluster
    trying to step outside its binding or its clock (ADR 0020)."""
    media: str = "application/json"
    """The Content-Type a write must carry: JSON, or ``application/octet-stream`` for an upload
    of raw bytes (neither is one a cross-site form or a ``text/plain`` fetch can send)."""

    def admits(self, role: Role) -> bool:
        return role == "admin" or role in self.roles


def allow(
    *roles: Role,
    action: str | None = None,
    audited: bool = True,
    audit_refusals: bool = False,
    media: str = "application/json",
) -> Policy:
    return Policy(
        frozenset(roles), action=action, audited=audited, audit_refusals=audit_refusals,
        media=media,
    )  # fmt: skip


def audit_detail(request: Request, detail: Mapping[str, Any]) -> None:
    """What a write changed (the values it set, and those it replaced), for its audit event."""
    request.state.audit_detail = detail


def principal(request: Request) -> Principal:
    """The caller of a guarded route (set by ``protect`` before the handler runs)."""
    found: Principal = request.state.principal
    return found


def protect(
    routes: Iterable[BaseRoute], table: Mapping[tuple[str, str], Policy], auth: AuthService
) -> list[BaseRoute]:
    """``routes`` with every ``/api/v1`` endpoint guarded; LookupError for one with no policy."""
    guarded: list[BaseRoute] = []
    for route in routes:
        if not (isinstance(route, Route) and route.path.startswith("/api/v1/")):
            guarded.append(route)
            continue
        methods = sorted((route.methods or set()) - {"HEAD"})
        missing = [m for m in methods if (m, route.path) not in table]
        if missing or len(methods) != 1:
            raise LookupError(f"{missing or methods} {route.path} needs one entry in the policy")
        policy = table[(methods[0], route.path)]
        guarded.append(guard(route, policy, auth))
    return guarded


def guard(route: Route, policy: Policy, auth: AuthService) -> Route:
    """``route`` behind ``policy``."""
    endpoint: Endpoint = route.endpoint

    @functools.wraps(endpoint)
    async def guarded(request: Request) -> Response:
        who = None
        if not policy.public:
            who = await auth.authenticate(request.headers.get("authorization"))
            if not policy.admits(who.role):
                raise PermissionDenied(
                    f"a {who.role} credential may not call {request.method} {route.path}",
                    code="insufficient_role",
                )
            request.state.principal = who
        inputs.check_text(request.path_params.items())
        inputs.check_text(request.query_params.multi_items())
        if request.method in WRITES:
            await _require_body(request, policy.media)
        try:
            response = await endpoint(request)
        except FleetError as refused:
            if who is not None and request.method in WRITES and policy.audit_refusals:
                await _audit(auth, request, who, policy, refused.status, refused=refused)
            raise
        if who is not None and request.method in WRITES and policy.audited:
            await _audit(auth, request, who, policy, response.status_code)
        return response

    return Route(route.path, guarded, methods=route.methods, name=route.name)


async def _require_body(request: Request, wanted: str) -> None:
    """A write with a body says what it is; a JSON one is shallow and free of NUL (checked
    here, once for every route, before a handler or decoder sees it). A write without a body
    (``PUT /cost-periods/2026-09``, a DELETE) needs no content type: there is nothing a
    cross-site form could smuggle in it."""
    if request.method == "DELETE":
        return  # no handler reads a DELETE's body
    if wanted != "application/json":
        _require_media(request, wanted)  # a raw upload is streamed by its handler, not read here
        return
    body = await request.body()
    if body:
        _require_media(request, wanted)
        inputs.check_json(body)


def _require_media(request: Request, wanted: str) -> None:
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != wanted:
        raise UnsupportedMediaType(
            f"{request.method} needs Content-Type: {wanted} (got {media[:80] or 'none'})",
            param="Content-Type",
        )


async def _audit(
    auth: AuthService,
    request: Request,
    who: Principal,
    policy: Policy,
    status: int,
    *,
    refused: FleetError | None = None,
) -> None:
    if status >= 400 and refused is None:
        return
    action = policy.action or _ACTIONS[request.method]
    if refused is not None:  # what was refused and where: the code and the field, no values
        action = f"{action} refused: {refused.code or status} {refused.param or ''}".strip()
    event = NewEvent(
        actor=who.id,
        actor_role=who.role,
        action=action[:200],
        method=request.method,
        target=(getattr(request.state, "audit_target", None) or request.url.path)[:1000],
        status=status,
        request_id=getattr(request.state, "request_id", None),
        detail=getattr(request.state, "audit_detail", None),
    )
    try:
        await auth.record(event)
    except Exception:  # the change is made; losing its audit line must be loud, not a 500
        log.exception("could not write the audit event of %s %s", event.method, event.target)


def tenant_scope(request: Request, asked: str | None, *, param: str = "tenantId") -> str | None:
    """The tenant a read is narrowed to. A tenant key reads its own tenant only (asking for
    another is 403, never an empty answer); other roles read what they asked for."""
    who = principal(request)
    if who.role != "tenant":
        return asked
    if asked is not None and asked != who.tenant_id:
        raise PermissionDenied(
            f"this key belongs to tenant {who.tenant_id!r}; it may not read {asked[:64]!r}",
            param=param,
            code="other_tenant",
        )
    return who.tenant_id


def require_tenant(request: Request, owner: str, *, param: str | None = None) -> None:
    """403 unless the caller may read what ``owner`` (a tenant id) owns."""
    tenant_scope(request, owner, param=param or "tenantId")


def require_cluster(request: Request, cluster_id: str) -> None:
    """An operator credential reports its own cluster only."""
    who = principal(request)
    if who.role == "operator" and who.cluster_id != cluster_id:
        raise PermissionDenied(
            f"this operator credential reports cluster {who.cluster_id!r}, not {cluster_id[:64]!r}",
            param="clusterId",
            code="other_cluster",
        )
