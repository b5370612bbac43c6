"""Structured logging with a request id on every line, and the ASGI middleware that sets it.

``FLEET_LOG_FORMAT=json`` prints one JSON object per line; the default is readable text. The id
comes from the client's ``X-Request-Id`` when it is sane (printable, at most 128 characters) and is
otherwise made up; either way it is echoed on the response and forwarded to the engine. Secrets
never reach a log line: nothing here logs headers or bodies.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import uuid
from contextvars import ContextVar
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["RequestContextMiddleware", "current_request_id", "setup_logging"]

access_log = logging.getLogger("fleet.access")
request_id_var: ContextVar[str | None] = ContextVar("fleet_request_id", default=None)
_RESERVED = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


def current_request_id() -> str | None:
    return request_id_var.get()


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if request_id := request_id_var.get():
            line["request_id"] = request_id
        line.update({k: v for k, v in record.__dict__.items() if k not in _RESERVED})
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        request_id = request_id_var.get()
        return f"{base} [request_id={request_id}]" if request_id else base


def setup_logging(*, fmt: str = "text", level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(_TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def _sane(value: str) -> bool:
    return 0 < len(value) <= 128 and value.isprintable()


class RequestContextMiddleware:
    """Request id in, request id out, and one access line per request. Pure ASGI.

    One wrapper does both so the hot path pays for one extra ``send`` hop, not two; no
    BaseHTTPMiddleware, which would buffer streams and cost a task per request. The access line
    carries method, path, status and duration, never headers or bodies (no secret can leak).
    """

    def __init__(self, app: ASGIApp, *, access_log: bool = True) -> None:
        self.app = app
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == b"x-request-id"), b"")
        text = given.decode("latin-1")
        request_id = text if _sane(text) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        token = request_id_var.set(request_id)
        header = (b"x-request-id", request_id.encode("latin-1"))
        start, status = time.perf_counter(), 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if self.access_log:
                _log_access(scope, status, time.perf_counter() - start)
            request_id_var.reset(token)


def _log_access(scope: Scope, status: int, seconds: float) -> None:
    ms = round(seconds * 1000, 2)
    method, path = scope["method"], scope["path"]
    access_log.info(
        "%s %s %s %.2fms",
        method,
        path,
        status,
        ms,
        extra={"method": method, "path": path, "status": status, "duration_ms": ms},
    )
