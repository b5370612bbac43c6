"""Requests once billed wrong or not at all, reproduced against a real gateway, a raw-socket
engine and a real Redis.

Every test here failed on the code before the fix; the invariants of `money.Books` (buckets back
to capacity minus what was billed, gauge at 0, one record each, no 500) close most of them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import httpx
import pytest

from fleet_core.gateway.metering.counting import estimate_tokens
from fleet_testing.fix_fault_engine import (
    END,
    OK_CHAT,
    chat_frames,
    frame,
    sse,
    usage_frame,
)
from fleet_testing.waiting import eventually

from .conftest import Rig, RigFactory
from .money import envelope

DEFAULT_MAX_TOKENS = 64


@pytest.fixture
async def rig(start_rig: RigFactory) -> Rig:
    return await start_rig(env={"FLEET_DEFAULT_MAX_TOKENS": str(DEFAULT_MAX_TOKENS)}, slots=1)


# -- item 2: every admitted request is recorded and settled, whatever happens ----------------


async def test_a_slot_refusal_inside_open_is_recorded_and_settled(start_rig: RigFactory) -> None:
    """The engine's only slot is taken: the second request's 429 came from inside proxy.open
    (RateLimited) and skipped finish(): no record, the reservation never refunded, the gauge
    stuck at 1."""
    rig = await start_rig(slots=1, read_timeout_s=10)
    rig.engine.then([2.0, OK_CHAT])  # holds the slot well past the 0.2 s queue timeout
    first = asyncio.create_task(rig.send())
    await eventually(lambda: rig.engine.hits == 1 and rig.spare.hits == 0, within=5)
    second = await rig.send()
    assert second.status_code == 429
    assert envelope(second)["code"] == "engine_overloaded"
    assert (await first).status_code == 200
    found = await rig.books.check(admitted=2)
    refused = [r for r in found if r.status == 429]
    assert len(refused) == 1
    assert refused[0].prompt_tokens == 0


async def test_a_client_leaving_mid_upload_is_clean(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """It used to log ``unhandled error ClientDisconnect`` (a traceback for a normal event)."""
    host, port = rig.gw.url.removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n" + b'{"model": "m", "messages": [' + b" " * 5000
    )
    await writer.drain()
    await asyncio.sleep(0.2)
    writer.close()
    await asyncio.sleep(0.3)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert rig.engine.hits == 0
    await rig.books.check(admitted=0)


# -- item 3: the reservation is the worst case -------------------------------------------------


async def test_n_multiplies_the_reservation(rig: Rig) -> None:
    """At tpm 6,000, six concurrent n=5, max_tokens=1000 requests were all admitted."""
    rig.spare.default = [0.3, OK_CHAT]
    statuses = await asyncio.gather(*(rig.send(n=5, model="s") for _ in range(6)))
    codes = sorted(s.status_code for s in statuses)
    assert codes == [200] + [429] * 5  # 5 × 1000 + prompt fits once in 6000, never twice
    await rig.books.check(admitted=1)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": ["a", "b", "c"], "max_tokens": 2500}, "max_tokens"),  # 3 × 2500 > 6000
        ({"prompt": "a", "max_tokens": 1000, "n": 2, "best_of": 7}, "max_tokens"),  # 7 × 1000
        ({"prompt": "a", "max_tokens": 10**400}, "max_tokens"),
        ({"prompt": "a", "n": 10**400}, "n"),
        ({"prompt": "a", "n": 3, "best_of": 2}, "best_of"),
        ({"prompt": "a", "best_of": 0}, "best_of"),
    ],
)
async def test_completions_bounds_and_worst_cases_are_400(
    rig: Rig, body: dict[str, object], param: str
) -> None:
    """A list prompt and best_of were ignored; max_tokens of 10^400 was a 500 (float overflow)."""
    response = await rig.send(path="/v1/completions", messages=None, model="s", **body)
    assert response.status_code == 400, response.text
    assert envelope(response)["param"] == param
    assert rig.spare.hits == 0
    await rig.books.check(admitted=0)


@pytest.mark.parametrize(
    ("path", "body", "forwarded"),
    [
        ("/v1/chat/completions", {"max_tokens": None}, {"max_tokens": DEFAULT_MAX_TOKENS}),
        (
            "/v1/chat/completions",
            {"max_tokens": None, "max_completion_tokens": 9},
            {"max_tokens": 9},  # the one name every engine reads (exchange/lengths.py)
        ),
        (
            "/v1/completions",
            {"max_tokens": None, "messages": None, "prompt": "hi"},
            {"max_tokens": DEFAULT_MAX_TOKENS},
        ),
    ],
)
async def test_the_default_max_tokens_reserved_is_forwarded(
    rig: Rig, path: str, body: dict[str, object], forwarded: dict[str, int]
) -> None:
    """The default was reserved but not sent: the engine could generate to its context length."""
    response = await rig.send(path=path, **body)
    assert response.status_code == 200, response.text
    [sent] = rig.engine.bodies
    for name in ("max_tokens", "max_completion_tokens"):
        assert sent.get(name) == forwarded.get(name)


# -- item 4: a client leaving before the usage frame -------------------------------------------


async def stream_until(rig: Rig, leave: Callable[[str], bool]) -> None:
    """Stream a chat and leave (close the connection) at the first line for which ``leave``."""
    async with (
        httpx.AsyncClient() as http,
        http.stream(
            "POST",
            f"{rig.gw.url}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True},
        ) as response,
    ):
        async for line in response.aiter_lines():
            if leave(line):
                return


async def test_usage_is_read_after_the_client_leaves_past_finish_reason(rig: Rig) -> None:
    """The record fell back to the gateway's count when the client left before the usage frame
    (here the engine says 40 completion tokens; the relayed text counts 1)."""
    words = chat_frames(["ok"])
    rig.engine.then([sse(), *words, 0.3, usage_frame(7, 40), frame("[DONE]"), END])
    # the client has all it wanted and leaves
    await stream_until(rig, lambda line: "finish_reason" in line and '"stop"' in line)
    [record] = await rig.books.check(admitted=1)
    assert record.outcome == "client_disconnected"
    assert record.engine is not None
    assert (record.engine.prompt_tokens, record.engine.completion_tokens) == (7, 40)


async def test_a_client_leaving_on_done_before_the_engine_ends_is_ok(rig: Rig) -> None:
    """The OpenAI SDK closes its connection on ``data: [DONE]``. When the engine's end of the
    response came later (llama-server on a loaded machine, in the end-to-end test), the gateway was
    still waiting for it, saw the client leave and recorded the complete stream as
    client_disconnected (499)."""
    rig.engine.then([sse(), *chat_frames(["ok"]), usage_frame(7, 2), frame("[DONE]"), 1.0, END])
    await stream_until(rig, lambda line: line.strip() == "data: [DONE]")  # as the SDK does
    [record] = await rig.books.check(admitted=1)
    assert (record.status, record.outcome) == (200, "ok")
    assert record.engine is not None
    assert (record.engine.prompt_tokens, record.engine.completion_tokens) == (7, 2)


async def test_the_gateway_counts_tool_calls_and_reasoning(rig: Rig) -> None:
    """Without a usage frame the count ignored tool-call arguments and reasoning text."""
    arguments = '{"city": "Reykjavik", "units": "metric", "days": 10}'
    call = {"index": 0, "function": {"name": "forecast", "arguments": arguments}}
    thought = "the user wants a ten day forecast for Reykjavik in metric units"
    frames = [
        frame({"choices": [{"index": 0, "delta": {"reasoning_content": thought}}]}),
        frame({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}),
        frame({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
    ]
    rig.engine.then([sse(), *frames, frame("[DONE]"), END])
    response = await rig.send(stream=True)
    assert arguments.replace('"', '\\"') in response.text
    [record] = await rig.books.check(admitted=1)
    assert record.engine is None
    expected = estimate_tokens(thought + "forecast" + arguments)
    assert record.gateway.completion_tokens == expected


def test_the_estimate_is_conservative_for_non_latin_text() -> None:
    """ceil(chars/4) counted 150 for 600 CJK characters, which tokenizers count at 600 or more
    (the issue saw 50 counted for 600)."""
    assert estimate_tokens("漢" * 600) >= 600
    assert estimate_tokens("Привет, мир") >= 10
    assert estimate_tokens("hello world!") >= 12  # an upper bound: one token per byte
