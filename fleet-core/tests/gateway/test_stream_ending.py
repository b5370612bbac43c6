"""How a stream ends over ASGI: the frames of the read that brought the engine's end
are the response's last body (``more_body: False``), not followed by an empty one; a stream whose
end comes in a later read still sends each read's frames at once and ends with an empty body.
Real HTTP on both sides: a raw-socket engine, the gateway served by a real server, with every
message the gateway sends recorded on its way to the server."""

from __future__ import annotations

import contextlib
import time

import httpx
import msgspec
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fleet_core.gateway.app import create_gateway_app, open_resources
from fleet_core.gateway.config import GatewayConfig
from fleet_core.gateway.metering.records import EngineUsage
from fleet_core.gateway.settings import GatewaySettings, LogSettings
from fleet_testing.asgi import serving
from fleet_testing.fix_fault_engine import (
    END,
    FaultEngine,
    FaultEngineFactory,
    chat_frames,
    chunked,
    frame,
    sse,
    usage_frame,
)

from .money import records

FRAMES = b"".join([*chat_frames(["fine", " thanks"]), usage_frame(3, 2), frame("[DONE]")])
"""The engine's frames, chunked (the gateway asked for usage: it removes the usage frame)."""
PAUSE_S = 0.3


def _recording(app: ASGIApp, sent: list[tuple[float, Message]]) -> ASGIApp:
    async def recorded(scope: Scope, receive: Receive, send: Send) -> None:
        async def record(message: Message) -> None:
            sent.append((time.monotonic(), message))
            await send(message)

        streamed = scope["type"] == "http" and scope["path"] == "/v1/chat/completions"
        await app(scope, receive, record if streamed else send)

    return recorded


async def _stream(
    stack: contextlib.AsyncExitStack, engine: FaultEngine, *script: bytes | float
) -> tuple[bytes, list[tuple[float, Message]]]:
    """The body a client got for one chat stream the engine answered with ``script``, and the
    ASGI messages the gateway sent for it."""
    upstream = {"id": "m", "model": "m", "base_url": engine.url}
    config = msgspec.convert({"upstreams": [upstream]}, GatewayConfig)
    settings = GatewaySettings(config=config, log=LogSettings(access=False))
    app = create_gateway_app(settings, await stack.enter_async_context(open_resources(settings)))
    sent: list[tuple[float, Message]] = []
    url = await stack.enter_async_context(serving(_recording(app, sent)))
    engine.then(script)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        got = await http.post("/v1/chat/completions", json=body)
    assert got.status_code == 200, got.text
    (record,) = await records(url)
    assert (record.outcome, record.status, record.engine) == ("ok", 200, EngineUsage(3, 2, 0))
    return got.content, [(at, m) for at, m in sent if m["type"] == "http.response.body"]


def _client_frames(extra: bytes = b"") -> bytes:
    """What the client gets of `FRAMES` (and of ``extra``): unchunked, no usage frame."""
    chunk = b'{"choices":[{"index":0,"delta":{"content":"%s"}}]}'
    words = [chunk % word for word in (b"fine", b" thanks")]
    done = b'{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}'
    return b"".join(b"data: " + f + b"\n\n" for f in [*words, done, b"[DONE]"]) + extra


async def test_the_read_that_brings_the_end_is_the_last_body(
    stack: contextlib.AsyncExitStack, fault_engine: FaultEngineFactory
) -> None:
    engine = await fault_engine()
    body, sent = await _stream(stack, engine, sse() + FRAMES + END)  # one write, one read
    assert body == _client_frames()
    assert [(m["body"], m["more_body"]) for _, m in sent] == [(body, False)]


async def test_a_frame_left_open_at_the_end_goes_with_the_last_body(
    stack: contextlib.AsyncExitStack, fault_engine: FaultEngineFactory
) -> None:
    engine = await fault_engine()
    tail = b'data: {"choices":[]}'  # no blank line after it: relayed as the engine wrote it
    body, sent = await _stream(stack, engine, sse() + FRAMES + chunked(tail) + END)
    assert body == _client_frames(tail)
    assert [(m["body"], m["more_body"]) for _, m in sent] == [(body, False)]


async def test_an_end_in_a_later_read_sends_the_frames_at_once_then_ends(
    stack: contextlib.AsyncExitStack, fault_engine: FaultEngineFactory
) -> None:
    engine = await fault_engine()
    body, sent = await _stream(stack, engine, sse() + FRAMES, PAUSE_S, END)
    assert body == _client_frames()
    assert [(m["body"], m["more_body"]) for _, m in sent] == [(body, True), (b"", False)]
    (frames_at, _), (end_at, _) = sent
    assert end_at - frames_at >= PAUSE_S * 0.8  # the frames did not wait for the end
