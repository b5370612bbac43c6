"""What the stub answers, decided from a decoded request: the bytes to send, or an error.

Validation copies vLLM where a client can tell the difference: an unknown (or missing) model is
a 404 ``NotFoundError``; ``stream_options`` without ``stream`` is a 400. Everything here is
synchronous and free of I/O; `exchange` plays the result out with the engine's pacing.
"""

from __future__ import annotations

import secrets
import time
from typing import NamedTuple

from fleet_core.devtools.stub_engine import frames, replies
from fleet_core.devtools.stub_engine.engine import Engine
from fleet_core.devtools.stub_engine.errors import BadRequest, NotFound
from fleet_core.devtools.stub_engine.frames import Head, Stream, Whole
from fleet_core.devtools.stub_engine.wire import (
    ENCODER,
    ChatRequest,
    CompletionRequest,
    Embedding,
    EmbeddingList,
    EmbeddingRequest,
    EmbeddingUsage,
    Prompt,
    StreamOptions,
)

__all__ = ["Job", "Mode", "Service"]


class Job(NamedTuple):
    work: Stream | Whole
    prompt_tokens: int
    prompt_head: str = ""


class Mode(NamedTuple):
    stream: bool
    include_usage: bool


class Service:
    """The stub's request logic, over one `Engine`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.settings = engine.settings

    def chat(self, request: ChatRequest) -> Job:
        mode = self._check(request.model, request.stream, request.stream_options)
        prompt = replies.chat_prompt(request.messages)
        limit = request.max_completion_tokens or request.max_tokens
        return self._generate("chatcmpl-", prompt, limit=limit, mode=mode, chat=True)

    def completion(self, request: CompletionRequest) -> Job:
        mode = self._check(request.model, request.stream, request.stream_options)
        prompt = replies.text_prompt([_single_prompt(request.prompt)])
        return self._generate("cmpl-", prompt, limit=request.max_tokens, mode=mode, chat=False)

    def embeddings(self, request: EmbeddingRequest) -> Job:
        self._check_model(request.model)
        inputs = _inputs(request.input)
        prompt = replies.text_prompt(inputs)
        data = [
            Embedding(index=index, embedding=self._vector(item, request.encoding_format))
            for index, item in enumerate(inputs)
        ]
        body = EmbeddingList(
            id=f"embd-{secrets.token_hex(16)}",
            created=int(time.time()),
            model=self.settings.model,
            data=data,
            usage=EmbeddingUsage(prompt_tokens=prompt.tokens, total_tokens=prompt.tokens),
        )
        return Job(Whole(ENCODER.encode(body), 0), prompt.tokens)

    def _vector(self, item: str | list[int], encoding: str) -> list[float] | str:
        vector = replies.embedding(item, self.settings.embedding_dim)
        return replies.embedding_base64(vector) if encoding == "base64" else vector

    def _check_model(self, model: str | None) -> None:
        if model != self.settings.model:
            raise NotFound(f"The model `{model}` does not exist.", param="model")

    def _check(self, model: str | None, stream: bool | None, options: StreamOptions | None) -> Mode:
        self._check_model(model)
        if options is not None and not stream:
            raise BadRequest(
                "Stream options can only be defined when `stream=True`.", param="stream_options"
            )
        return Mode(bool(stream), bool(options is not None and options.include_usage))

    def _generate(
        self, prefix: str, prompt: replies.Prompt, *, limit: int | None, mode: Mode, chat: bool
    ) -> Job:
        engine = self.engine
        n, finish = replies.answer(len(engine.reply), limit)
        head = Head(f"{prefix}{secrets.token_hex(16)}", int(time.time()), self.settings.model)
        usage = replies.usage(prompt, n)
        if mode.stream:
            build = frames.chat_stream if chat else frames.completion_stream
            wanted = usage if mode.include_usage else None
            tokens, tokens_json = engine.reply[:n], engine.reply_json[:n]
            work = build(head, tokens, tokens_json=tokens_json, finish=finish, usage=wanted)
            return Job(work, prompt.tokens, prompt.head)
        if self.settings.fail_after_tokens is not None:
            raise engine.fail()
        whole = frames.chat if chat else frames.completion
        text = "".join(engine.reply[:n])
        return Job(whole(head, text, finish=finish, usage=usage), prompt.tokens, prompt.head)


def _single_prompt(prompt: Prompt) -> str | list[int]:
    """One prompt, as text or token ids; the stub answers no batches."""
    if isinstance(prompt, str):
        return prompt
    if prompt and all(isinstance(item, int) for item in prompt):
        return [item for item in prompt if isinstance(item, int)]
    if len(prompt) == 1 and not isinstance(prompt[0], int):
        return prompt[0]
    raise BadRequest(
        "the stub engine takes one prompt per request (a string or a list of token ids)",
        param="prompt",
    )


def _inputs(value: Prompt) -> list[str | list[int]]:
    """Embedding inputs: one text, one list of token ids, or a list of either."""
    if isinstance(value, str):
        return [value]
    if value and all(isinstance(item, int) for item in value):
        return [[item for item in value if isinstance(item, int)]]
    inputs = [item for item in value if not isinstance(item, int)]
    if not inputs or len(inputs) != len(value):
        raise BadRequest("input must be a string, a list of strings or of token ids", param="input")
    return inputs
