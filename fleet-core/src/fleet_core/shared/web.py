"""What every Fleet HTTP app shares: error rendering and the outer middleware.

One exception handler keyed on ``FleetError`` renders the OpenAI-style envelope; Starlette's own
404/405 and anything unexpected are rendered the same way, so no client ever sees a router page or
a traceback.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

import msgspec
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from fleet_core.shared import inputs
from fleet_core.shared.errors import (
    FleetError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    shown,
)
from fleet_core.shared.logs import RequestContextMiddleware

__all__ = [
    "LOOPBACK_ORIGINS",
    "TrailingSlashMiddleware",
    "decode",
    "exception_handlers",
    "json_response",
    "middleware",
    "render",
]

log = logging.getLogger("fleet.web")

LOOPBACK_ORIGINS = r"^https?://(127\.0\.0\.1|localhost|\[::1\])(:[0-9]+)?$"
"""Browsers on this machine (the console) are allowed by default; FLEET_CORS_ORIGINS adds more."""

Handler = Callable[[Request, Exception], Coroutine[Any, Any, Response]]
T = TypeVar("T")

_AT = re.compile(r" - at `\$\.?(.*)`$")
_MISSING = re.compile(r"missing required field `([^`]+)`")


def json_response(
    value: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        msgspec.json.encode(value),
        status,
        headers=dict(headers or {}),
        media_type="application/json",
    )


def decode(decoder: msgspec.json.Decoder[T], body: bytes) -> T:
    """``body`` decoded (bounded first by `inputs.check_json`), or 400 whose ``param`` is the wire
    path msgspec blamed (``requestLimit``, ``nodes[0].count``), so clients learn which field to
    fix without parsing the message."""
    inputs.check_json(body)
    try:
        return decoder.decode(body)
    except RecursionError as exc:  # check_json bounds the depth; this is the last line behind it
        raise InvalidRequest("the body nests too deeply", code="too_deep") from exc
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"invalid request body: {exc}", param=_blamed(str(exc))) from exc
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}", code="invalid_json") from exc


def _blamed(message: str) -> str | None:
    at = _AT.search(message)
    path = at[1] if at else ""
    if missing := _MISSING.search(message):
        path = f"{path}.{missing[1]}" if path else missing[1]
    return path or None


def render(error: FleetError) -> Response:
    return json_response(error.envelope(), error.status, error.headers)


async def _on_fleet_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, FleetError)
    return render(exc)


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        message = f"{request.method} is not allowed on {shown(request.url.path)}"
        return render(MethodNotAllowed(message, headers={"Allow": _allowed(request)}))
    if exc.status_code == 404:
        return render(NotFound(f"no route for {request.method} {shown(request.url.path)}"))
    return render(FleetError(str(exc.detail)))


def _allowed(request: Request) -> str:
    """Every method the path is served for: a path's methods may be spread over several routes
    (Starlette's own 405 names only the first route's)."""
    methods: set[str] = set()
    for route in getattr(request.app, "routes", ()):
        if isinstance(route, Route) and route.matches(request.scope)[0] != Match.NONE:
            methods |= route.methods or set()
    return ", ".join(sorted(methods))


async def _on_crash(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error serving %s", request.url.path, exc_info=exc)
    return render(FleetError("an internal error occurred; it has been logged"))


_CONTROL = re.compile(r"[\x01-\x1f\x7f]")
"""ASCII control characters but NUL (refused by name, per parameter: `inputs.check_text`)."""


class TrailingSlashMiddleware:
    """``/api/v1/tenants/`` is ``/api/v1/tenants``: a trailing slash is tolerated everywhere,
    without a redirect (a client that PUTs a body must not be sent elsewhere). A path holding a
    control character is a 400 before routing: a line break would stop a ``{name:path}`` route
    from matching, and the client would read a 404 for a route that exists."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and _CONTROL.search(path):
            refused = InvalidRequest(
                "the path holds a control character (a line break, a tab, …): percent-encoding "
                "does not make one part of a name",
                code="control_character",
            )
            await render(refused)(scope, receive, send)
            return
        if scope["type"] == "http" and len(path) > 1 and path.endswith("/"):
            scope = {**scope, "path": path.rstrip("/") or "/"}
        await self.app(scope, receive, send)


def exception_handlers() -> dict[Any, Handler]:
    return {FleetError: _on_fleet_error, HTTPException: _on_http_error, Exception: _on_crash}


def middleware(*, access_log: bool, cors_origins: tuple[str, ...] = ()) -> list[Middleware]:
    """Request id and access log outermost, then CORS (loopback plus ``cors_origins``)."""
    return [
        Middleware(RequestContextMiddleware, access_log=access_log),
        Middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_origin_regex=LOOPBACK_ORIGINS,
            allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"],
            allow_headers=["*"],
            expose_headers=["X-Request-Id", "X-Fleet-Request-Id", "Retry-After", "ETag"],
            max_age=600,
        ),
    ]
