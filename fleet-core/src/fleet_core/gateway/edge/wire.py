"""The parts of OpenAI request and response bodies the gateway reads. Everything else passes.

The gateway forwards the client's JSON as it came (only ``model`` is rewritten, and
``stream_options`` when it must ask for usage), so these types cover just what routing, admission
and metering need, and they tolerate every field they do not name. A wrong type in a named field is
a 400 naming that parameter, decided here and not by the engine.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec

from fleet_core.gateway.edge import prompting
from fleet_core.shared.errors import InvalidRequest

__all__ = [
    "ChatRequest",
    "CompletionRequest",
    "EmbeddingRequest",
    "Kind",
    "ParsedRequest",
    "PlainChunk",
    "StreamChunk",
    "Usage",
    "parse_request",
    "prompt_text",
]

Kind = Literal["chat", "completions", "embeddings"]

MAX_TOKENS_LIMIT = 2**31 - 1
"""The largest ``max_tokens`` accepted (engines hold it in a 32-bit int); larger is a 400."""
MAX_CHOICES = 128
"""The largest ``n`` (OpenAI's own bound) and ``best_of`` accepted."""

MaxTokens = Annotated[int, msgspec.Meta(ge=1, le=MAX_TOKENS_LIMIT)]
Choices = Annotated[int, msgspec.Meta(ge=1, le=MAX_CHOICES)]


class _Part(msgspec.Struct):
    type: str = "text"
    text: str | None = None


class _Message(msgspec.Struct):
    role: str
    content: str | list[_Part] | None = None


class _StreamOptions(msgspec.Struct):
    include_usage: bool | None = None


# One of: a string, a list of strings, a list of token ids, a list of token-id lists.
PromptValue = str | list[str | int | list[int]]


class ChatRequest(msgspec.Struct):
    messages: list[_Message]
    model: str | None = None
    stream: bool | None = None
    stream_options: _StreamOptions | None = None
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    n: Choices | None = None


class CompletionRequest(msgspec.Struct):
    prompt: PromptValue
    model: str | None = None
    stream: bool | None = None
    stream_options: _StreamOptions | None = None
    max_tokens: MaxTokens | None = None
    n: Choices | None = None
    best_of: Choices | None = None


class EmbeddingRequest(msgspec.Struct):
    input: PromptValue
    model: str | None = None


AnyRequest = ChatRequest | CompletionRequest | EmbeddingRequest
_TYPES: dict[Kind, type[AnyRequest]] = {
    "chat": ChatRequest,
    "completions": CompletionRequest,
    "embeddings": EmbeddingRequest,
}
_REQUIRED = {"chat": "messages", "completions": "prompt", "embeddings": "input"}
_PATH = re.compile(r"`\$\.?([^`]*)`")
_MISSING = re.compile(r"missing required field `([^`]+)`")


class ParsedRequest(msgspec.Struct, frozen=True, gc=False):
    """A client's request: its body as sent, its typed view, and what the gateway reads from it,
    worked out once here (a request reads these some fourteen times; as properties each read
    cost about 1,200 instructions)."""

    kind: Kind
    body: dict[str, Any]
    typed: AnyRequest
    model: str | None
    stream: bool
    wants_usage: bool
    """The client asked for the usage frame itself (``stream_options.include_usage``)."""
    max_tokens: int | None
    sequences: int
    """How many sequences the engine may generate, each up to ``max_tokens``: every prompt of a
    list times the larger of ``n`` and ``best_of`` (the engine generates ``best_of`` and returns
    ``n``). The reservation's worst case multiplies by this."""
    choices: int
    """How many choices the answer carries (each ends with its own ``finish_reason``)."""
    prompt: prompting.Prompt = ("", 0)
    """Everything the engine may render into the prompt (`prompting.prompt_of`): the text the
    reservation and the fallback bill count, and the tokens given as ids."""

    @classmethod
    def of(
        cls, kind: Kind, body: dict[str, Any], typed: AnyRequest, prompt: prompting.Prompt = ("", 0)
    ) -> ParsedRequest:
        options = getattr(typed, "stream_options", None)
        if isinstance(typed, ChatRequest):
            max_tokens = typed.max_completion_tokens or typed.max_tokens
            sequences = choices = typed.n or 1
        elif isinstance(typed, CompletionRequest):
            max_tokens = typed.max_tokens
            prompts = _prompts(typed.prompt)
            sequences = prompts * max(typed.n or 1, typed.best_of or 1)
            choices = prompts * (typed.n or 1)
        else:
            max_tokens, sequences, choices = None, 1, 1
        return cls(
            kind,
            body,
            typed,
            typed.model,
            bool(getattr(typed, "stream", False)),
            bool(options and options.include_usage),
            max_tokens,
            sequences,
            choices,
            prompt,
        )


def parse_request(kind: Kind, raw: bytes) -> ParsedRequest:
    """Decode a request body; any client mistake becomes a 400 naming the parameter."""
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request: {exc}", code="invalid_json"
        ) from exc
    except RecursionError as exc:  # msgspec's own bound, about a thousand levels
        raise InvalidRequest(
            "The request body nests arrays and objects more than "
            f"{prompting.MAX_DEPTH} levels deep.",
            code="invalid_json",
        ) from exc
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    if _REQUIRED[kind] not in body:
        field = _REQUIRED[kind]
        raise InvalidRequest(
            f"Missing required parameter: '{field}'.",
            param=field,
            code="missing_required_parameter",
        )
    try:
        typed = msgspec.convert(body, _TYPES[kind])
    except msgspec.ValidationError as exc:
        raise InvalidRequest(
            f"Invalid request: {exc}", param=_param(str(exc)), code="invalid_type"
        ) from exc
    _check_values(typed)
    return ParsedRequest.of(kind, body, typed, prompting.prompt_of(kind, body))


def _param(message: str) -> str | None:
    missing = _MISSING.search(message)
    path = _PATH.search(message)
    base = path.group(1) if path else ""
    if missing:
        return f"{base}.{missing.group(1)}" if base else missing.group(1)
    return base or None


def _check_values(typed: AnyRequest) -> None:
    if isinstance(typed, ChatRequest) and not typed.messages:
        raise InvalidRequest("'messages' must contain at least one message.", param="messages")
    if isinstance(typed, CompletionRequest):
        if typed.best_of is not None and typed.best_of < (typed.n or 1):
            raise InvalidRequest("'best_of' must be at least 'n'.", param="best_of")
        if isinstance(typed.prompt, list) and not typed.prompt:
            raise InvalidRequest("'prompt' must not be an empty list.", param="prompt")


def _prompts(value: PromptValue) -> int:
    """How many prompts ``value`` holds: a string or one list of token ids is one prompt."""
    if isinstance(value, str) or all(isinstance(v, int) for v in value):
        return 1
    return len(value)


def prompt_text(request: ParsedRequest) -> tuple[str, int]:
    """The text the gateway counts as the prompt, plus tokens given directly as ids: every
    prompt-bearing field, not only the messages' text (`prompting`)."""
    return request.prompt


class PromptDetails(msgspec.Struct, gc=False):
    cached_tokens: int | None = None


class Usage(msgspec.Struct, gc=False):
    prompt_tokens: int = 0
    completion_tokens: int | None = None
    total_tokens: int | None = None
    prompt_tokens_details: PromptDetails | None = None

    @property
    def cached(self) -> int:
        details = self.prompt_tokens_details
        return (details.cached_tokens or 0) if details else 0


class _Function(msgspec.Struct, gc=False):
    name: str | None = None
    arguments: str | None = None


class _ToolCall(msgspec.Struct, gc=False):
    function: _Function | None = None


class _Delta(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[_ToolCall] | None = None
    function_call: _Function | None = None

    def generated(self) -> str:
        """Everything the engine generated here: reasoning, content, tool names and arguments."""
        if not (self.tool_calls or self.function_call or self.reasoning_content or self.reasoning):
            return self.content or ""  # a plain token: most frames of most streams
        calls = [c.function for c in self.tool_calls or () if c.function is not None]
        if self.function_call is not None:
            calls.append(self.function_call)
        names = [part for f in calls for part in (f.name, f.arguments) if part]
        thought = self.reasoning_content or self.reasoning or ""
        return "".join((thought, self.content or "", *names))


class _ChunkChoice(msgspec.Struct, gc=False):
    delta: _Delta | None = None
    text: str | None = None
    message: _Delta | None = None
    finish_reason: str | None = None


class _PlainDelta(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    role: str | None = None  # the fields in vLLM's order, which msgspec matches fastest
    content: str | None = None


class _PlainChoice(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    index: int
    delta: _PlainDelta
    logprobs: None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class PlainChunk(msgspec.Struct, gc=False):
    """A streamed frame whose every choice is a delta of plain content: the usual frame.

    Its choices name every field they may hold and refuse any other, so whatever else a choice
    carries (reasoning, tool calls, a message, text, log probabilities) fails the decode, and
    `StreamChunk` reads that frame instead. What it decodes, it reads as `StreamChunk` does:
    the choices' content, their ``finish_reason`` and the usage."""

    choices: list[_PlainChoice] = []
    usage: Usage | None = None


class StreamChunk(msgspec.Struct, gc=False):
    """A streamed frame, or a whole non-stream response: the choices' text and the usage.

    It and the structs in it are not tracked by the garbage collector (``gc=False``): decoded
    JSON holds no reference cycle, and a stream decodes a few of them per frame, each of which
    would count towards the next collection of the whole young generation."""

    choices: list[_ChunkChoice] = []
    usage: Usage | None = None

    def text(self) -> str:
        """Every generated character the frame carries, for the gateway's own count."""
        if len(self.choices) == 1:  # nearly every frame: one choice, its delta only
            choice = self.choices[0]
            if choice.delta is not None and choice.message is None and not choice.text:
                return choice.delta.generated()
        out = []
        for choice in self.choices:
            for part in (choice.delta, choice.message):
                if part is not None:
                    out.append(part.generated())
            if choice.text:
                out.append(choice.text)
        return "".join(out)

    def finished(self) -> int:
        """How many choices this frame ends (each carries a ``finish_reason``)."""
        return sum(1 for choice in self.choices if choice.finish_reason)
