"""/v1/chat/completions answered whole, through the official SDK (async and sync) and raw."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from starlette.applications import Starlette

from fleet_core.devtools.stub_engine import DEFAULT_REPLY

MODEL = "stub-model"
REPLY_TOKENS = len(DEFAULT_REPLY.split())


def client(app: Starlette) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{app.state.base_url}/v1", api_key="unused", max_retries=0)


async def test_async_sdk_gets_the_canned_reply_with_usage(stub: Starlette) -> None:
    async with client(stub) as sdk:
        answer = await sdk.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Say something nice"},
            ],
        )
    assert answer.id.startswith("chatcmpl-")
    assert answer.object == "chat.completion"
    assert answer.model == MODEL
    (choice,) = answer.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == DEFAULT_REPLY
    assert choice.finish_reason == "stop"
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == 6
    assert answer.usage.completion_tokens == REPLY_TOKENS
    assert answer.usage.total_tokens == 6 + REPLY_TOKENS
    assert answer.usage.prompt_tokens_details is None


async def test_sync_sdk_works_from_a_thread(stub: Starlette) -> None:
    def ask() -> tuple[str | None, int]:
        with openai.OpenAI(
            base_url=f"{stub.state.base_url}/v1", api_key="unused", max_retries=0
        ) as sdk:
            answer = sdk.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": [{"type": "text", "text": "a b c"}]}],
            )
        assert answer.usage is not None
        return answer.choices[0].message.content, answer.usage.prompt_tokens

    assert await asyncio.to_thread(ask) == (DEFAULT_REPLY, 3)


async def test_max_tokens_truncates_with_finish_reason_length(stub: Starlette) -> None:
    hi: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    async with client(stub) as sdk:
        legacy = await sdk.chat.completions.create(model=MODEL, messages=hi, max_tokens=3)
        newer = await sdk.chat.completions.create(
            model=MODEL, messages=hi, max_completion_tokens=2, max_tokens=5
        )
    assert legacy.choices[0].message.content == " ".join(DEFAULT_REPLY.split()[:3])
    assert legacy.choices[0].finish_reason == "length"
    assert legacy.usage is not None
    assert legacy.usage.completion_tokens == 3
    assert newer.choices[0].message.content == " ".join(DEFAULT_REPLY.split()[:2])  # it wins


async def test_cached_prompt_reports_half_its_tokens_cached(stub: Starlette) -> None:
    async with client(stub) as sdk:
        answer = await sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "reuse the cached prefix please"}]
        )
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == 5
    assert answer.usage.prompt_tokens_details is not None
    assert answer.usage.prompt_tokens_details.cached_tokens == 2


async def test_usage_without_cache_has_no_prompt_tokens_details_key(
    stub: Starlette, http: httpx.AsyncClient
) -> None:
    response = await http.post(
        f"{stub.state.base_url}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert set(response.json()["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}


async def test_unknown_model_is_the_sdks_not_found_error(stub: Starlette) -> None:
    async with client(stub) as sdk:
        with pytest.raises(openai.NotFoundError) as caught:
            await sdk.chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "hi"}]
            )
    assert caught.value.status_code == 404
    assert caught.value.body == {
        "message": "The model `no-such-model` does not exist.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"", None),
        (b'{"messages": [{"role": "user", "content": "hi"}], "model": "stub-model"', None),
        (b'{"model": "stub-model"}', "messages"),
        (b'{"model": "stub-model", "messages": "hi"}', "messages"),
        (b'{"model": "stub-model", "messages": [], "max_tokens": 0}', "max_tokens"),
        (
            b'{"model": "stub-model", "messages": [], "stream_options": {"include_usage": true}}',
            "stream_options",
        ),
    ],
)
async def test_bad_requests_get_a_400_envelope(
    stub: Starlette, http: httpx.AsyncClient, body: bytes, param: str | None
) -> None:
    response = await http.post(f"{stub.state.base_url}/v1/chat/completions", content=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"], error["param"]) == ("BadRequestError", 400, param)
    assert error["message"]


async def test_missing_model_is_a_404(stub: Starlette, http: httpx.AsyncClient) -> None:
    response = await http.post(f"{stub.state.base_url}/v1/chat/completions", json={"messages": []})
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "NotFoundError"
