"""The gateway's own token count of the text it forwarded (P6: nobody's claim is trusted).

With a model's ``tokenizer.json`` the count is exact for the text (chat-template tokens excluded:
the engine counts those too, so a chat prompt reads a few tokens lower here than the engine's).
Without one, the documented estimate is one token per four ASCII characters, rounded up (OpenAI's
own rule of thumb for English, good to about ±25%), plus one token for every other character. The
four-characters rule is made for Latin text: Chinese, Japanese or Korean text runs at about one
token per character or more, so counting it by four would bill a quarter of it. One token per
non-ASCII character errs high for accented Latin text, never low for any script.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ESTIMATE", "Counter", "counter_from_json", "estimate_tokens", "load_counter"]

log = logging.getLogger("fleet.metering")

ESTIMATE = "estimate:ascii/4+other"


def estimate_tokens(text: str) -> int:
    if text.isascii():
        return (len(text) + 3) // 4
    ascii_chars = len(text.encode("ascii", "ignore"))
    return (ascii_chars + 3) // 4 + len(text) - ascii_chars


@dataclass(frozen=True)
class Counter:
    """Counts tokens of text; ``method`` is recorded on every usage record."""

    method: str
    count: Callable[[str], int]


def load_counter(tokenizer_path: str | None) -> Counter:
    """The counter for a pool: its tokenizer when one is configured and loads, else the estimate."""
    if not tokenizer_path:
        return Counter(ESTIMATE, estimate_tokens)
    from tokenizers import Tokenizer  # imported lazily: a gateway without tokenizers pays nothing

    tokenizer = Tokenizer.from_file(str(Path(tokenizer_path)))

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids) if text else 0

    return Counter(f"tokenizer:{Path(tokenizer_path).name}", count)


def counter_from_json(name: str, tokenizer_json: str) -> Counter:
    """A counter from a ``tokenizer.json`` document (the registry serves them); ValueError if it
    does not load."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_str(tokenizer_json)
    except Exception as exc:  # the tokenizers package raises plain Exception on bad input
        raise ValueError(f"not a tokenizer.json: {exc}") from exc

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids) if text else 0

    return Counter(f"tokenizer:{name}", count)
