"""`PlainChunk`, the strict type the relay decodes the usual stream frame with: whatever it
accepts, it reads as `StreamChunk` does (text, ended choices, usage), and anything else a
choice carries makes it refuse the frame, which `StreamChunk` then reads."""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet_core.gateway.edge.wire import PlainChunk, StreamChunk
from fleet_core.gateway.exchange import relay

_text = st.none() | st.text(max_size=4)
_delta = st.fixed_dictionaries(
    {},
    optional={
        "role": st.none() | st.sampled_from(["assistant", 7]),
        "content": _text | st.integers(0, 3),
        "reasoning_content": _text,
        "reasoning": _text,
        "tool_calls": st.just([{"function": {"name": "f", "arguments": "{}"}}]),
        "function_call": st.just({"name": "g"}),
    },
)
_choice = st.fixed_dictionaries(
    {},
    optional={
        "index": st.integers(0, 3) | st.just("0"),
        "delta": st.none() | _delta,
        "message": _delta,
        "text": _text,
        "logprobs": st.none() | st.just({"content": []}),
        "finish_reason": st.none() | st.sampled_from(["", "stop", "length"]),
        "stop_reason": st.none() | st.integers(0, 9) | st.just("</s>"),
        "token_ids": st.just([1]),
    },
)
_chunk = st.fixed_dictionaries(
    {"choices": st.lists(_choice, max_size=3)},
    optional={
        "id": st.just("x"),
        "usage": st.none() | st.just({"prompt_tokens": 2, "completion_tokens": 1}),
    },
)


def _reading(chunk: StreamChunk | PlainChunk) -> tuple[str, int, list[int]]:
    return relay._read([chunk])  # what the relay reads from it


# The draws are small; one that takes a second is the shared machine stalling (seen with
# callgrind running beside the tests), not the strategy.
@settings(max_examples=800, suppress_health_check=[HealthCheck.too_slow])
@given(_chunk)
def test_a_plain_chunk_reads_as_a_stream_chunk_or_is_refused(chunk: dict[str, object]) -> None:
    raw = msgspec.json.encode(chunk)
    try:
        full = msgspec.json.decode(raw, type=StreamChunk)
    except msgspec.ValidationError:
        full = None
    try:
        plain = msgspec.json.decode(raw, type=PlainChunk)
    except msgspec.ValidationError:
        return  # refused: the relay reads it as a StreamChunk
    assert full is not None
    assert _reading(plain) == _reading(full)
    keys = {key for choice in chunk["choices"] for key in choice}  # type: ignore[attr-defined]
    assert not keys & {"message", "text", "token_ids"}


def test_the_usual_vllm_frames_are_plain() -> None:
    frames = [
        b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        b'[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
        b'"finish_reason":null}],"usage":null}',
        b'{"id":"c","choices":[{"index":0,"delta":{"content":" a"},"logprobs":null,'
        b'"finish_reason":"stop","stop_reason":null}]}',
        b'{"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}',
    ]
    texts = [_reading(msgspec.json.decode(f, type=PlainChunk))[0] for f in frames]
    assert texts == ["", " a", ""]
    assert [type(msgspec.json.decode(f, type=PlainChunk)) for f in frames] == [PlainChunk] * 3


def test_reasoning_and_tool_calls_are_not_plain() -> None:
    for delta in (b'{"reasoning_content":"hm"}', b'{"tool_calls":[]}', b'{"reasoning":"x"}'):
        frame = b'{"choices":[{"index":0,"delta":' + delta + b"}]}"
        try:
            msgspec.json.decode(frame, type=PlainChunk)
        except msgspec.ValidationError:
            continue
        raise AssertionError(f"{delta!r} decoded as plain")
