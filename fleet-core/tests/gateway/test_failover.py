"""Failover before the first byte, verbatim 4xx, mid-stream breaks, cancellation on disconnect."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from fleet_core.shared.asgi_server import SERVERS, Server
from fleet_testing.ports import free_port
from fleet_testing.waiting import eventually

from .conftest import GatewayFactory, StubFactory
from .test_openai_sdk import records_of

MSG = [{"role": "user", "content": "hello there"}]


def dead_url() -> str:
    """A loopback port nobody listens on: connections are refused."""
    return f"http://127.0.0.1:{free_port()}"


def fixed_engine(status: int, body: bytes, content_type: str = "application/json") -> Starlette:
    """A real HTTP server whose /health passes and whose /v1 answers the same way, counted."""
    app = Starlette()
    app.state.hits = 0

    async def answer(request: Request) -> Response:
        app.state.hits += 1
        return Response(body, status, media_type=content_type)

    async def health(request: Request) -> Response:
        return Response(b"")

    app.router.routes.append(Route("/health", health, methods=["GET"]))
    app.router.routes.append(Route("/v1/{path:path}", answer, methods=["GET", "POST"]))
    return app


async def test_failover_skips_a_dead_endpoint_and_a_503(
    start_stub: StubFactory, start_gateway: GatewayFactory, serve_app: Any
) -> None:
    broken = fixed_engine(503, b'{"error": {"message": "overloaded"}}')
    broken_url = await serve_app(broken)
    good = await start_stub(model="m")
    gw = await start_gateway(
        {
            "upstreams": [
                {"id": "dead", "model": "m", "base_url": dead_url()},
                {"id": "busy", "model": "m", "base_url": broken_url},
                {"id": "good", "model": "m", "base_url": good.url},
            ]
        }
    )
    client = gw.client()
    for _ in range(24):  # ties are random: 24 draws try the 503 one with certainty ~1 - 6e-8
        reply = await client.chat.completions.create(model="m", messages=MSG)
        assert reply.choices[0].message.content
    assert all(r["endpoint"] == good.url for r in await records_of(gw.url))
    assert broken.state.hits >= 1  # it really was tried, then skipped


async def test_fallback_pool_is_tried_when_a_pool_is_exhausted(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    small = await start_stub(model="small")
    gw = await start_gateway(
        {
            "upstreams": [
                {"id": "big", "model": "big", "base_url": dead_url(), "fallbacks": ["small"]},
                {"id": "small", "model": "small", "base_url": small.url},
            ]
        }
    )
    client = gw.client()
    reply = await client.chat.completions.create(model="big", messages=MSG)
    assert reply.model == "small"


async def test_every_endpoint_failing_is_one_upstream_error(
    start_gateway: GatewayFactory, serve_app: Any
) -> None:
    url = await serve_app(fixed_engine(503, b'{"error": {"message": "overloaded"}}'))
    gw = await start_gateway(
        {"upstreams": [{"id": "a", "model": "m", "endpoints": [dead_url(), url]}]}
    )
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{gw.url}/v1/chat/completions", json={"model": "m", "messages": MSG}
        )
    assert response.status_code == 503
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "tried" in error["message"]
    assert "overloaded" in error["message"]


async def test_a_4xx_is_returned_verbatim_and_not_retried(
    start_gateway: GatewayFactory, serve_app: Any
) -> None:
    body = (
        b'{"object":"error","message":"max_tokens is too large",'
        b'"type":"BadRequestError","code":400}'
    )
    first, second = fixed_engine(400, body), fixed_engine(400, body)
    urls = [await serve_app(first), await serve_app(second)]
    gw = await start_gateway({"upstreams": [{"id": "a", "model": "m", "endpoints": urls}]})
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{gw.url}/v1/chat/completions", json={"model": "m", "messages": MSG}
        )
    assert response.status_code == 400
    assert response.content == body
    assert first.state.hits + second.state.hits == 1


async def test_a_non_json_engine_error_is_wrapped(
    start_gateway: GatewayFactory, serve_app: Any
) -> None:
    url = await serve_app(fixed_engine(422, b"<html>nope</html>", "text/html"))
    gw = await start_gateway({"upstreams": [{"id": "a", "model": "m", "base_url": url}]})
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{gw.url}/v1/chat/completions", json={"model": "m", "messages": MSG}
        )
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/json"
    assert "nope" in response.json()["error"]["message"]


async def test_a_mid_stream_break_ends_with_an_error_frame(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    engine = await start_stub(model="m", fail_after_tokens=3)
    spare = await start_stub(model="m")
    gw = await start_gateway(
        {
            "upstreams": [
                {"id": "a", "model": "m", "endpoints": [engine.url]},
                {"id": "b", "model": "m", "endpoints": [spare.url], "slots": 1},
            ]
        }
    )
    # Routing picks either endpoint, so stream until one lands on the breaking engine (64
    # tries: all of them on the spare is a 2**-64 chance) and prove nothing was retried.
    client = gw.client()
    outcomes: list[str] = []
    while "broken" not in outcomes and len(outcomes) < 64:
        pieces: list[str] = []
        try:
            async for chunk in await client.chat.completions.create(
                model="m", messages=MSG, stream=True
            ):
                pieces.extend(c.delta.content or "" for c in chunk.choices)
            outcomes.append("complete")
        except openai.APIError as exc:
            outcomes.append("broken" if "stream" in exc.message else f"other: {exc.message}")
    assert "broken" in outcomes
    assert set(outcomes) <= {"broken", "complete"}, outcomes

    async def broken_records() -> list[dict[str, Any]]:
        return [r for r in await records_of(gw.url) if r["outcome"] == "upstream_error"]

    # Recorded once the gateway has counted what the break left (the engine's /tokenize).
    broken = await eventually(broken_records, within=10, what="the broken stream's record")
    assert all(r["endpoint"] == engine.url for r in broken)
    assert spare.stats().requests_started == outcomes.count("complete")


@pytest.mark.parametrize("server", SERVERS)  # each notices a client leaving its own way
async def test_client_disconnect_cancels_the_engine(
    start_stub: StubFactory, start_gateway: GatewayFactory, server: Server
) -> None:
    engine = await start_stub(model="m", token_delay_ms=100)
    upstreams = {"upstreams": [{"id": "a", "model": "m", "base_url": engine.url}]}
    gw = await start_gateway(upstreams, server=server)
    async with (
        httpx.AsyncClient() as http,
        http.stream(
            "POST",
            f"{gw.url}/v1/chat/completions",
            json={"model": "m", "messages": MSG, "stream": True},
        ) as response,
    ):
        frames = 0
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                frames += 1
            if frames == 3:
                break
    await eventually(lambda: engine.stats().requests_cancelled == 1, within=10)
    generated = engine.stats().tokens_generated
    await asyncio.sleep(0.3)
    assert engine.stats().tokens_generated == generated  # the engine stopped
    [record] = await records_of(gw.url)
    assert record["outcome"] == "client_disconnected"
    assert record["gateway"]["completionTokens"] >= 1  # what was relayed still counts


@pytest.mark.parametrize("server", SERVERS)  # each notices a client leaving its own way
async def test_non_stream_disconnect_cancels_the_engine_too(
    start_stub: StubFactory, start_gateway: GatewayFactory, server: Server
) -> None:
    engine = await start_stub(model="m", latency_ms=5000)
    upstreams = {"upstreams": [{"id": "a", "model": "m", "base_url": engine.url}]}
    gw = await start_gateway(upstreams, server=server)
    async with httpx.AsyncClient() as http:
        call = asyncio.create_task(
            http.post(f"{gw.url}/v1/chat/completions", json={"model": "m", "messages": MSG})
        )
        await eventually(lambda: engine.stats().requests_started == 1, within=10)
        call.cancel()  # the client gives up: its connection closes
        with pytest.raises(asyncio.CancelledError):
            await call
    await eventually(lambda: engine.stats().requests_cancelled == 1, within=10)
    assert engine.stats().requests_finished == 0
    [record] = await records_of(gw.url)  # the request left while waiting for the engine's answer
    assert record["outcome"] == "client_disconnected"
    async with httpx.AsyncClient() as http:
        health = (await http.get(f"{gw.url}/health")).json()
    assert health["upstreams"]["m"]["endpoints"][0]["inFlight"] == 0  # no slot leaked


def usage_less_stream_engine() -> Starlette:
    """An engine like llama-cpp-python's server: it ignores stream_options and sends no usage."""
    app = Starlette()

    async def chat(request: Request) -> Response:
        frames = [
            b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n',
            b'data: {"choices":[{"index":0,"delta":{"content":"twelve chars"}}]}\n\n',
            b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
            b"data: [DONE]\n\n",
        ]
        return Response(b"".join(frames), media_type="text/event-stream")

    async def health(request: Request) -> Response:
        return Response(b"")

    app.router.routes.append(Route("/v1/chat/completions", chat, methods=["POST"]))
    app.router.routes.append(Route("/health", health))
    return app


async def test_a_stream_without_engine_usage_is_still_counted(
    start_gateway: GatewayFactory, serve_app: Any
) -> None:
    url = await serve_app(usage_less_stream_engine())
    gw = await start_gateway(
        {"upstreams": [{"id": "a", "model": "m", "engine": "llamacpp", "base_url": url}]}
    )
    client = gw.client()
    chunks = [
        c
        async for c in await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "sixteen chars!!!"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    ]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "twelve chars"
    [record] = await records_of(gw.url)
    assert record["engine"] is None
    assert record["gateway"] == {  # the upper estimate: bytes (keys and values) plus one
        "promptTokens": len("role\nuser\ncontent\nsixteen chars!!!") + 1,
        "completionTokens": len("twelve chars") + 1,
        "method": "estimate:utf8-bytes",
    }


async def test_non_stream_answers_carry_content_length(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    engine = await start_stub(model="m")
    gw = await start_gateway({"upstreams": [{"id": "a", "model": "m", "base_url": engine.url}]})
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{gw.url}/v1/chat/completions", json={"model": "m", "messages": MSG}
        )
    assert response.headers["content-length"] == str(len(response.content))
    assert "transfer-encoding" not in response.headers
