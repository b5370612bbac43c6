"""The bytes of one generation response, built before any of it is sent.

A stream is a `Stream`: frames sent at once (the chat role frame), one frame per token (paced by
the token delay), and closing frames (finish, usage, ``[DONE]``). Token frames differ only in the
token, so each request encodes its chunk once around a sentinel and splices the pre-encoded token
JSON into it: one encode per request instead of one per token.

Framing follows vLLM: the chat stream opens with ``{"role": "assistant", "content": ""}``; a reply
cut by ``max_tokens`` carries ``finish_reason: "length"`` on its last content frame, while a reply
that ends by itself gets a closing frame with empty content and ``finish_reason: "stop"`` (the
end-of-sequence token, which decodes to nothing). With ``include_usage`` every chunk carries
``"usage": null`` and a last chunk with ``"choices": []`` carries the usage; without it no chunk
mentions usage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from fleet_core.devtools.stub_engine.wire import (
    ENCODER,
    ChatChoice,
    ChatChunk,
    ChatChunkChoice,
    ChatCompletion,
    Completion,
    CompletionChoice,
    CompletionChunk,
    Delta,
    Finish,
    Message,
    Usage,
)

__all__ = [
    "DONE",
    "Head",
    "Stream",
    "Whole",
    "chat",
    "chat_stream",
    "completion",
    "completion_stream",
]

DONE = b"data: [DONE]\n\n"
_SENTINEL = "\x00fleet-stub-token\x00"
_SENTINEL_JSON = ENCODER.encode(_SENTINEL)


@dataclass(frozen=True, slots=True)
class Head:
    """What every response of one request shares."""

    id: str
    created: int
    model: str


@dataclass(frozen=True, slots=True)
class Stream:
    """SSE frames: ``opening`` at once, ``tokens`` one per generated token, then ``closing``."""

    opening: Sequence[bytes]
    tokens: Sequence[bytes]
    closing: Sequence[bytes]


@dataclass(frozen=True, slots=True)
class Whole:
    """A whole JSON body, sent once ``tokens`` tokens' worth of delay has passed."""

    body: bytes
    tokens: int


def _frame(chunk: msgspec.Struct) -> bytes:
    return b"data: " + ENCODER.encode(chunk) + b"\n\n"


def _spliced(template: msgspec.Struct, tokens_json: Sequence[bytes]) -> list[bytes]:
    before, found, after = ENCODER.encode(template).partition(_SENTINEL_JSON)
    assert found, "the template lost its sentinel"
    before, after = b"data: " + before, after + b"\n\n"
    return [before + token + after for token in tokens_json]


def _usage_field(usage: Usage | None) -> msgspec.UnsetType | None:
    return None if usage is not None else msgspec.UNSET


def chat(head: Head, text: str, *, finish: Finish, usage: Usage) -> Whole:
    choice = ChatChoice(message=Message(content=text), finish_reason=finish)
    body = ChatCompletion(
        id=head.id, created=head.created, model=head.model, choices=[choice], usage=usage
    )
    return Whole(ENCODER.encode(body), usage.completion_tokens)


def completion(head: Head, text: str, *, finish: Finish, usage: Usage) -> Whole:
    choice = CompletionChoice(text=text, finish_reason=finish)
    body = Completion(
        id=head.id, created=head.created, model=head.model, choices=[choice], usage=usage
    )
    return Whole(ENCODER.encode(body), usage.completion_tokens)


def chat_stream(
    head: Head,
    tokens: Sequence[str],
    *,
    tokens_json: Sequence[bytes],
    finish: Finish,
    usage: Usage | None,
) -> Stream:
    """``tokens``/``tokens_json`` are the reply already cut to the answer; ``usage`` only when the
    client asked for it with ``stream_options.include_usage``."""
    null = _usage_field(usage)

    def chunk(choice: ChatChunkChoice) -> ChatChunk:
        return ChatChunk(
            id=head.id, created=head.created, model=head.model, choices=[choice], usage=null
        )

    def finishing(text: str) -> ChatChunk:
        delta = Delta(content=text)
        return chunk(ChatChunkChoice(delta=delta, finish_reason=finish, stop_reason=None))

    opening = [_frame(chunk(ChatChunkChoice(delta=Delta(role="assistant", content=""))))]
    template = chunk(ChatChunkChoice(delta=Delta(content=_SENTINEL)))
    return _stream(
        opening,
        template,
        finishing=finishing,
        tokens=tokens,
        tokens_json=tokens_json,
        finish=finish,
        usage_chunk=_usage_chunk(ChatChunk, head, usage),
    )


def completion_stream(
    head: Head,
    tokens: Sequence[str],
    *,
    tokens_json: Sequence[bytes],
    finish: Finish,
    usage: Usage | None,
) -> Stream:
    """As `chat_stream`, for ``/v1/completions`` (no role frame)."""
    null = _usage_field(usage)

    def chunk(text: str, finish_reason: Finish | None) -> CompletionChunk:
        choice = CompletionChoice(text=text, finish_reason=finish_reason)
        return CompletionChunk(
            id=head.id, created=head.created, model=head.model, choices=[choice], usage=null
        )

    template = chunk(_SENTINEL, None)
    return _stream(
        [],
        template,
        finishing=lambda text: chunk(text, finish),
        tokens=tokens,
        tokens_json=tokens_json,
        finish=finish,
        usage_chunk=_usage_chunk(CompletionChunk, head, usage),
    )


def _usage_chunk(
    kind: type[ChatChunk] | type[CompletionChunk], head: Head, usage: Usage | None
) -> msgspec.Struct | None:
    """The last chunk, ``"choices": []`` with the usage, when the client asked for usage."""
    if usage is None:
        return None
    return kind(id=head.id, created=head.created, model=head.model, choices=[], usage=usage)


def _stream(
    opening: list[bytes],
    template: msgspec.Struct,
    *,
    finishing: Callable[[str], msgspec.Struct],
    tokens: Sequence[str],
    tokens_json: Sequence[bytes],
    finish: Finish,
    usage_chunk: msgspec.Struct | None,
) -> Stream:
    frames = _spliced(template, tokens_json)
    closing: list[bytes] = []
    if finish == "length":
        frames[-1] = _frame(finishing(tokens[-1]))
    else:
        closing.append(_frame(finishing("")))
    if usage_chunk is not None:
        closing.append(_frame(usage_chunk))
    closing.append(DONE)
    return Stream(opening, frames, closing)
