"""Bearer-key check on ``/v1``, as ``vllm serve --api-key`` and ``llama-server --api-key`` do.

Plain ASGI rather than Starlette's ``BaseHTTPMiddleware``, so a keyed stub costs one header scan
per request. It is mounted inside the router, so the `Unauthorized` it raises reaches the same
exception handler as every other error. ``/health`` and ``/metrics`` stay open, as on the real
engines.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from fleet_core.devtools.stub_engine.errors import Unauthorized

__all__ = ["BearerAuth"]


class BearerAuth:
    def __init__(self, app: ASGIApp, *, key: str) -> None:
        self.app = app
        self.expected = b"Bearer " + key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._allowed(scope):
            raise Unauthorized("Unauthorized: send the engine's key as `Authorization: Bearer`")
        await self.app(scope, receive, send)

    def _allowed(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                return hmac.compare_digest(value, self.expected)
        return False
