"""The stub's pretend model: how many tokens a prompt has and what the reply is. Pure functions.

A token is a whitespace-separated word, so tests can predict usage by counting words. Reply tokens
carry their leading space (" reply"), as BPE tokens do, so joining the streamed deltas gives the
reply text back. Embeddings are a hash of the text: deterministic, distinct per text, and exactly
representable in float32 so the float and base64 encodings carry the same numbers.
"""

from __future__ import annotations

import base64
import hashlib
import re
import struct
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from fleet_core.devtools.stub_engine.wire import ChatMessage, Finish, PromptTokensDetails, Usage

__all__ = [
    "Answer",
    "Prompt",
    "answer",
    "chat_prompt",
    "embedding",
    "embedding_base64",
    "reply_tokens",
    "text_prompt",
    "usage",
]

_CACHED = re.compile(r"\bcached\b", re.IGNORECASE)
HEAD_CHARS = 65536
"""The most of a prompt a modelled prefix cache can key on."""


class Prompt(NamedTuple):
    tokens: int
    cached: bool
    """The prompt mentions the word "cached": pretend half of it hit the prefix cache."""
    head: str = ""
    """The prompt's text, its first `HEAD_CHARS` characters: what a modelled prefix cache keys."""


class Answer(NamedTuple):
    tokens: int
    """How many reply tokens are generated."""
    finish: Finish


def reply_tokens(reply: str) -> tuple[str, ...]:
    """One token per word, the separating space attached to the word after it."""
    first, *rest = reply.split()
    return (first, *(" " + word for word in rest))


def text_prompt(texts: Iterable[str | int | list[int]]) -> Prompt:
    """Token count of a completion prompt or embedding input: words of text, length of id lists."""
    tokens, cached, parts = 0, False, []
    for item in texts:
        if isinstance(item, str):
            tokens += len(item.split())
            cached = cached or _CACHED.search(item) is not None
            parts.append(item)
        else:
            tokens += len(item) if isinstance(item, list) else 1
    return Prompt(tokens, cached, "\n".join(parts)[:HEAD_CHARS])


def chat_prompt(messages: Sequence[ChatMessage]) -> Prompt:
    """Words of every message's text: plain string content and the text of ``text`` parts."""
    return text_prompt(_texts(messages))


def _texts(messages: Sequence[ChatMessage]) -> Iterable[str]:
    for message in messages:
        if isinstance(message.content, str):
            yield message.content
        elif message.content is not None:
            yield from (part.text for part in message.content if part.text is not None)


def answer(reply_length: int, max_tokens: int | None) -> Answer:
    """Truncate the reply to ``max_tokens``; a cut reply finishes with "length"."""
    if max_tokens is not None and max_tokens < reply_length:
        return Answer(max_tokens, "length")
    return Answer(reply_length, "stop")


def usage(prompt: Prompt, completion_tokens: int) -> Usage:
    total = prompt.tokens + completion_tokens
    if not prompt.cached:
        return Usage(
            prompt_tokens=prompt.tokens, completion_tokens=completion_tokens, total_tokens=total
        )
    details = PromptTokensDetails(cached_tokens=prompt.tokens // 2)
    return Usage(
        prompt_tokens=prompt.tokens,
        completion_tokens=completion_tokens,
        total_tokens=total,
        prompt_tokens_details=details,
    )


def embedding(item: str | int | list[int], dim: int) -> list[float]:
    """``dim`` floats in [-1, 1) from a hash of the input; k/128 is exact in float32."""
    data = item.encode() if isinstance(item, str) else repr(item).encode()
    return [(byte - 128) / 128 for byte in hashlib.shake_128(data).digest(dim)]


def embedding_base64(vector: Sequence[float]) -> str:
    """OpenAI's base64 encoding: the float32 little-endian array."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
