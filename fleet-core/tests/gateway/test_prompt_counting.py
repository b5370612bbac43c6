"""Every prompt-bearing field is counted for the reservation and the fallback bill.

Only ``messages[].content`` used to be counted: a body of tools, schemas and tool-call arguments
was reserved and billed as a couple of tokens, so it passed a tenant's tokens-per-minute limit
many times over. Against a real gateway, a raw-socket engine and a real Redis (anonymous tenant
at `TPM` tokens per minute).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from fleet_core.gateway.edge.wire import parse_request, prompt_text
from fleet_core.gateway.metering.counting import estimate_tokens
from fleet_testing.fix_fault_engine import END, OK_CHAT, chat_frames, sse

from .conftest import TPM, Rig, RigFactory
from .money import envelope

CHAT = "/v1/chat/completions"


def tools(size: int) -> list[dict[str, Any]]:
    """Function tools whose schemas hold about ``size`` bytes of descriptions."""
    description = "Looks the value up in the company directory. " * (size // 46 + 1)
    return [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": description[:size],
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
    ]


@pytest.fixture
async def rig(start_rig: RigFactory) -> Rig:
    return await start_rig(read_timeout_s=10)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tools", tools(4000)),
        ("functions", [{"name": "f", "parameters": {"description": "d" * 4000}}]),
        ("tool_choice", {"type": "function", "function": {"name": "n" * 4000}}),
        ("response_format", {"type": "json_schema", "json_schema": {"schema": {"x": "s" * 4000}}}),
        ("prediction", {"type": "content", "content": "p" * 4000}),
        ("chat_template_kwargs", {"documents": ["d" * 4000]}),
    ],
)
def test_each_prompt_bearing_field_is_counted(field: str, value: Any) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], field: value}
    text, ids = prompt_text(parse_request("chat", httpx.Request("POST", "/", json=body).content))
    assert estimate_tokens(text) >= 4000
    assert ids == 0


def test_assistant_tool_calls_and_non_text_parts_are_counted() -> None:
    arguments = '{"q": "' + "a" * 3000 + '"}'
    image = "data:image/png;base64," + "A" * 3000
    messages = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}}]},
        {
            "role": "assistant",
            "tool_calls": [{"id": "c", "type": "function", "function": {"arguments": arguments}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": "done"},
    ]
    raw = httpx.Request("POST", "/", json={"model": "m", "messages": messages}).content
    text, _ = prompt_text(parse_request("chat", raw))
    assert arguments in text
    assert image in text
    assert estimate_tokens(text) >= 6000


def test_sampling_options_are_not_the_prompt() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stop": ["s" * 100],
        "logit_bias": {"50256": -100},
        "user": "u" * 100,
    }
    text, _ = prompt_text(parse_request("chat", httpx.Request("POST", "/", json=body).content))
    assert "s" * 100 not in text
    assert "u" * 100 not in text
    assert "hi" in text


async def test_a_body_larger_than_the_limit_is_refused_before_it_is_forwarded(rig: Rig) -> None:
    """A 432 KB body of tools on a tenant far below it was admitted, forwarded, and billed two
    prompt tokens."""
    response = await rig.send(tools=tools(432_000))
    assert response.status_code == 400, response.text
    error = envelope(response)
    assert error["code"] == "reservation_exceeds_capacity"
    assert f"tpm={TPM}" in error["message"]
    assert rig.engine.hits == 0
    await rig.books.check(admitted=0)


async def test_a_client_leaving_mid_stream_is_billed_its_whole_prompt(rig: Rig) -> None:
    """With no usage frame (the client left first) the fallback bill counted 2 prompt tokens
    for a body of tools."""
    rig.engine.then([sse(), *chat_frames(["one"], finish=None), 5.0, END])
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "tools": tools(2000),
        "max_tokens": 100,
        "stream": True,
    }
    async with httpx.AsyncClient() as http, http.stream("POST", rig.gw.url + CHAT, json=body) as r:
        async for line in r.aiter_lines():
            if "one" in line:
                break  # leaves with the first word
    [record] = await rig.books.check(admitted=1)
    assert record.outcome == "client_disconnected"
    assert record.engine is None
    assert record.prompt_tokens >= 2000


async def test_concurrent_tool_bodies_cannot_all_pass_the_limit(rig: Rig) -> None:
    """Four concurrent requests with 40 KB of tools under a 1,000-token budget were all
    admitted (40,040 tokens billed). Here each reserves about 2,600 of `TPM`'s 6,000, and the
    engine holds each answer so all four are in flight at once: at most two fit."""
    for _ in range(4):
        rig.engine.then([1.0, OK_CHAT])
    answers = await asyncio.gather(*(rig.send(tools=tools(2400), max_tokens=100) for _ in range(4)))
    statuses = sorted(a.status_code for a in answers)
    assert statuses.count(200) == 2, statuses
    assert statuses.count(429) == 2, statuses
    found = await rig.books.check(admitted=2)
    assert all(r.gateway.prompt_tokens >= 2400 for r in found if r.outcome != "refused")
