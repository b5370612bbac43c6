"""Every error fleet-core answers a client with, and how it renders.

    FleetError                      rendered as {"error": {"message", "type", "param", "code"}}
     ├── InvalidRequest      400    the client's mistake, naming the parameter
     │    └── ReservationTooLarge    400   can never fit a limit's capacity (not an endless 429)
     ├── AuthenticationError 401    missing or unknown key (WWW-Authenticate: Bearer)
     ├── PermissionDenied    403
     ├── NotFound            404    incl. ModelNotFound
     ├── MethodNotAllowed    405
     ├── RequestTimeout      408    the request's head or body took longer than its bound
     ├── Conflict            409
     ├── PayloadTooLarge     413
     ├── UnsupportedMediaType 415   a write whose body is not application/json
     ├── RateLimited         429    carries Retry-After
     ├── HeadersTooLarge     431    too many header fields, or too many bytes of them
     ├── UpstreamError       502    no engine could answer; or wraps an engine's non-JSON error
     │                              (504 when an engine accepted the request and then timed out)
     └── Unavailable         503    a dependency (Redis, database) is down
    ConfigError                     a configuration that cannot work; the process refuses to start

HTTP handlers raise these; one exception handler (``gateway.app``) renders them, so no endpoint
builds error JSON by hand.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

__all__ = [
    "AuthenticationError",
    "ConfigError",
    "Conflict",
    "ErrorBody",
    "ErrorEnvelope",
    "FleetError",
    "HeadersTooLarge",
    "InvalidRequest",
    "MethodNotAllowed",
    "ModelNotFound",
    "NotFound",
    "PayloadTooLarge",
    "PermissionDenied",
    "RateLimited",
    "RequestTimeout",
    "ReservationTooLarge",
    "Unavailable",
    "UnsupportedMediaType",
    "UpstreamError",
    "shown",
]


class ErrorBody(msgspec.Struct, frozen=True):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorEnvelope(msgspec.Struct, frozen=True):
    error: ErrorBody


class ConfigError(Exception):
    """A configuration that cannot work. ``str()`` is the one line printed before exiting."""


class FleetError(Exception):
    """Base of every error rendered to a client as an OpenAI-style envelope."""

    status: int = 500
    type: ClassVar[str] = "server_error"
    default_code: ClassVar[str | None] = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code or self.default_code
        self.headers = headers or {}

    def envelope(self) -> ErrorEnvelope:
        return ErrorEnvelope(ErrorBody(self.message, self.type, self.param, self.code))


class InvalidRequest(FleetError):
    status = 400
    type = "invalid_request_error"


class ReservationTooLarge(InvalidRequest):
    default_code = "reservation_exceeds_capacity"


class AuthenticationError(FleetError):
    status = 401
    type = "authentication_error"
    default_code = "invalid_api_key"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class PermissionDenied(FleetError):
    status = 403
    type = "permission_error"


class NotFound(FleetError):
    status = 404
    type = "invalid_request_error"
    default_code = "not_found"


class ModelNotFound(NotFound):
    default_code = "model_not_found"


class MethodNotAllowed(FleetError):
    status = 405
    type = "invalid_request_error"
    default_code = "method_not_allowed"


class Conflict(FleetError):
    status = 409
    type = "invalid_request_error"
    default_code = "conflict"


class PayloadTooLarge(FleetError):
    status = 413
    type = "invalid_request_error"
    default_code = "payload_too_large"


class RequestTimeout(FleetError):
    """Sent by the server's guard (`shared.http_limits`), which closes the connection after it."""

    status = 408
    type = "invalid_request_error"
    default_code = "request_timeout"


class HeadersTooLarge(FleetError):
    status = 431
    type = "invalid_request_error"
    default_code = "request_headers_too_large"


class UnsupportedMediaType(FleetError):
    status = 415
    type = "invalid_request_error"
    default_code = "unsupported_media_type"


class RangeNotSatisfiable(FleetError):
    status = 416
    type = "invalid_request_error"
    default_code = "range_not_satisfiable"

    def __init__(self, message: str, *, size: int) -> None:
        super().__init__(message, param="Range", headers={"Content-Range": f"bytes */{size}"})


class RateLimited(FleetError):
    status = 429
    type = "rate_limit_error"
    default_code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after: float, code: str | None = None) -> None:
        seconds = max(1, int(retry_after + 0.999))
        super().__init__(message, code=code, headers={"Retry-After": str(seconds)})
        self.retry_after = seconds


class UpstreamError(FleetError):
    status = 502
    type = "upstream_error"
    default_code = "upstream_unavailable"

    def __init__(
        self,
        message: str,
        *,
        status: int = 502,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, code=code, headers=headers)
        self.status = status


class Unavailable(FleetError):
    status = 503
    type = "service_unavailable"
    default_code = "unavailable"


SHOWN_CHARS = 200
"""The most characters of a client's own value (a model name, a path) an error message echoes."""


def shown(value: str, most: int = SHOWN_CHARS) -> str:
    """``value`` quoted for an error message, cut to ``most`` characters (its length said), so a
    100 KB model name is not sent back, logged and stored whole."""
    if len(value) <= most:
        return repr(value)
    return f"{value[:most]!r}… ({len(value)} characters)"
