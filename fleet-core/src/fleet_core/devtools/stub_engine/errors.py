"""Errors the stub answers with, rendered the way the imitated engine renders them.

    StubError                       {"error": {"message", "type", "param", "code"}}
     ├── BadRequest          400    invalid JSON, missing or mistyped fields, bad values
     ├── Unauthorized        401    missing or wrong bearer key on a /v1 route
     ├── NotFound            404    unknown model, unknown /v1 path
     ├── MethodNotAllowed    405
     └── EngineFailure       500    injected by ``fail_after_tokens`` on a non-streamed request

vLLM names its error types after the OpenAI SDK's exception classes ("NotFoundError") and puts
the status in ``code``; llama-server uses snake_case types ("not_found_error"). Each class carries
both, and `handlers` renders the one of the configured profile, so endpoints only raise.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import ClassVar

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from fleet_core.devtools.stub_engine.settings import Profile

__all__ = [
    "BadRequest",
    "EngineFailure",
    "ErrorBody",
    "ErrorEnvelope",
    "MethodNotAllowed",
    "NotFound",
    "StubError",
    "Unauthorized",
    "handlers",
]


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorEnvelope(msgspec.Struct, frozen=True, kw_only=True):
    error: ErrorBody


class StubError(Exception):
    """Base of every error the stub renders as an OpenAI-style envelope."""

    status: ClassVar[int] = 500
    vllm_type: ClassVar[str] = "InternalServerError"
    llamacpp_type: ClassVar[str] = "server_error"
    headers: ClassVar[Mapping[str, str]] = MappingProxyType({})

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def envelope(self, profile: Profile) -> ErrorEnvelope:
        kind = self.vllm_type if profile == "vllm" else self.llamacpp_type
        body = ErrorBody(message=self.message, type=kind, param=self.param, code=self.status)
        return ErrorEnvelope(error=body)


class BadRequest(StubError):
    status = 400
    vllm_type = "BadRequestError"
    llamacpp_type = "invalid_request_error"


class Unauthorized(StubError):
    status = 401
    vllm_type = "AuthenticationError"
    llamacpp_type = "authentication_error"
    headers: ClassVar[Mapping[str, str]] = MappingProxyType({"www-authenticate": "Bearer"})


class NotFound(StubError):
    status = 404
    vllm_type = "NotFoundError"
    llamacpp_type = "not_found_error"


class MethodNotAllowed(StubError):
    status = 405
    vllm_type = "MethodNotAllowedError"
    llamacpp_type = "invalid_request_error"


class EngineFailure(StubError):
    """The engine broke mid-request (an injected fault)."""


Handler = Callable[[Request, Exception], Awaitable[Response]]


def handlers(profile: Profile) -> dict[type[Exception], Handler]:
    """Starlette exception handlers rendering every error in ``profile``'s style."""
    encoder = msgspec.json.Encoder()

    async def render(_: Request, exc: Exception) -> Response:
        error = exc if isinstance(exc, StubError) else _from_http(exc)
        return Response(
            encoder.encode(error.envelope(profile)),
            status_code=error.status,
            headers=dict(error.headers),
            media_type="application/json",
        )

    return {StubError: render, HTTPException: render}


def _from_http(exc: Exception) -> StubError:
    """Starlette's own 404/405 (unknown path, wrong method) in the stub's envelope."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else str(exc)
    if status == 404:
        return NotFound(detail)
    if status == 405:
        return MethodNotAllowed(detail)
    return BadRequest(detail) if 400 <= status < 500 else EngineFailure(detail)
