"""The gateway's own token count of the text it forwarded (P6: nobody's claim is trusted).

With a model's ``tokenizer.json`` the count is exact for the text (chat-template tokens excluded:
the engine counts those too, so a chat prompt reads a few tokens lower here than the engine's).
Without one, the estimate is an upper bound for every tokenizer and every script (ADR 0022): one
token per UTF-8 byte, plus one. A byte-level BPE tokenizer (GPT-2, Llama 3, Qwen) never makes a
token of less than a byte, and a SentencePiece one with byte fallback (Llama 2, Mistral) at most
adds its leading word marker, so no text counts higher than this. Rules of thumb such as four
characters a token are averages over English prose: digits, punctuation, code, or any other
script run well above them, and a client that reads everything and leaves before the engine's
usage frame would be billed by the average for output that cost several times more. The
estimate is what is reserved before the engine has spoken and what is billed only when the engine
never said (and its ``/tokenize`` could not count it either: `exchange.engine_count`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ESTIMATE", "Counter", "counter_from_json", "estimate_tokens", "load_counter"]

log = logging.getLogger("fleet.metering")

ESTIMATE = "estimate:utf8-bytes"


def estimate_tokens(text: str) -> int:
    """At least as many tokens as any tokenizer makes of ``text``: its UTF-8 bytes, plus one."""
    if not text:
        return 0
    if text.isascii():
        return len(text) + 1
    return len(text.encode("utf-8", "surrogatepass")) + 1


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
