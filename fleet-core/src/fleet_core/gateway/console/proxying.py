"""The console's control-plane calls, passed through the gateway (ADR 0012).

The browser talks to one origin: ``/api/v1/*`` that the gateway does not serve itself goes to the
control plane unchanged, with the caller's own ``Authorization`` (the gateway adds no credential
of its own, so a console user can do exactly what their credential may). Responses stream, so the
registry's pull events (SSE) and CSV downloads pass as they come.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from yarl import URL

from fleet_core.gateway.edge.routes import read_body
from fleet_core.shared.errors import NotFound, UpstreamError, shown

__all__ = ["FORWARDED_REQUEST", "FORWARDED_RESPONSE", "proxy_routes"]

FORWARDED_REQUEST = (
    "authorization",
    "content-type",
    "accept",
    "if-match",
    "if-none-match",
    "last-event-id",
    "x-request-id",
)
FORWARDED_RESPONSE = (
    "content-type",
    "content-disposition",
    "content-encoding",
    "cache-control",
    "etag",
    "retry-after",
    "www-authenticate",
    "x-request-id",
    "location",
)
_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=300)


class _Proxy:
    def __init__(self, session: aiohttp.ClientSession, api_url: str | None, max_body: int) -> None:
        self.session, self.api_url, self.max_body = session, api_url, max_body

    async def forward(self, request: Request) -> Response:
        if self.api_url is None:
            raise NotFound(
                f"no route for {request.method} {shown(request.url.path)}: this gateway passes "
                "no calls to a control plane (set FLEET_CONSOLE_API_URL to its URL)",
                code="no_control_plane",
            )
        body = await read_body(request, self.max_body)
        url = self._url(request)
        headers = {k: v for k, v in request.headers.items() if k in FORWARDED_REQUEST}
        try:
            upstream = await self.session.request(
                request.method,
                url,
                data=body or None,
                headers=headers,
                timeout=_TIMEOUT,
                allow_redirects=False,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamError(
                f"the control plane at {self.api_url} did not answer: {type(exc).__name__}",
                code="control_plane_unavailable",
            ) from exc
        kept = {k: v for k, v in upstream.headers.items() if k.lower() in FORWARDED_RESPONSE}
        return StreamingResponse(
            _chunks(upstream),
            upstream.status,
            headers=kept,
            background=BackgroundTask(upstream.release),
        )

    def _url(self, request: Request) -> URL:
        """The control plane's URL for this call: path and query exactly as the browser encoded
        them (re-encoding could turn a ``+`` in a time's offset into a space)."""
        path = request.scope.get("raw_path") or request.url.path.encode()
        query = request.scope.get("query_string", b"")
        raw = f"{self.api_url}{path.decode('latin-1')}"
        return URL(f"{raw}?{query.decode('latin-1')}" if query else raw, encoded=True)


async def _chunks(upstream: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    try:
        async for chunk in upstream.content.iter_any():
            yield chunk
    finally:
        upstream.release()


def proxy_routes(
    session: aiohttp.ClientSession, api_url: str | None, *, max_body: int
) -> list[BaseRoute]:
    """Before the console's shell route, after the gateway's own ``/api/v1/requests``."""
    proxy = _Proxy(session, api_url, max_body)
    methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]
    return [Route("/api/v1/{rest:path}", proxy.forward, methods=methods)]
