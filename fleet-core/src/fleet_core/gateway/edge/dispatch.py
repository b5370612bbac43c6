"""The gateway's outermost ASGI app: the OpenAI POST routes straight to their handlers.

A proxied request through Starlette passes its error middleware, the request-id middleware, CORS,
the exception middleware, the router and the endpoint wrapper, and every message it sends passes
five wrappers back out: about 15% of a gateway process under load (ADR 0002). So a ``POST`` to
``/v1/chat/completions``, ``/v1/completions`` or ``/v1/embeddings`` goes straight to its handler
(`routes._Proxy`), inside the same `RequestContextMiddleware` (request id, access line); the
handler renders its own errors with the same envelope. Everything else — other paths and methods,
the lifespan, and any request carrying an ``Origin`` header, so CORS applies exactly as
configured — goes through the Starlette app as before.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.applications import Starlette
from starlette.datastructures import State
from starlette.types import ASGIApp, Receive, Scope, Send

from fleet_core.shared.logs import RequestContextMiddleware

__all__ = ["GatewayApp"]


class GatewayApp:
    def __init__(self, app: Starlette, hot: Mapping[str, ASGIApp], *, access_log: bool) -> None:
        self.app = app
        self._hot = {
            path: RequestContextMiddleware(handler, access_log=access_log)
            for path, handler in hot.items()
        }

    @property
    def state(self) -> State:
        """The Starlette app's state (router, admission, database: for tests and tools)."""
        return self.app.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self._hot.get(scope["path"])
            if handler is not None and not _has_origin(scope["headers"]):
                await handler(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _has_origin(headers: list[tuple[bytes, bytes]]) -> bool:
    # A loop, not `any` over a generator: half the instructions, on every request.
    for name, _ in headers:  # noqa: SIM110
        if name == b"origin":
            return True
    return False
