"""The console's files: ``/assets/*`` as themselves, every other page path as the app shell.

The shell (index.html) answers any GET that no route matched and that is not an API path, so a
deep link such as ``/costs`` survives a reload. Assets are content-hashed by vite, so they are
cached for a year; a missing asset is a 404, never the shell (a browser handed index.html for a
script fails in ways that are hard to see). Without a build, a placeholder says how to make one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, Response
from starlette.routing import BaseRoute, Route

from fleet_core.gateway.console.settings import ConsoleSettings
from fleet_core.shared.errors import NotFound, shown
from fleet_core.shared.web import Handler

__all__ = ["CONTENT_TYPES", "PLACEHOLDER", "console_routes", "with_shell"]

IMMUTABLE = "public, max-age=31536000, immutable"
API_PREFIXES = ("/v1/", "/api/", "/assets/")
CONTENT_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".woff2": "font/woff2",
    ".json": "application/json",
    ".map": "application/json",
    ".txt": "text/plain; charset=utf-8",
}
SHELL_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # antd writes its styles at run time (CSS-in-JS), hence style-src 'unsafe-inline'
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
}
PLACEHOLDER = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Fleet console: not built</title></head>
<body style="font-family: sans-serif; max-width: 40em; margin: 4em auto">
<h1>The Fleet console is not built</h1>
<p>This gateway serves the operator console from its package data, and no build is there yet.
Build it from a checkout with <code>make web</code> (npm ci and vite build; <code>make dev</code>
does it for you), or point <code>FLEET_CONSOLE_DIR</code> at a built console.</p>
<p>The OpenAI API is served all the same under <code>/v1</code>.</p>
</body></html>
"""


class _Files:
    def __init__(self, root: Path) -> None:
        self.root = root

    async def asset(self, request: Request) -> Response:
        name = request.path_params["name"]
        assets = (self.root / "assets").resolve()
        path = (assets / name).resolve()
        if not path.is_relative_to(assets) or not path.is_file():
            raise NotFound(f"no asset {shown(request.url.path)}", code="asset_not_found")
        kind = CONTENT_TYPES.get(path.suffix, "application/octet-stream")
        headers = {"Cache-Control": IMMUTABLE, "X-Content-Type-Options": "nosniff"}
        return FileResponse(path, media_type=kind, headers=headers)

    async def shell(self, request: Request) -> Response | None:
        """The app shell for a page path; None for anything else (an API path, a write)."""
        path = request.url.path
        if request.method not in ("GET", "HEAD") or path.startswith(API_PREFIXES):
            return None
        index = self.root / "index.html"
        if not index.is_file():
            return HTMLResponse(PLACEHOLDER, headers=SHELL_HEADERS)
        return FileResponse(index, media_type="text/html; charset=utf-8", headers=SHELL_HEADERS)


def console_routes(settings: ConsoleSettings) -> list[BaseRoute]:
    files = _Files(settings.static_dir)
    return [Route("/assets/{name:path}", files.asset, methods=["GET", "HEAD"])]


def with_shell(settings: ConsoleSettings, handlers: dict[Any, Handler]) -> dict[Any, Handler]:
    """``handlers`` with the app shell answering what no route matched (a 404), so routing keeps
    its own answers — a 405 for a known path with the wrong method stays a 405."""
    files = _Files(settings.static_dir)
    otherwise = handlers[HTTPException]

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        shell = await files.shell(request) if exc.status_code == 404 else None
        return shell if shell is not None else await otherwise(request, exc)

    return {**handlers, HTTPException: on_http_error}
