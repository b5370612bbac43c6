"""The OpenAI request and response bodies the stub reads and writes, as vLLM spells them.

Requests name only the fields the stub acts on and tolerate every other one, as vLLM does.
Responses copy vLLM's field set: ``UNSET`` fields are left out of the JSON (vLLM's
``exclude_unset``), ``None`` fields are written as ``null``. The decoders and the encoder are
stateless codecs, built once here like compiled regular expressions.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

__all__ = [
    "ENCODER",
    "ChatChoice",
    "ChatChunk",
    "ChatChunkChoice",
    "ChatCompletion",
    "ChatMessage",
    "ChatRequest",
    "Completion",
    "CompletionChoice",
    "CompletionChunk",
    "CompletionRequest",
    "Delta",
    "Embedding",
    "EmbeddingList",
    "EmbeddingRequest",
    "EmbeddingUsage",
    "Finish",
    "Message",
    "ModelCard",
    "ModelList",
    "PromptTokensDetails",
    "StatsSnapshot",
    "StreamOptions",
    "TextPart",
    "Usage",
    "decode_chat",
    "decode_completion",
    "decode_embedding",
]

Finish = Literal["stop", "length"]
MaxTokens = Annotated[int, Meta(ge=1)]
# A prompt is text, or token ids, or a batch of either; msgspec allows one array type per union.
Prompt = str | list[str | int | list[int]]


# ---- requests ---------------------------------------------------------------------------------


class TextPart(msgspec.Struct):
    type: str = "text"
    text: str | None = None


class ChatMessage(msgspec.Struct):
    role: str
    content: str | list[TextPart] | None = None


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = False


class ChatRequest(msgspec.Struct):
    messages: list[ChatMessage]
    model: str | None = None
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None


class CompletionRequest(msgspec.Struct):
    prompt: Prompt
    model: str | None = None
    max_tokens: MaxTokens | None = 16  # vLLM's and OpenAI's default for legacy completions
    stream: bool | None = False
    stream_options: StreamOptions | None = None


class EmbeddingRequest(msgspec.Struct):
    input: Prompt
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"


decode_chat = msgspec.json.Decoder(ChatRequest).decode
decode_completion = msgspec.json.Decoder(CompletionRequest).decode
decode_embedding = msgspec.json.Decoder(EmbeddingRequest).decode


# ---- responses --------------------------------------------------------------------------------


class PromptTokensDetails(msgspec.Struct, frozen=True, kw_only=True):
    cached_tokens: int


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | UnsetType = UNSET


class Message(msgspec.Struct, frozen=True, kw_only=True):
    role: str = "assistant"
    content: str
    tool_calls: list[None] = msgspec.field(default_factory=list)


class ChatChoice(msgspec.Struct, frozen=True, kw_only=True):
    index: int = 0
    message: Message
    logprobs: None = None
    finish_reason: Finish
    stop_reason: None = None


class ChatCompletion(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(msgspec.Struct, frozen=True, kw_only=True):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: Finish | None
    stop_reason: None = None


class Completion(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class Delta(msgspec.Struct, frozen=True, kw_only=True):
    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET


class ChatChunkChoice(msgspec.Struct, frozen=True, kw_only=True):
    index: int = 0
    delta: Delta
    logprobs: None = None
    finish_reason: Finish | None = None
    stop_reason: UnsetType | None = UNSET  # vLLM sets it only on the finishing chunk


class ChatChunk(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | UnsetType | None = UNSET  # null on every chunk only when usage was asked for


class CompletionChunk(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | UnsetType | None = UNSET


class Embedding(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    object: str = "embedding"
    embedding: list[float] | str


class EmbeddingUsage(msgspec.Struct, frozen=True, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[Embedding]
    usage: EmbeddingUsage


class ModelCard(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    object: str = "model"
    created: int
    owned_by: str
    root: str | UnsetType = UNSET
    parent: UnsetType | None = UNSET
    max_model_len: int | UnsetType = UNSET


class ModelList(msgspec.Struct, frozen=True, kw_only=True):
    object: str = "list"
    data: list[ModelCard]


class StatsSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /stats``: what tests read to prove what the engine did."""

    requests_started: int
    requests_finished: int
    requests_cancelled: int
    requests_failed: int
    tokens_generated: int
    prompt_tokens: int
    running: int
    waiting: int
    kv_tokens: int = 0
    peak_running: int = 0
    prefix_hits: int = 0
    prefix_misses: int = 0


ENCODER = msgspec.json.Encoder()
