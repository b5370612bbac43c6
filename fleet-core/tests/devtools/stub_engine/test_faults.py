"""Misbehaviour on demand: broken streams, slow starts, full engines, and clients who leave."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import openai
import pytest
from starlette.applications import Starlette

from fleet_core.devtools.stub_engine import DEFAULT_REPLY
from fleet_testing.waiting import eventually

MODEL = "stub-model"
Launch = Callable[..., Awaitable[Starlette]]
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def stats(http: httpx.AsyncClient, app: Starlette) -> dict[str, Any]:
    response = await http.get(f"{app.state.base_url}/stats")
    assert response.status_code == 200
    result: dict[str, Any] = response.json()
    return result


async def test_stream_breaks_uncleanly_after_n_content_frames(
    launch: Launch, http: httpx.AsyncClient
) -> None:
    app = await launch(fail_after_tokens=3)
    body = {**CHAT, "stream_options": {"include_usage": True}}
    lines: list[str] = []

    async def read() -> None:
        url = f"{app.state.base_url}/v1/chat/completions"
        async with http.stream("POST", url, json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                lines.append(line)

    with pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"):
        await read()
    data = [line for line in lines if line.startswith("data: ")]
    assert len(data) == 1 + 3  # the role frame and three content frames, then nothing
    assert "data: [DONE]" not in lines
    after = await stats(http, app)
    assert (after["requests_failed"], after["requests_finished"], after["tokens_generated"]) == (
        1,
        0,
        3,
    )


async def test_sdk_stream_sees_the_break(launch: Launch) -> None:
    app = await launch(fail_after_tokens=2)
    received: list[str] = []
    async with openai.AsyncOpenAI(
        base_url=f"{app.state.base_url}/v1", api_key="k", max_retries=0
    ) as sdk:
        stream = await sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        )

        async def read() -> None:
            async for chunk in stream:
                received.append(chunk.choices[0].delta.content or "")

        with pytest.raises(openai.APIConnectionError) as caught:
            await read()
    assert "incomplete chunked read" in str(caught.value.__cause__)
    assert "".join(received) == " ".join(DEFAULT_REPLY.split()[:2])


async def test_short_replies_finish_before_the_fault_strikes(
    launch: Launch, http: httpx.AsyncClient
) -> None:
    app = await launch(fail_after_tokens=5)
    body = {**CHAT, "max_tokens": 4}
    response = await http.post(f"{app.state.base_url}/v1/chat/completions", json=body)
    assert response.text.endswith("data: [DONE]\n\n")


async def test_non_stream_requests_fail_with_500(launch: Launch) -> None:
    app = await launch(fail_after_tokens=3)
    async with openai.AsyncOpenAI(
        base_url=f"{app.state.base_url}/v1", api_key="k", max_retries=0
    ) as sdk:
        with pytest.raises(openai.InternalServerError) as caught:
            await sdk.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}]
            )
    assert caught.value.status_code == 500
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["type"] == "InternalServerError"
    assert app.state.stats.requests_failed == 1


async def test_disconnect_mid_stream_cancels_generation(
    launch: Launch, http: httpx.AsyncClient
) -> None:
    app = await launch(token_delay_ms=30)
    url = f"{app.state.base_url}/v1/chat/completions"
    async with http.stream("POST", url, json=CHAT) as response:
        seen = 0
        async for line in response.aiter_lines():
            seen += line.startswith("data: ")
            if seen == 3:  # role frame and two tokens
                break

    async def cancelled() -> bool:
        return bool((await stats(http, app))["requests_cancelled"] == 1)

    await eventually(cancelled, within=3)
    generated = (await stats(http, app))["tokens_generated"]
    await asyncio.sleep(0.15)  # five more token delays
    after = await stats(http, app)
    assert after["tokens_generated"] == generated
    assert 2 <= generated < len(DEFAULT_REPLY.split())
    assert (after["requests_finished"], after["running"], after["waiting"]) == (0, 0, 0)
    assert app.state.stats.requests_cancelled == 1


async def test_latency_delays_the_response(launch: Launch, http: httpx.AsyncClient) -> None:
    app = await launch(latency_ms=200)
    started = time.monotonic()
    response = await http.get(f"{app.state.base_url}/health")
    assert time.monotonic() - started < 0.15  # only generation is slowed
    started = time.monotonic()
    response = await http.post(
        f"{app.state.base_url}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 200
    assert time.monotonic() - started >= 0.2


async def test_running_and_waiting_are_real_counts(launch: Launch, http: httpx.AsyncClient) -> None:
    app = await launch(max_num_seqs=1, token_delay_ms=40)
    body = {**CHAT, "max_tokens": 5}
    url = f"{app.state.base_url}/v1/chat/completions"
    first = asyncio.create_task(http.post(url, json=body))
    second = asyncio.create_task(http.post(url, json=body))

    async def both_in() -> bool:
        now = await stats(http, app)
        return bool(now["running"] == 1 and now["waiting"] == 1)

    await eventually(both_in, within=3)
    metrics = (await http.get(f"{app.state.base_url}/metrics")).text
    assert 'vllm:num_requests_running{model_name="stub-model"} 1.0' in metrics
    assert 'vllm:num_requests_waiting{model_name="stub-model"} 1.0' in metrics
    assert 'vllm:kv_cache_usage_perc{model_name="stub-model"} 1.0' in metrics
    assert all(r.status_code == 200 for r in await asyncio.gather(first, second))
    after = await stats(http, app)
    assert (after["running"], after["waiting"], after["requests_finished"]) == (0, 0, 2)
