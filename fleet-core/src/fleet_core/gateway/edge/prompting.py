"""What a request puts into the model's prompt, found in one pass over its decoded body.

The reservation and the fallback bill count the prompt, so the prompt is everything the engine
may render into it, not only ``messages[].content``: tools and their JSON schemas, ``functions``,
``tool_choice``, assistant ``tool_calls`` and their arguments, ``response_format`` schemas,
``prediction``, content parts other than text (an image's URL or data), and any field an engine
may read that the gateway does not know (a chat template's keywords, guided-decoding schemas).
So the rule is the safe one: every string, number and object key in the body counts, except in
the fields known to carry only sampling or transport options (`NOT_PROMPT`). Object keys count
too because a chat template renders a schema's keys; for messages they stand in for the
template's few tokens of framing per message.

The same pass bounds nesting (`MAX_DEPTH`): msgspec itself refuses about a thousand levels with a
RecursionError, and re-encoding the body at a deeper stack would fail sooner, so a client gets a
400 for deep nesting here, before anything is counted, admitted or forwarded.
"""

from __future__ import annotations

from typing import Any

from fleet_core.shared.errors import InvalidRequest

__all__ = ["MAX_DEPTH", "NOT_PROMPT", "Prompt", "prompt_of"]

MAX_DEPTH = 64
"""The deepest nesting of arrays and objects accepted in a request body (the body itself is 1).
Tool and response schemas run to a dozen levels; OpenAI's structured outputs allow five."""

NOT_PROMPT = frozenset(
    {
        "model",
        "stream",
        "stream_options",
        "max_tokens",
        "max_completion_tokens",
        "n",
        "best_of",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "stop",
        "seed",
        "user",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "parallel_tool_calls",
        "metadata",
        "store",
        "service_tier",
        "modalities",
        "reasoning_effort",
        "encoding_format",
        "dimensions",
        "echo",
    }
)
"""Top-level fields that never reach the prompt: sampling, limits, transport, bookkeeping."""

Prompt = tuple[str, int]
"""The prompt's text, joined by newlines, and the tokens given directly as ids."""

_ID_FIELDS = {"completions": "prompt", "embeddings": "input"}


def prompt_of(kind: str, body: dict[str, Any]) -> Prompt:
    """The prompt-bearing text of ``body`` and its token ids; 400 if it nests past `MAX_DEPTH`.
    Every request passes here, so the walk compares types by identity and appends strings
    without a call (a third of the cost of ``isinstance`` and a call per value)."""
    parts: list[str] = []
    ids = 0
    id_field = _ID_FIELDS.get(kind)
    for name, value in body.items():
        if name == id_field:
            ids += _prompt_value(value, parts)
        elif name not in NOT_PROMPT:
            _texts(value, parts, 2)
        elif type(value) is dict or type(value) is list:
            _texts(value, [], 2)  # not counted, but bounded like the rest
    return "\n".join(parts), ids


def _texts(value: Any, out: list[str], depth: int) -> None:
    kind = type(value)
    if kind is str:
        out.append(value)
    elif kind is dict:
        if depth > MAX_DEPTH:
            raise _too_deep()
        for key, item in value.items():
            out.append(key)
            if type(item) is str:
                out.append(item)
            else:
                _texts(item, out, depth + 1)
    elif kind is list:
        if depth > MAX_DEPTH:
            raise _too_deep()
        for item in value:
            if type(item) is str:
                out.append(item)
            else:
                _texts(item, out, depth + 1)
    elif value is not None and kind is not bool:
        out.append(str(value))  # a number in a schema or an argument: the engine renders it


def _prompt_value(value: Any, out: list[str]) -> int:
    """A completion prompt or embedding input: strings, token ids, lists of either (typed
    already, so nothing nests deeper than two)."""
    if isinstance(value, str):
        out.append(value)
        return 0
    ids = 0
    for item in value:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, int):
            ids += 1
        else:
            ids += len(item)
    return ids


def _too_deep() -> InvalidRequest:
    return InvalidRequest(
        f"The request body nests arrays and objects more than {MAX_DEPTH} levels deep.",
        code="invalid_json",
    )
