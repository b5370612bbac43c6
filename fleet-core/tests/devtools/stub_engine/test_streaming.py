"""SSE streams, frame by frame: role frame, deltas, finish, optional usage, [DONE]."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import openai
from starlette.applications import Starlette

from fleet_core.devtools.stub_engine import DEFAULT_REPLY

MODEL = "stub-model"
WORDS = DEFAULT_REPLY.split()
Launch = Callable[..., Awaitable[Starlette]]
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "one two three"}], "stream": True}


def parse(body: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The JSON frames and the raw data payloads; asserts strict ``data: ...\\n\\n`` framing."""
    assert body.endswith("\n\n")
    events = body[:-2].split("\n\n")
    assert all(event.startswith("data: ") and "\n" not in event for event in events)
    payloads = [event.removeprefix("data: ") for event in events]
    return [json.loads(p) for p in payloads if p != "[DONE]"], payloads


async def post(http: httpx.AsyncClient, app: Starlette, path: str, body: object) -> httpx.Response:
    response = await http.post(f"{app.state.base_url}/v1/{path}", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    return response


async def test_chat_stream_with_include_usage(stub: Starlette, http: httpx.AsyncClient) -> None:
    body = {**CHAT, "stream_options": {"include_usage": True}}
    frames, payloads = parse((await post(http, stub, "chat/completions", body)).text)

    assert payloads[-1] == "[DONE]"
    assert payloads.count("[DONE]") == 1
    assert len({frame["id"] for frame in frames}) == 1
    assert all(frame["object"] == "chat.completion.chunk" for frame in frames)
    *chunks, last = frames
    assert all("usage" in chunk and chunk["usage"] is None for chunk in chunks)
    assert last["choices"] == []
    assert last["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": len(WORDS),
        "total_tokens": 3 + len(WORDS),
    }
    first, *deltas, finish = chunks
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [d["choices"][0]["delta"]["content"] for d in deltas] == [WORDS[0]] + [
        " " + w for w in WORDS[1:]
    ]
    assert all(d["choices"][0]["finish_reason"] is None for d in deltas)
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert finish["choices"][0]["delta"] == {"content": ""}


async def test_chat_stream_without_include_usage_never_mentions_usage(
    stub: Starlette, http: httpx.AsyncClient
) -> None:
    response = await post(http, stub, "chat/completions", CHAT)
    frames, payloads = parse(response.text)
    assert payloads[-1] == "[DONE]"
    assert all("usage" not in frame for frame in frames)
    assert "usage" not in response.text
    assert frames[-1]["choices"][0]["finish_reason"] == "stop"


async def test_truncated_stream_finishes_with_length_on_the_last_delta(
    stub: Starlette, http: httpx.AsyncClient
) -> None:
    body = {**CHAT, "max_tokens": 2, "stream_options": {"include_usage": True}}
    frames, _ = parse((await post(http, stub, "chat/completions", body)).text)
    _role, one, two, usage = frames
    assert one["choices"][0]["delta"] == {"content": WORDS[0]}
    assert two["choices"][0]["delta"] == {"content": " " + WORDS[1]}
    assert two["choices"][0]["finish_reason"] == "length"
    assert usage["usage"]["completion_tokens"] == 2


async def test_completion_stream(stub: Starlette, http: httpx.AsyncClient) -> None:
    body = {
        "model": MODEL,
        "prompt": "a b",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    frames, payloads = parse((await post(http, stub, "completions", body)).text)
    assert payloads[-1] == "[DONE]"
    *chunks, finish, last = frames
    assert "".join(c["choices"][0]["text"] for c in chunks) == DEFAULT_REPLY
    assert all(c["object"] == "text_completion" and c["usage"] is None for c in chunks)
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert last["choices"] == []
    assert last["usage"]["prompt_tokens"] == 2


async def test_sdk_stream_assembles_reply_and_usage(stub: Starlette) -> None:
    async with openai.AsyncOpenAI(
        base_url=f"{stub.state.base_url}/v1", api_key="k", max_retries=0
    ) as sdk:
        stream = await sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == DEFAULT_REPLY
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(WORDS)


async def test_frames_are_flushed_one_by_one(launch: Launch, http: httpx.AsyncClient) -> None:
    delay = 0.04
    app = await launch(token_delay_ms=delay * 1000)
    arrivals: list[float] = []
    body = {**CHAT, "max_tokens": 4}
    async with http.stream("POST", f"{app.state.base_url}/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                arrivals.append(time.monotonic())
    # role, 4 deltas (the last one finishing), [DONE]. A buffered body would arrive all at once;
    # a flushed one spreads over the three token delays between the first and the last delta.
    assert len(arrivals) == 6
    assert arrivals[4] - arrivals[1] >= 3 * delay * 0.8, arrivals
