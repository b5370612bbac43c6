"""Bodies built to break the gateway get a 4xx envelope: deep nesting, NUL bytes, huge names.

Deeply nested JSON reached msgspec's recursion bound and came back as a 500 (with two tracebacks
in the log, and before the rate limiter saw it); a 404 echoed a 100 KB model name whole.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from fleet_core.gateway.edge.prompting import MAX_DEPTH

from .conftest import GatewayFactory, StubFactory
from .test_bad_input import CHAT, assert_envelope


@pytest.fixture
async def gw(start_stub: StubFactory, start_gateway: GatewayFactory) -> Any:
    engine = await start_stub(model="m")
    return await start_gateway(
        {"upstreams": [{"id": "a", "model": "m", "base_url": engine.url}]},
        max_body_bytes=1 << 20,
    )


def nested(depth: int) -> bytes:
    """A chat body whose ``tools`` nest ``depth`` arrays (the body itself is one level more)."""
    return (
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": '
        + b"[" * depth
        + b"]" * depth
        + b"}"
    )


@pytest.mark.parametrize("depth", [MAX_DEPTH, 1000, 100_000])
async def test_deep_nesting_is_a_400(gw: Any, depth: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    async with httpx.AsyncClient() as http:
        response = await http.post(gw.url + CHAT, content=nested(depth))
        deep_messages = b'{"model": "m", "messages": ' + b"[" * 2000 + b"]" * 2000 + b"}"
        in_messages = await http.post(gw.url + CHAT, content=deep_messages)
    error = assert_envelope(response, 400)
    assert error["code"] == "invalid_json"
    assert "levels deep" in error["message"]
    assert_envelope(in_messages, 400)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_nesting_within_the_bound_is_served(gw: Any) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.post(gw.url + CHAT, content=nested(MAX_DEPTH - 2))
    assert response.status_code == 200, response.text


async def test_nul_bytes_reach_nothing_that_fails(gw: Any) -> None:
    nul = "a\x00b"
    body = {
        "model": "m",
        "user": nul,
        "messages": [{"role": "user", "content": nul, "name": nul}],
        "tools": [{"type": "function", "function": {"name": nul, "description": nul}}],
    }
    async with httpx.AsyncClient() as http:
        served = await http.post(gw.url + CHAT, json=body, headers={"X-Session-Id": "s"})
        unknown = await http.post(gw.url + CHAT, json={**body, "model": nul})
        log = await http.get(gw.url + "/api/v1/requests")
    assert served.status_code == 200, served.text
    assert_envelope(unknown, 404, "model")
    assert "\\x00" in unknown.json()["error"]["message"]
    assert log.status_code == 200


async def test_a_404_echoes_a_bounded_part_of_what_was_sent(gw: Any) -> None:
    huge = "m" * 100_000
    body = {"model": huge, "messages": [{"role": "user", "content": "x"}]}
    async with httpx.AsyncClient() as http:
        model = await http.post(gw.url + CHAT, json=body)
        path = await http.get(gw.url + "/v1/" + "p" * 6000)
    for response in (model, path):
        error = assert_envelope(response, 404)
        assert len(response.content) < 1000
        assert "characters)" in error["message"]
