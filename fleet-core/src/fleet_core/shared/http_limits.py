"""Bounds on what a client may send before the app sees a request: the head's size, its number of
header fields, and the time to send the head and the body (ADR 0022).

Authentication runs in the app, so everything before it is open to anyone who can connect: a 20 MB
header block was answered 200, five unfinished 30 MB blocks took a gateway from 83 to 221 MB, and
300 connections sending their heads a byte at a time were held for as long as they liked. The two
servers we ship bound these in different places (`asgi_server`):

- uvicorn with httptools bounds nothing itself, so `uvicorn_protocol` subclasses its protocol: the
  head's bytes and fields are counted as they arrive (431 past `HttpLimits.max_head_bytes` or
  `HttpLimits.max_headers`, before the rest is buffered), a timer runs from the connection's first
  moment (or a keep-alive request's first byte) to the end of the head, and another from there to
  the end of the body; either one running out answers 408 and closes the connection.
- hypercorn serves each connection with `hypercorn_guard.GuardedTCPServer`, which counts the
  head's bytes as they are read and times the head the same way; `GuardedApp` adds the field
  count and the body's deadline in front of the app.

Every refusal is an OpenAI-style envelope, as the app's own errors are.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from fleet_core.shared.errors import FleetError, HeadersTooLarge, RequestTimeout

__all__ = [
    "KEEP_ALIVE_DEFAULT_S",
    "GuardedApp",
    "HttpLimits",
    "answer",
    "head_ends_within",
    "too_large",
    "too_slow",
    "uvicorn_protocol",
]

KEEP_ALIVE_DEFAULT_S = 75.0
"""Idle keep-alive: longer than the 60 s idle timeout of common load balancers, so the balancer,
not the server, closes an idle connection (no request lost on a connection closing under it)."""


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What one request may send before the app is called. The defaults fit every OpenAI client
    and browser: nginx allows 32 KiB of head by default, Apache 100 fields."""

    max_head_bytes: int = 32 * 1024
    """The request line and header fields together, in bytes."""
    max_headers: int = 100
    """Header fields in one request."""
    head_timeout_s: float = 10.0
    """From the connection's start (or a keep-alive request's first byte) to the end of the head."""
    body_timeout_s: float = 60.0
    """From the end of the head to the end of the body: a 1 MiB body at 20 KB/s."""
    keep_alive_s: float = KEEP_ALIVE_DEFAULT_S
    """An idle connection's life between requests."""


def answer(error: FleetError) -> bytes:
    """A whole HTTP/1.1 answer carrying ``error``'s envelope, closing the connection."""
    body = msgspec.json.encode(error.envelope())
    head = (
        f"HTTP/1.1 {error.status} {_REASONS[error.status]}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


_REASONS = {408: "Request Timeout", 431: "Request Header Fields Too Large"}


def too_large(limits: HttpLimits) -> HeadersTooLarge:
    return HeadersTooLarge(
        f"The request's header fields exceed {limits.max_head_bytes} bytes or "
        f"{limits.max_headers} fields."
    )


def too_slow(what: str, seconds: float) -> RequestTimeout:
    return RequestTimeout(
        f"The request's {what} did not arrive within {seconds:g}s.", headers={"Connection": "close"}
    )


def head_ends_within(data: bytes, head_bytes: int, max_head_bytes: int) -> bool:
    """Whether a head counted at ``head_bytes`` with ``data`` last ends within ``max_head_bytes``
    in ``data`` (what follows is body or the next request, which the head's count leaves out)."""
    end = data.find(b"\r\n\r\n")
    return end != -1 and head_bytes - len(data) + end + 4 <= max_head_bytes


def uvicorn_protocol(limits: HttpLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol bounded by ``limits`` (for ``uvicorn.Config(http=...)``)."""
    return type("GuardedHttpTools", (_GuardedHttpTools,), {"limits": limits})


class _GuardedHttpTools(HttpToolsProtocol):
    """Timers are armed only when a request is left unfinished by the data that arrived: a
    request whose head and body come in one read (the usual case) costs no timer at all."""

    limits: ClassVar[HttpLimits]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._in_head, self._in_body, self._head_bytes = True, False, 0
        self._refusal: bytes | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._arm(self.limits.head_timeout_s)  # a connection that never sends a byte

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
            limit = self.limits.max_head_bytes
            if self._head_bytes > limit and not head_ends_within(data, self._head_bytes, limit):
                self._refuse(answer(too_large(self.limits)))
                return
        super().data_received(data)
        if self._timer is None and not self.transport.is_closing():
            if self._in_body:
                self._arm(self.limits.body_timeout_s)  # from the end of the head
            elif self._in_head and self._head_bytes:
                self._arm(self.limits.head_timeout_s)  # from the head's first read

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a parser error: ours when a field count stopped the parser."""
        if self._refusal is not None:
            self._refuse(self._refusal)
        else:
            super().send_400_response(msg)

    def on_headers_complete(self) -> None:
        # The head is at most max_head_bytes, so counting its fields once it is whole holds
        # no more memory than counting each as it comes (and costs no call per field).
        if len(self.headers) > self.limits.max_headers:
            self._refusal = answer(too_large(self.limits))
            raise HeadersTooLarge("too many header fields")  # stops the parser
        self._in_head, self._in_body = False, True
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        # The next request's head is counted (and timed) from its first read.
        self._in_head, self._in_body, self._head_bytes = True, False, 0
        self._disarm()
        super().on_message_complete()

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._late)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _late(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        started = self._in_body or self._head_bytes > 0
        answered = self.cycle is not None and self.cycle.response_started
        if self._in_head and not started:
            self.transport.close()  # connected, sent nothing: nobody to answer
        elif answered:
            self.transport.close()
        else:
            what, seconds = ("head", self.limits.head_timeout_s)
            if not self._in_head:
                what, seconds = ("body", self.limits.body_timeout_s)
            self._refuse(answer(too_slow(what, seconds)))

    def _refuse(self, answer: bytes) -> None:
        if self.cycle is not None:
            self.cycle.disconnected = True  # the app's own answer, if any, goes nowhere
        self.transport.write(answer)
        self.transport.close()


class GuardedApp:
    """In front of an app served by hypercorn: 431 past ``max_headers`` fields, and 408 when the
    body has not all arrived ``body_timeout_s`` after the app was called (the head's size and
    time `hypercorn_guard` bounds)."""

    def __init__(self, app: ASGIApp, limits: HttpLimits) -> None:
        self.app, self.limits = app, limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if len(scope["headers"]) > self.limits.max_headers:
            await _send_error(send, too_large(self.limits))
            return
        await self.app(scope, _Deadline(receive, self.limits.body_timeout_s), send)


class _Deadline:
    """``receive`` until the body's last part, each wait bounded by what is left of the body's
    time; later messages (a disconnect) unbounded."""

    __slots__ = ("_at", "_receive", "_seconds")

    def __init__(self, receive: Receive, seconds: float) -> None:
        self._receive, self._seconds = receive, seconds
        self._at: float | None = asyncio.get_running_loop().time() + seconds

    async def __call__(self) -> Message:
        if self._at is None:
            return await self._receive()
        left = self._at - asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(max(left, 0.0)):
                message = await self._receive()
        except TimeoutError:
            raise too_slow("body", self._seconds) from None
        if message["type"] != "http.request" or not message.get("more_body", False):
            self._at = None
        return message


async def _send_error(send: Send, error: FleetError) -> None:
    body = msgspec.json.encode(error.envelope())
    headers: list[Any] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
