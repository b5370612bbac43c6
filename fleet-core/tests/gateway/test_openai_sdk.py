"""The gateway through the official openai SDK, sync and async, against stub engines."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest

from .conftest import GatewayFactory, StubFactory


async def gateway_with_stub(
    start_stub: StubFactory, start_gateway: GatewayFactory, **stub: Any
) -> Any:
    engine = await start_stub(model="Qwen/Qwen2.5-7B-Instruct", **stub)
    gw = await start_gateway(
        {
            "upstreams": [
                {
                    "id": "qwen-7b",
                    "model": "Qwen/Qwen2.5-7B-Instruct",
                    "aliases": ["qwen"],
                    "engine": "vllm",
                    "base_url": engine.url,
                }
            ]
        }
    )
    return engine, gw


async def test_chat_completion_through_an_alias(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    engine, gw = await gateway_with_stub(start_stub, start_gateway)
    client = gw.client()
    reply = await client.chat.completions.create(
        model="qwen", messages=[{"role": "user", "content": "say something nice"}]
    )
    assert reply.model == "Qwen/Qwen2.5-7B-Instruct"  # the body's model was rewritten
    assert reply.choices[0].message.content
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == 3
    [record] = await records_of(gw.url)
    assert record["engine"]["promptTokens"] == 3
    assert record["gateway"]["method"] == "estimate:utf8-bytes"
    assert record["gateway"]["completionTokens"] > 0
    assert record["endpoint"] == engine.url


async def records_of(url: str) -> list[dict[str, Any]]:
    """The gateway's usage records, newest first, read through its own API."""
    async with httpx.AsyncClient() as http:
        response = await http.get(f"{url}/api/v1/requests")
    response.raise_for_status()
    data: list[dict[str, Any]] = response.json()["data"]
    return data


async def test_completions_and_embeddings(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    _, gw = await gateway_with_stub(start_stub, start_gateway)
    client = gw.client()
    completion = await client.completions.create(model="qwen", prompt="once upon a", max_tokens=3)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 3
    embedding = await client.embeddings.create(model="qwen", input=["a b", "c"])
    assert len(embedding.data) == 2
    assert len(embedding.data[0].embedding) > 0
    records = await records_of(gw.url)
    emb = next(r for r in records if r["kind"] == "embeddings")
    assert emb["gateway"]["completionTokens"] == 0
    assert emb["engine"]["completionTokens"] == 0


async def test_sync_client_in_a_thread(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    _, gw = await gateway_with_stub(start_stub, start_gateway)

    def call() -> tuple[str | None, list[str]]:
        with openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused") as client:
            chat = client.chat.completions.create(
                model="Qwen/Qwen2.5-7B-Instruct", messages=[{"role": "user", "content": "hi"}]
            )
            stream = client.chat.completions.create(
                model="qwen", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
            return chat.choices[0].message.content, pieces

    content, pieces = await asyncio.to_thread(call)
    assert content
    assert "".join(pieces) == content


async def test_stream_usage_only_when_asked(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    _, gw = await gateway_with_stub(start_stub, start_gateway)
    client = gw.client()
    messages = [{"role": "user", "content": "tell me"}]
    asked = [
        c
        async for c in await client.chat.completions.create(
            model="qwen", messages=messages, stream=True, stream_options={"include_usage": True}
        )
    ]
    assert asked[-1].choices == []
    assert asked[-1].usage is not None
    assert asked[-1].usage.completion_tokens > 0
    plain = [
        c
        async for c in await client.chat.completions.create(
            model="qwen", messages=messages, stream=True
        )
    ]
    assert all(c.usage is None for c in plain)
    assert all(c.choices for c in plain)
    # the gateway asked the engine for usage anyway and kept it for the record
    records = await records_of(gw.url)
    assert all(r["engine"] is not None for r in records)


async def test_unknown_model_is_not_found(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    _, gw = await gateway_with_stub(start_stub, start_gateway)
    client = gw.client()
    with pytest.raises(openai.NotFoundError) as info:
        await client.chat.completions.create(
            model="gpt-7", messages=[{"role": "user", "content": "x"}]
        )
    assert info.value.code == "model_not_found"
    assert "127.0.0.1" not in str(info.value)  # nothing about the backends leaks


async def test_models_lists_names_and_aliases(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    _, gw = await gateway_with_stub(start_stub, start_gateway)
    client = gw.client()
    models = {m.id: m for m in (await client.models.list()).data}
    assert set(models) == {"Qwen/Qwen2.5-7B-Instruct", "qwen"}
    assert models["qwen"].owned_by == "vllm"
    assert models["qwen"].model_extra
    assert models["qwen"].model_extra["ready"] is True
