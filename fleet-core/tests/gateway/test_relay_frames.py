"""The relay's per-frame shortcuts read every frame as the general path does."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from fleet_core.gateway.edge.wire import StreamChunk
from fleet_core.gateway.exchange.relay import StreamMeter, _data

from .relay_reference import Reference

_lines = st.lists(
    st.sampled_from([b"data:", b"data: ", b"event: x", b": keep-alive", b"id: 7", b""]).flatmap(
        lambda head: st.binary(max_size=12).map(lambda tail: head + tail.replace(b"\n", b""))
    ),
    min_size=1,
    max_size=4,
)


def _reference(frame: bytes) -> bytes | None:
    for line in frame.split(b"\n"):
        if line.startswith(b"data:"):
            return line[5:].strip()
    return None


@given(_lines)
def test_the_data_of_a_frame_is_its_first_data_line(lines: list[bytes]) -> None:
    frame = b"\n".join(lines) + b"\n\n"
    assert _data(frame) == _reference(frame)


_text = st.none() | st.text(max_size=5)
_call = st.fixed_dictionaries(
    {"function": st.fixed_dictionaries({"name": _text, "arguments": _text})}
)


@given(
    content=_text,
    reasoning=_text,
    reasoning_content=_text,
    tool_calls=st.none() | st.lists(_call, max_size=2),
)
def test_a_delta_counts_everything_generated(
    content: str | None,
    reasoning: str | None,
    reasoning_content: str | None,
    tool_calls: list[dict[str, dict[str, str | None]]] | None,
) -> None:
    delta = {"content": content, "reasoning": reasoning, "reasoning_content": reasoning_content}
    frame = {"choices": [{"delta": {**delta, "tool_calls": tool_calls}}]}
    text = msgspec.json.decode(msgspec.json.encode(frame), type=StreamChunk).text()
    calls = [c["function"] for c in tool_calls or ()]
    names = [p for f in calls for p in (f["name"], f["arguments"]) if p]
    assert text == (reasoning_content or reasoning or "") + (content or "") + "".join(names)


_usage = st.fixed_dictionaries(
    {"prompt_tokens": st.integers(0, 9), "completion_tokens": st.integers(0, 9)}
)
_choice = st.fixed_dictionaries(
    {
        "delta": st.fixed_dictionaries({"content": _text}),
        "finish_reason": st.none() | st.just("stop"),
    }
)
_chunk = st.fixed_dictionaries(
    {"choices": st.lists(_choice, max_size=2)}, optional={"usage": st.none() | _usage}
).map(lambda c: b"data: " + msgspec.json.encode(c))
_frame = st.one_of(
    _chunk,
    st.just(b"data: [DONE]"),
    st.just(b": keep-alive"),
    st.just(b"data:"),
    st.just(b'data: {"choices": [] } {"choices": []}'),  # two values on one line: not a chunk
    st.just(b'data: {"a": 1}, {"b": 2'),
    st.just(b'data: "c": 3}'),
    # frames as the relay cuts them: "\r\n" already made "\n" (`StreamMeter.feed`)
    st.binary(max_size=10).map(lambda b: b"data: " + b.replace(b"\n", b"").replace(b"\r", b"")),
)


@given(st.lists(_frame, max_size=8), st.booleans())
def test_frames_read_together_read_as_one_by_one(frames: list[bytes], strip: bool) -> None:
    whole = [frame + b"\n\n" for frame in frames]
    together, alone = StreamMeter(strip_usage=strip), Reference(strip_usage=strip)
    assert b"".join(together.take(whole)) == alone.feed(b"".join(whole))
    assert ("".join(together.text), together.usage) == ("".join(alone.text), alone.usage)
    assert (together.done, together.ended_choices) == (alone.done, alone.ended_choices)


_part = st.none() | st.fixed_dictionaries({"content": _text})
_any_choice = st.fixed_dictionaries(
    {"delta": _part, "message": _part, "text": _text, "finish_reason": st.none() | st.just("stop")}
)


@given(st.lists(_any_choice, max_size=3))
def test_the_text_of_a_chunk_is_every_choice_in_order(choices: list[dict[str, object]]) -> None:
    chunk = msgspec.json.decode(msgspec.json.encode({"choices": choices}), type=StreamChunk)
    expected = ""
    for choice in choices:
        for part in (choice["delta"], choice["message"]):
            if isinstance(part, dict):
                expected += part["content"] or ""
        expected += choice["text"] or ""  # type: ignore[operator]
    assert chunk.text() == expected
