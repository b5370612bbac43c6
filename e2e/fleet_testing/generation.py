"""What real generated text from Gemma 3 270M looks like through the gateway, asked and checked one
way by the tests against llama-server (e2e/tests/test_llama_server.py) and against the whole
system (e2e/tests/test_fleetmodel_e2e.py): words rather than template markers, and the engine's
usage on replies and at the end of streams."""

from __future__ import annotations

import re

import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessageParam

__all__ = ["PROMPT", "assert_generated_reply", "assert_generated_stream", "chat", "stream", "words"]

PROMPT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Count from one to twenty in words, separated by commas."}
]


def words(text: str) -> int:
    """How many words of three letters or more: Gemma's counting, not its template markers."""
    return len(re.findall(r"\b[a-z]{3,}\b", text.lower()))


def chat(client: openai.OpenAI, model: str, *, max_tokens: int) -> ChatCompletion:
    return client.chat.completions.create(
        model=model, messages=PROMPT, max_tokens=max_tokens, temperature=0
    )


def stream(client: openai.OpenAI, model: str, *, max_tokens: int) -> list[ChatCompletionChunk]:
    """Every chunk of a streamed answer that asked for the usage frame."""
    chunks = client.chat.completions.create(
        model=model,
        messages=PROMPT,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    return list(chunks)


def assert_generated_reply(reply: ChatCompletion, *, max_tokens: int) -> str:
    """Words, not template markers, with the engine's usage; the reply's text."""
    text = reply.choices[0].message.content or ""
    assert words(text) >= 3, reply
    assert "<start_of_turn>" not in text
    assert reply.usage is not None
    assert reply.usage.prompt_tokens > 5
    assert 1 <= reply.usage.completion_tokens <= max_tokens
    return text


def assert_generated_stream(chunks: list[ChatCompletionChunk], *, max_tokens: int) -> None:
    """Many frames of words, and the engine's usage in the last one, counting them."""
    pieces = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert len(pieces) >= 5, chunks
    assert words("".join(pieces)) >= 3
    usage = chunks[-1].usage
    assert usage is not None, chunks[-1]
    assert usage.prompt_tokens > 5
    assert len(pieces) - 2 <= usage.completion_tokens <= max_tokens
