"""--api-key: /v1 needs the bearer key; /health and /metrics stay open, as on the engines."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx
import openai
import pytest
from starlette.applications import Starlette

MODEL = "stub-model"
Launch = Callable[..., Awaitable[Starlette]]


@pytest.fixture
async def keyed(launch: Launch) -> Starlette:
    return await launch(api_key="sekrit")


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"}]
)
@pytest.mark.parametrize("path", ["/v1/models", "/v1/does-not-exist"])
async def test_v1_refuses_without_the_key(
    keyed: Starlette, http: httpx.AsyncClient, headers: dict[str, str], path: str
) -> None:
    response = await http.get(f"{keyed.state.base_url}{path}", headers=headers)
    assert response.status_code == 401
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("AuthenticationError", 401)
    assert keyed.state.stats.requests_started == 0


async def test_v1_answers_with_the_key(keyed: Starlette) -> None:
    base_url = f"{keyed.state.base_url}/v1"
    async with openai.AsyncOpenAI(base_url=base_url, api_key="sekrit", max_retries=0) as sdk:
        answer = await sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )
    assert answer.choices[0].finish_reason == "stop"
    async with openai.AsyncOpenAI(base_url=base_url, api_key="wrong", max_retries=0) as sdk:
        with pytest.raises(openai.AuthenticationError):
            await sdk.models.list()


async def test_health_and_metrics_need_no_key(keyed: Starlette, http: httpx.AsyncClient) -> None:
    assert (await http.get(f"{keyed.state.base_url}/health")).status_code == 200
    assert (await http.get(f"{keyed.state.base_url}/metrics")).status_code == 200


async def test_no_key_configured_means_open(stub: Starlette, http: httpx.AsyncClient) -> None:
    assert (await http.get(f"{stub.state.base_url}/v1/models")).status_code == 200
