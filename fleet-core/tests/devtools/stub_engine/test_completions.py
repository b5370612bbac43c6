"""/v1/completions: the legacy endpoint, including its default of 16 tokens."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx
import openai
import pytest
from starlette.applications import Starlette

from fleet_core.devtools.stub_engine import DEFAULT_REPLY

MODEL = "stub-model"
Launch = Callable[..., Awaitable[Starlette]]


def client(app: Starlette) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{app.state.base_url}/v1", api_key="k", max_retries=0)


async def test_sdk_completion_returns_reply_and_usage(stub: Starlette) -> None:
    async with client(stub) as sdk:
        answer = await sdk.completions.create(model=MODEL, prompt="Once upon a time")
    assert answer.id.startswith("cmpl-")
    assert answer.object == "text_completion"
    assert answer.choices[0].text == DEFAULT_REPLY
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == 4
    assert answer.usage.completion_tokens == len(DEFAULT_REPLY.split())


async def test_default_max_tokens_is_16_as_in_vllm(launch: Launch) -> None:
    app = await launch(reply=" ".join(f"w{i}" for i in range(20)))
    async with client(app) as sdk:
        answer = await sdk.completions.create(model=MODEL, prompt="go")
        longer = await sdk.completions.create(model=MODEL, prompt="go", max_tokens=100)
    assert answer.choices[0].finish_reason == "length"
    assert answer.choices[0].text == " ".join(f"w{i}" for i in range(16))
    assert longer.choices[0].finish_reason == "stop"
    assert longer.usage is not None
    assert longer.usage.completion_tokens == 20


@pytest.mark.parametrize(("prompt", "tokens"), [([5, 6, 7], 3), (["one two"], 2), ([[1, 2]], 2)])
async def test_token_id_and_single_item_prompts(
    stub: Starlette, prompt: list[int] | list[str] | list[list[int]], tokens: int
) -> None:
    async with client(stub) as sdk:
        answer = await sdk.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == tokens
    assert answer.choices[0].finish_reason == "length"


async def test_batch_prompts_are_refused(stub: Starlette, http: httpx.AsyncClient) -> None:
    response = await http.post(
        f"{stub.state.base_url}/v1/completions", json={"model": MODEL, "prompt": ["a", "b"]}
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "prompt"


async def test_missing_prompt_is_a_400(stub: Starlette, http: httpx.AsyncClient) -> None:
    response = await http.post(f"{stub.state.base_url}/v1/completions", json={"model": MODEL})
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": "Object missing required field `prompt`",
        "type": "BadRequestError",
        "param": "prompt",
        "code": 400,
    }
