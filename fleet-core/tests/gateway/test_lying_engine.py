"""The lying-engine suite: an engine that reports absurd usage, or breaks, cannot corrupt money.

Each case scripts a raw-socket engine (`FaultEngine`) to lie about its usage (negative, huge,
missing, contradictory figures), to end a stream before its first frame, or is sent a body with
an engine's own length and count fields; then the money invariants of `money.Books` hold (every
bucket back to capacity minus what was billed, the in-flight gauge at 0, one record each), what
was billed is within the request's bounds (``metering/bounds.py``), and the figures out of bounds
are flagged on the record and counted on ``/metrics``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import pytest

from fleet_core.gateway.admission.rate_policy import RatePolicy
from fleet_core.gateway.edge.prompting import prompt_of
from fleet_core.gateway.metering import bounds
from fleet_core.gateway.metering.counting import estimate_tokens
from fleet_core.gateway.metering.records import UsageRecord
from fleet_testing.fix_fault_engine import (
    END,
    FaultEngineFactory,
    Script,
    answer,
    chat_frames,
    frame,
    sse,
)

from .conftest import MSG, GatewayFactory, Rig, RigFactory
from .money import envelope, metric

MAX_TOKENS = 1000
"""What `Rig.send` asks for: the completion bound of every request here (one choice)."""
GATEWAY_PROMPT = estimate_tokens(prompt_of("chat", {"messages": MSG})[0])
"""The gateway's own count of `MSG`: the upper estimate of its roles, keys and text (30)."""
ANSWER_COUNT = estimate_tokens("fine thanks")
"""The gateway's own count of the answer every script here sends (12)."""
PROMPT_CAP = bounds.PROMPT_FACTOR * GATEWAY_PROMPT + bounds.PROMPT_SLACK


def chat(usage: dict[str, Any] | None) -> bytes:
    """A non-stream chat answer of "fine thanks" reporting ``usage`` (none when None)."""
    body: dict[str, Any] = {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "fine thanks"}}],
    }
    if usage is not None:
        body["usage"] = usage
    return answer(200, body)


def streamed(usage: dict[str, Any]) -> Script:
    return [sse(), *chat_frames(["fine", " thanks"]), frame({"choices": [], "usage": usage}),
            frame("[DONE]"), END]  # fmt: skip


def usage(prompt: int, completion: int, cached: int | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    if cached is not None:
        found["prompt_tokens_details"] = {"cached_tokens": cached}
    return found


@dataclass(frozen=True)
class Lie:
    usage: dict[str, Any] | None
    billed: tuple[int, int, int]
    """``(prompt, completion, cached)`` billed."""
    flagged: tuple[str, ...] = ()


LIES = {
    "negative prompt": Lie(usage(-500, 2), (0, 2, 0), ("prompt",)),
    "negative completion": Lie(usage(3, -7), (3, 0, 0), ("completion",)),
    "completion past the reservation": Lie(usage(3, 10**12), (3, MAX_TOKENS, 0), ("completion",)),
    "completion past int8": Lie(usage(3, 15 * 10**18), (3, MAX_TOKENS, 0), ("completion",)),
    "completion past uint64": Lie(usage(3, 10**30), (3, MAX_TOKENS, 0), ("completion",)),
    "prompt far past the gateway's count": Lie(usage(10**9, 2), (PROMPT_CAP, 2, 0), ("prompt",)),
    "more cached than prompt": Lie(usage(3, 2, cached=50), (3, 2, 3), ("cached",)),
    "negative cached": Lie(usage(3, 2, cached=-9), (3, 2, 0), ("cached",)),
    "every figure absurd": Lie(
        usage(-1, 10**15, cached=10**15), (0, MAX_TOKENS, 0), ("prompt", "completion", "cached")
    ),
    "no usage at all": Lie(
        None, (GATEWAY_PROMPT, ANSWER_COUNT, 0)
    ),  # the gateway's count of the text
    "an honest engine": Lie(usage(12, 2, cached=4), (12, 2, 4)),
}


@pytest.fixture
async def rig(start_rig: RigFactory) -> Rig:
    return await start_rig()


def only(found: list[UsageRecord]) -> UsageRecord:
    [record] = found
    return record


CASES = [
    pytest.param(name, stream, id=f"{name}-{'streamed' if stream else 'buffered'}")
    for name, lie in LIES.items()
    for stream in (False, True)
    if lie.usage is not None or not stream  # a stream without usage: test_stream_ending's
]


@pytest.mark.parametrize(("name", "stream"), CASES)
async def test_engine_usage_is_billed_within_its_bounds(rig: Rig, name: str, stream: bool) -> None:
    lie = LIES[name]
    rig.engine.then(streamed(lie.usage) if stream and lie.usage else [chat(lie.usage)])
    response = await rig.send(stream=stream)
    assert response.status_code == 200, response.text
    record = only(await rig.books.check(admitted=1))
    assert record.billed_tokens() == lie.billed
    assert record.out_of_bounds == lie.flagged
    counted = await metric(rig.gw.url, "fleet_engine_usage_out_of_bounds_total")
    assert counted == len(lie.flagged)


async def test_a_trillion_tokens_leaves_the_bucket_at_what_was_reserved(rig: Rig) -> None:
    """Regression: ``completion_tokens: 10**12`` billed the tenant for a trillion tokens and
    left its bucket a trillion below zero (the next Retry-After in years), against the
    gateway's own count of 1; now it is billed what was reserved, and the next request runs."""
    rig.engine.then([chat(usage(3, 10**12))])
    assert (await rig.send()).status_code == 200
    assert (await rig.send()).status_code == 200  # the default, honest answer
    first, second = await rig.books.check(admitted=2)
    assert {first.completion_tokens, second.completion_tokens} == {MAX_TOKENS, 2}


async def test_a_stream_of_headers_then_eof_bills_nothing(rig: Rig) -> None:
    """Regression: an engine that sent its headers and then closed billed the whole prompt,
    because the gateway's own error frame counted as the first byte. It generated nothing: it
    bills as a request that failed before its first byte."""
    rig.engine.then([sse()], [sse(), END])  # cut without a last chunk; then ended cleanly empty
    for _ in range(2):
        response = await rig.send(stream=True)
        assert response.status_code == 200  # the stream had started: the error is a frame
        assert '"error"' in response.text
    found = await rig.books.check(admitted=2)
    assert all(r.outcome == "upstream_error" and r.first_byte_at is None for r in found)
    assert all(r.billed_tokens() == (0, 0, 0) for r in found)


async def test_an_engines_own_length_fields_are_not_forwarded(rig: Rig) -> None:
    """Regression: ``{"max_tokens": 1, "n_predict": 100000}`` reached llama-server intact,
    reserved for one token; llama-server reads ``n_predict`` first."""
    for body in (
        {"max_tokens": 1, "n_predict": 100_000},
        {"max_tokens": 100_000, "max_completion_tokens": 1},
        {"max_tokens": None, "n_predict": 100_000, "min_tokens": 1, "ignore_eos": True},
    ):
        assert (await rig.send(**body)).status_code == 200
    sent = rig.engine.bodies
    default = RatePolicy().default_max_tokens  # what was reserved when the client said nothing
    assert [b["max_tokens"] for b in sent] == [1, 1, default]
    assert not any(name in b for b in sent for name in ("n_predict", "max_completion_tokens"))
    assert sent[2]["ignore_eos"] is True  # bounded by max_tokens all the same
    await rig.books.check(admitted=3)


@pytest.mark.parametrize(
    ("kind", "field", "value"),
    [("chat", "n_cmpl", 5), ("completions", "n_cmpl", 3), ("chat", "best_of", 4)],
)
async def test_an_engines_own_count_fields_are_refused(
    rig: Rig, kind: str, field: str, value: int
) -> None:
    """llama.cpp reads ``n_cmpl`` before ``n``: more choices than were reserved. Refused before
    admission, naming the field; the engine never sees it."""
    if kind == "chat":
        response = await rig.send(**{field: value})
    else:
        path = "/v1/completions"
        response = await rig.send(path=path, messages=None, prompt="hello", **{field: value})
    assert response.status_code == 400, response.text
    error = envelope(response)
    assert (error["param"], error["code"]) == (field, "unsupported_parameter")
    assert rig.engine.hits == 0
    assert (await rig.send(**{field: 1})).status_code == 200  # the same as n: no harm
    await rig.books.check(admitted=1)


async def test_failover_never_retries_an_endpoint_that_failed_this_request(
    start_gateway: GatewayFactory, fault_engine: FaultEngineFactory, redis_url: str
) -> None:
    """Regression: a fallback pool served by an endpoint the first pool had already tried got
    the request again (each pool kept its own list of tried endpoints)."""
    busy = await fault_engine([answer(503, b"overloaded")])
    spare = await fault_engine()
    gw = await start_gateway(
        {
            "upstreams": [
                {"id": "m", "model": "m", "base_url": busy.url, "fallbacks": ["m2", "m3"]},
                {"id": "m2", "model": "m2", "base_url": busy.url},
                {"id": "m3", "model": "m3", "base_url": spare.url},
            ],
        }
    )
    async with httpx.AsyncClient() as http:
        body = {"model": "m", "messages": MSG, "max_tokens": 5}
        response = await http.post(f"{gw.url}/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert (busy.hits, spare.hits) == (1, 1)
    assert msgspec.json.decode(response.content)["choices"]
