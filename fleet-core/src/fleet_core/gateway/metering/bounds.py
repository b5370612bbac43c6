"""How far an engine's usage figures are believed: every figure is bounded before it is billed.

An engine's usage is its own claim (P6): a bug, a patched build or a hostile endpoint can report
``prompt_tokens: -500`` (crediting budgets back through the rollups), or ``completion_tokens:
10^12`` (billing a tenant half a trillion micro-units and emptying its token bucket for years), or
a figure past what the ledger's ``int8`` columns hold. So before anything bills it, each figure is
held to what the gateway itself knows the request could have used:

- every figure is at least 0;
- completion tokens at most the reservation's: ``max_tokens`` times every sequence the request
  may generate (`completion_cap`; what the forwarded body allows, see ``exchange/lengths.py``);
- prompt tokens at most ``PROMPT_FACTOR`` times the gateway's own count of the prompt, plus
  ``PROMPT_SLACK`` (a chat template's tokens, which the gateway's count leaves out), plus what the
  gateway does not count as prompt text: the JSON of tools, functions and response formats (one
  token per byte at most) and ``IMAGE_TOKENS`` per non-text content part (`prompt_cap`);
- cached tokens at most the (bounded) prompt tokens.

A figure out of bounds is billed at its bound, the record says which figures were bounded
(`bound`), the ledger's usage agreement counts such requests per model and hour, and
``fleet_engine_usage_out_of_bounds_total`` counts them by model and figure: an engine that lies
is visible, and what it lies about is never billed past what the request could have cost.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "IMAGE_TOKENS",
    "PROMPT_FACTOR",
    "PROMPT_SLACK",
    "Bounded",
    "bound",
    "completion_cap",
    "prompt_cap",
]

PROMPT_FACTOR = 2
"""How many times its own count the gateway believes: the estimate is good to about ±25% and a
tokenizer's count misses only the template, so twice is a liar's margin, not a counting error's."""
PROMPT_SLACK = 1024
"""Tokens added to the bound for what wraps the prompt: chat template, system tokens."""
IMAGE_TOKENS = 4096
"""Tokens allowed per non-text content part (an image): above what current vision models spend on
one image (LLaVA-NeXT 2,880 at most, Qwen2-VL's default up to about 1,300)."""
_UNCOUNTED = ("tools", "functions", "response_format", "tool_choice", "guided_json")

Bounded = tuple[int, int, int, tuple[str, ...]]
"""``(prompt, completion, cached, figures bounded)``: what is billed, and which figures the
engine reported out of bounds (``"prompt"``, ``"completion"``, ``"cached"``)."""


def completion_cap(max_tokens: int, sequences: int) -> int:
    """The most completion tokens a request was reserved (and allowed) to generate."""
    return max_tokens * sequences


def prompt_cap(counted: int, body: dict[str, Any], reported: int | None = None) -> int:
    """The most prompt tokens an engine may bill for a request whose prompt the gateway counted
    as ``counted``, given the request ``body`` (for what the count leaves out). With the
    engine's ``reported`` figure within the count's own bound, the body is not walked: that
    bound already holds the figure (every request pays this, most with an honest engine)."""
    counted_cap = PROMPT_FACTOR * counted + PROMPT_SLACK
    if reported is not None and 0 <= reported <= counted_cap:
        return counted_cap
    return counted_cap + _uncounted(body)


def _uncounted(body: dict[str, Any]) -> int:
    """What the gateway's count leaves out of ``body``, in tokens at most: the bytes of its tools,
    functions and formats, and `IMAGE_TOKENS` per non-text part of a message."""
    extra = sum(len(msgspec.json.encode(body[name])) for name in _UNCOUNTED if name in body)
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):
                extra += IMAGE_TOKENS * sum(1 for p in content if not _is_text(p))
            if isinstance(message, dict) and "tool_calls" in message:
                extra += len(msgspec.json.encode(message["tool_calls"]))
    return extra


def _is_text(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type", "text") == "text"


def bound(
    prompt: int,
    completion: int,
    cached: int,
    *,
    prompt_most: int | None,
    completion_most: int | None,
) -> Bounded:
    """The engine's figures held to ``[0, most]`` (no upper bound where ``most`` is None, as for
    records spooled before bounds were kept), cached tokens to the prompt's; and which figures
    were out of bounds."""
    flagged: list[str] = []
    billed_prompt = _within(prompt, prompt_most, "prompt", flagged)
    billed_completion = _within(completion, completion_most, "completion", flagged)
    billed_cached = _within(cached, billed_prompt, "cached", flagged)
    return billed_prompt, billed_completion, billed_cached, tuple(flagged)


def _within(value: int, most: int | None, name: str, flagged: list[str]) -> int:
    if value < 0:
        flagged.append(name)
        return 0
    if most is not None and value > most:
        flagged.append(name)
        return most
    return value
