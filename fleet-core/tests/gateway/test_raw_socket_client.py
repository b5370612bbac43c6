"""A hostile client on raw sockets, against the gateway served by both servers we ship.

Before the bounds (`shared.http_limits`), a 20 MB header block was answered 200 on uvicorn, five
unfinished 30 MB blocks took a gateway from 83 to 221 MB, and 300 connections sending their heads a
byte at a time were held for 100 s and never closed. Every answer here is read off the socket as
the client sees it: an envelope with a 4xx status, or a closed connection, within the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

from fleet_core.shared.asgi_server import SERVERS
from fleet_core.shared.http_limits import HttpLimits
from fleet_testing.raw_http import (
    CLOSED_WITHIN_S,
    Answer,
    answer_of,
    connect,
    envelope,
    rss_mb,
    send_slowly,
    unfinished_head,
)

from .conftest import GatewayFactory, StubFactory

LIMITS = HttpLimits(head_timeout_s=1.0, body_timeout_s=1.0, keep_alive_s=30.0)
"""Tight time bounds so that each test waits a second, not the shipped ten; a long keep-alive, so
that what closes a slow head is the head's own bound, not the idle timer."""
CHAT = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"


@pytest.fixture(params=SERVERS)
async def gw(request: Any, start_stub: StubFactory, start_gateway: GatewayFactory) -> Any:
    engine = await start_stub(model="m")
    config = {"upstreams": [{"id": "a", "model": "m", "base_url": engine.url}]}
    served = await start_gateway(config, server=request.param, limits=LIMITS)
    served.server = request.param
    return served


async def test_a_huge_header_block_is_refused(gw: Any) -> None:
    reader, writer = await connect(gw.url)
    block = CHAT + b"X-Big: " + b"a" * (20 << 20) + b"\r\n\r\n"
    sending = asyncio.create_task(send_slowly(writer, block, 65536))
    answer = await answer_of(reader)
    sending.cancel()
    writer.close()
    assert envelope(answer, 431)["code"] == "request_headers_too_large"


async def test_unfinished_header_blocks_keep_memory_bounded(gw: Any) -> None:
    """Five connections each start a 30 MB header block and never finish it."""
    before = rss_mb()

    async def one() -> Answer:
        reader, writer = await connect(gw.url)
        piece = b"a" * 65536
        with contextlib.suppress(ConnectionError):
            writer.write(CHAT + b"X-Big: ")
            for _ in range((30 << 20) // len(piece)):
                writer.write(piece)
                await writer.drain()
        answer = await answer_of(reader)
        writer.close()
        return answer

    answers = await asyncio.gather(*(one() for _ in range(5)))
    assert all(a.status in (431, None) for a in answers), answers
    assert rss_mb() - before < 40, f"RSS grew from {before:.0f} to {rss_mb():.0f} MB"


async def test_too_many_header_fields_are_refused(gw: Any) -> None:
    reader, writer = await connect(gw.url)
    fields = b"".join(b"X-F%d: v\r\n" % i for i in range(LIMITS.max_headers + 5))
    writer.write(CHAT + fields + b"Content-Length: 2\r\n\r\n{}")
    answer = await answer_of(reader)
    writer.close()
    assert envelope(answer, 431)["code"] == "request_headers_too_large"


async def test_slowloris_connections_are_closed_within_the_bound(gw: Any) -> None:
    """Fifty connections send their heads a few bytes every 0.2 s, forever; the head's time
    later (not the keep-alive's), every one has been closed."""
    started = time.monotonic()

    async def one() -> float:
        reader, writer = await connect(gw.url)
        head = CHAT + b"".join(b"X-Slow-%d: v\r\n" % i for i in range(LIMITS.max_headers - 5))
        with contextlib.suppress(ConnectionError):
            for start in range(0, len(head), 4):
                if reader.at_eof():
                    break
                writer.write(head[start : start + 4])
                await writer.drain()
                await asyncio.sleep(0.2)
                with contextlib.suppress(TimeoutError):  # closed yet?
                    async with asyncio.timeout(0.001):
                        if not await reader.read(65536):
                            break
        writer.close()
        return time.monotonic() - started

    closed_after = await asyncio.wait_for(asyncio.gather(*(one() for _ in range(50))), 20)
    assert max(closed_after) < LIMITS.head_timeout_s + CLOSED_WITHIN_S, max(closed_after)


async def test_a_silent_connection_is_closed(gw: Any) -> None:
    reader, writer = await connect(gw.url)
    started = time.monotonic()
    answer = await answer_of(reader, within=LIMITS.head_timeout_s + CLOSED_WITHIN_S)
    writer.close()
    assert answer.status in (None, 408), answer
    assert time.monotonic() - started < LIMITS.head_timeout_s + CLOSED_WITHIN_S


async def test_a_body_that_never_finishes_is_a_408(gw: Any) -> None:
    reader, writer = await connect(gw.url)
    writer.write(CHAT + b"Content-Length: 100\r\n\r\n" + b'{"model": "m"')
    answer = await answer_of(reader)
    writer.close()
    assert envelope(answer, 408)["code"] == "request_timeout"


async def test_deep_json_and_nul_bytes_over_a_raw_socket(gw: Any) -> None:
    deep = b'{"model": "m", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    nul = b'{"model": "m\\u0000", "messages": [{"role": "user", "content": "a\\u0000b"}]}'
    answers = []
    for body in (deep, nul):
        reader, writer = await connect(gw.url)
        writer.write(CHAT + b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        answers.append(await answer_of(reader))
        writer.close()
    assert envelope(answers[0], 400)["code"] == "invalid_json"
    assert envelope(answers[1], 404)["param"] == "model"


async def test_an_unfinished_head_is_a_408_within_the_heads_time(gw: Any) -> None:
    bound = LIMITS.head_timeout_s + CLOSED_WITHIN_S
    answer, closed_after = await unfinished_head(gw.url, CHAT + b"X-Slow: ", within=bound)
    assert envelope(answer, 408)["code"] == "request_timeout"
    assert closed_after < bound


async def test_ordinary_requests_still_pass(gw: Any) -> None:
    """Two requests on one kept-alive connection, each well within every bound, the second sent
    after the connection sat idle for longer than a head may take (idle is the keep-alive's)."""
    reader, writer = await connect(gw.url)
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    request = CHAT + b"Content-Length: %d\r\n\r\n" % len(body) + body
    for pause in (0.0, LIMITS.head_timeout_s * 1.5):
        await asyncio.sleep(pause)
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200"), head
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
    writer.close()
