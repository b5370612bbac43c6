"""The relay's per-frame shortcuts (issue 21) read every frame as the general path does."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from fleet_core.gateway.relay import _data
from fleet_core.gateway.wire import StreamChunk

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
