"""Without the engine's usage frame, the engine's own ``/tokenize`` counts what was relayed.

A client that reads what it wants and leaves before ``finish_reason`` gets no usage frame from the
engine, and the record falls back to the gateway's count. Without a ``tokenizer.json`` that count
is the upper estimate (one token per byte): the gateway asks the engine that answered, which
holds the real tokenizer, and keeps the estimate when it cannot say.
"""

from __future__ import annotations

import httpx
import pytest

from fleet_core.gateway.exchange.tokenize import METHOD
from fleet_core.gateway.metering.counting import ESTIMATE
from fleet_testing.waiting import eventually

from .conftest import MSG, GatewayFactory, StubFactory
from .money import records

WORDS = 60


async def leave_after(url: str, frames: int) -> None:
    body = {"model": "m", "messages": MSG, "stream": True, "max_tokens": 100}
    async with (
        httpx.AsyncClient() as http,
        http.stream("POST", f"{url}/v1/chat/completions", json=body) as response,
    ):
        seen = 0
        async for line in response.aiter_lines():
            seen += line.startswith("data:")
            if seen == frames:
                return


async def the_record(url: str) -> dict:
    async def found() -> dict | None:
        async with httpx.AsyncClient() as http:
            data = (await http.get(f"{url}/api/v1/requests")).json()["data"]
        return data[0] if data else None

    return await eventually(found, within=10, what="the usage record")


@pytest.mark.parametrize("profile", ["vllm", "llamacpp"])
async def test_a_client_leaving_mid_stream_is_billed_the_engines_count(
    start_stub: StubFactory, start_gateway: GatewayFactory, profile: str
) -> None:
    engine = await start_stub(
        model="m", profile=profile, token_delay_ms=30, reply=" ".join(["word"] * WORDS)
    )
    gw = await start_gateway({"upstreams": [{"id": "a", "model": "m", "base_url": engine.url}]})
    await leave_after(gw.url, 4)
    record = await the_record(gw.url)
    assert record["outcome"] == "client_disconnected"
    assert record["engine"] is None
    assert record["gateway"]["method"] == METHOD
    # one token a word, as the stub counts: well under the estimate's one token a byte
    assert 1 <= record["gateway"]["completionTokens"] < WORDS
    [billed] = await records(gw.url)
    assert billed.completion_tokens == record["gateway"]["completionTokens"]


async def test_an_engine_that_cannot_count_leaves_the_estimate(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    """An engine that does not serve ``/tokenize`` (the stub without that route): 404, and the
    estimate stays."""
    engine = await start_stub(model="m", token_delay_ms=30, reply=" ".join(["word"] * WORDS))
    served = {"id": "a", "model": "m", "base_url": engine.url}
    gw = await start_gateway({"upstreams": [served]})
    engine.app.router.routes = [r for r in engine.app.router.routes if r.path != "/tokenize"]
    await leave_after(gw.url, 4)
    record = await the_record(gw.url)
    assert record["engine"] is None
    assert record["gateway"]["method"] == ESTIMATE
