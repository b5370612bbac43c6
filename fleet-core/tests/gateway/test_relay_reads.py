"""The relay meters a read of whole frames as one block: for any stream cut into
reads at any byte, it sends and meters exactly what a plain frame-by-frame relay does."""

from __future__ import annotations

import itertools
import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet_core.gateway.edge.wire import Usage
from fleet_core.gateway.exchange.relay import StreamMeter

from .relay_reference import Reference

_words = st.text(st.sampled_from('ab "\\\n\t\r{}:,é€😀'), max_size=6) | st.sampled_from(
    ["usage", '"usage":null', '"usage":{}', "}\n\ndata: {", "data: [DONE]", "\u2028"]
)
_usage = st.fixed_dictionaries(
    {"prompt_tokens": st.integers(0, 99), "completion_tokens": st.integers(0, 99)}
)


@st.composite
def _chunk(draw: st.DrawFn, n: int, asked: bool) -> dict[str, object]:
    choices = []
    for i in draw(st.sets(st.integers(0, n - 1), min_size=1)):
        part = draw(st.sampled_from(["delta", "text", "message"]))
        words = draw(_words)
        choices.append(
            {
                "index": i,
                part: {"content": words} if part != "text" else words,
                "finish_reason": draw(st.sampled_from([None, "stop", "length", ""])),
            }
        )
    chunk: dict[str, object] = {"id": "x", "object": "chat.completion.chunk", "choices": choices}
    if asked:  # an engine asked for usage says so in every chunk: null, or the running usage
        usage = draw(st.none() | _usage)
        where = draw(st.sampled_from(["last", "last", "first", "middle"]))
        if where == "first":
            return {"usage": usage, **chunk}
        chunk["usage"] = usage
        if where == "middle":
            chunk["created"] = 1
    return chunk


_ATTACKS = [  # frames that, read together, could put one frame's JSON in another's place
    b'data: {"choices":[],"usage":null} {"choices":[]}',
    b'data: {"choices":[],"usage":\n{"prompt_tokens":7}}',
    b'data: {"choices":[],"usage":{"prompt_tokens":7},"b":',
    b"data: 1} {}",
    b'data: {"usage":null,"choices":[],"a":"',
    b'data: "}',
    b"data: {}{}",
    b'data: {"choices":[]}\n{"choices":[]}',
]
_garbage = st.sampled_from(
    [
        *_ATTACKS,
        b": keep-alive",
        b"data:",
        b"data: ",
        b"data: [DONE]",
        b"event: x\ndata: {}",
        b"data: {\x0b}",
        b'data: {"usage":null}\n\n\n',
    ]
) | st.binary(max_size=12).map(lambda b: b"data: {" + b.replace(b"\n", b"") + b"}")


def _encode(chunk: dict[str, object], spaced: bool, prefix: bytes) -> bytes:
    body = json.dumps(chunk).encode() if spaced else msgspec.json.encode(chunk)
    return prefix + body


@st.composite
def _stream(draw: st.DrawFn) -> tuple[bytes, bool]:
    n, asked = draw(st.integers(1, 4)), draw(st.booleans())
    spaced, prefix = draw(st.booleans()), draw(st.sampled_from([b"data: ", b"data:"]))
    chunks = draw(st.lists(_chunk(n, asked), max_size=6))
    frames = [_encode(chunk, spaced, prefix) for chunk in chunks]
    for _ in range(draw(st.integers(0, 4))):
        frames.insert(draw(st.integers(0, len(frames))), draw(_garbage))
    if asked and draw(st.booleans()):
        frames.append(_encode({"id": "x", "choices": [], "usage": draw(_usage)}, spaced, prefix))
    if draw(st.booleans()):
        frames.append(b"data: [DONE]")
    body = b"".join(frame + b"\n\n" for frame in frames) + draw(st.sampled_from([b"", b"data: {"]))
    if draw(st.booleans()):
        body = body.replace(b"\n", b"\r\n")
    return body, draw(st.booleans())


@settings(max_examples=600)
@given(_stream(), st.data())
def test_reads_are_sent_and_metered_as_frame_by_frame(
    stream: tuple[bytes, bool], data: st.DataObject
) -> None:
    body, strip = stream
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(body) - 1)), max_size=4)))
    reads = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    meter, reference = StreamMeter(strip_usage=strip), Reference(strip_usage=strip)
    for read in filter(None, reads):
        assert meter.feed(read) == reference.feed(read)
    assert meter.partial == reference.partial
    assert "".join(meter.text) == "".join(reference.text)
    assert meter.usage == reference.usage
    assert (meter.done, meter.ended_choices) == (reference.done, reference.ended_choices)


@pytest.mark.parametrize("strip", [True, False])
@pytest.mark.parametrize("first", [b"", b": keep-alive\n\n"])  # the block path, or frame by frame
@pytest.mark.parametrize("attack", list(itertools.permutations(_ATTACKS, 2)))
def test_frames_cannot_trade_places_when_decoded_together(
    attack: tuple[bytes, bytes], first: bytes, strip: bool
) -> None:
    normal = b'data: {"choices":[{"delta":{"content":"a"}}],"usage":null}\n\n'
    body = first + normal + b"".join(frame + b"\n\n" for frame in attack) + normal
    meter, reference = StreamMeter(strip_usage=strip), Reference(strip_usage=strip)
    assert meter.feed(body) == reference.feed(body)
    assert ("".join(meter.text), meter.usage) == ("".join(reference.text), reference.usage)


def _engine_stream(words: list[str]) -> bytes:
    frames = [
        {"id": "x", "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]}
        for w in words
    ]
    frames[-1]["choices"][0]["finish_reason"] = "stop"  # type: ignore[index]
    usage = {"id": "x", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    chunks = [msgspec.json.encode({**f, "usage": None}) for f in [*frames, usage]][:-1]
    chunks.append(msgspec.json.encode(usage))
    return b"".join(b"data: " + c + b"\n\n" for c in [*chunks, b"[DONE]"])


def test_an_engine_stream_read_whole_is_metered_as_one_block() -> None:
    meter = StreamMeter(strip_usage=True)
    sent = meter.feed(_engine_stream(["Hel", 'lo "usage"']))
    assert meter.text == ['Hello "usage"']  # one piece: the block path, not frame by frame
    assert (meter.usage, meter.done, meter.generated_all) == (Usage(3, 2), True, True)
    assert b'"usage"' not in sent.replace(b'lo \\"usage\\"', b"")
    assert sent.endswith(b'"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')


@pytest.mark.parametrize("strip", [True, False])
def test_an_engine_stream_read_in_blocks_of_whole_frames_is_sent_as_frame_by_frame(
    strip: bool,
) -> None:
    """Reads that end where a frame does, as an engine's writes arrive: a block's last frame
    still carries its ``"usage":null`` (no frame follows it to cut it away)."""
    stream = _engine_stream(["a", "b", "c", "d"])
    ends = [i + 2 for i in range(len(stream)) if stream.startswith(b"\n\n", i)]
    for first, second in itertools.combinations(ends[:-1], 2):
        meter, reference = StreamMeter(strip_usage=strip), Reference(strip_usage=strip)
        for read in (stream[:first], stream[first:second], stream[second:]):
            assert meter.feed(read) == reference.feed(read)
        assert ("".join(meter.text), meter.usage) == ("".join(reference.text), reference.usage)
        assert len(meter.text) == 3  # each read metered as one block
