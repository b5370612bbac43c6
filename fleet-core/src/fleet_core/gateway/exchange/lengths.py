"""What the forwarded body lets an engine generate: never more than the reservation assumed.

The reservation is ``max_tokens`` (the client's, or the default) for each of the request's
sequences (``n``; for completions the larger of ``n`` and ``best_of``, per prompt). But engines
read their own names for the same knobs, and give them priority over OpenAI's: llama.cpp's server
reads ``n_predict`` before ``max_tokens`` and ``n_cmpl`` before ``n``; vLLM reads
``max_completion_tokens`` before ``max_tokens``. A body ``{"max_tokens": 1, "n_predict": 100000}``
would be reserved for one token and generate a hundred thousand. So the rule, in one place:

- **Length**: the forwarded body says the reserved per-sequence figure in ``max_tokens``, the one
  name every engine reads, and carries none of the other names for it (``n_predict``,
  ``max_completion_tokens``: their value is what ``max_tokens`` now says, for chat, or dropped).
  vLLM's ``min_tokens`` and ``ignore_eos`` stay: neither can pass ``max_tokens``.
- **Count**: a field asking for more sequences than the request's ``n`` (``n_cmpl``; ``best_of``
  on chat, where nothing reserves for it) is refused with a 400 naming it, before admission:
  silently dropping it would change the answer the client asked for.
- Fields that shape an answer without generating more tokens (``n_probs``, ``logprobs``,
  ``t_max_predict_ms``, ``n_keep``) pass through.

Whatever an engine still reports past the reservation is billed at it (``metering/bounds.py``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from fleet_core.gateway.edge.wire import ParsedRequest
from fleet_core.gateway.exchange.routing import adapters
from fleet_core.gateway.exchange.routing.table import Pool
from fleet_core.shared.errors import InvalidRequest

__all__ = ["LENGTH_FIELDS", "check", "forward_body"]

LENGTH_FIELDS = ("n_predict", "max_completion_tokens")
"""Engine names for the per-sequence length, replaced by ``max_tokens`` in the forwarded body."""
_COUNT_FIELDS = ("n_cmpl", "best_of")


def check(request: ParsedRequest) -> None:
    """Refuse (400) a count field that would generate more sequences than the request reserves."""
    if request.kind == "embeddings":
        return
    body, n = request.body, request.body.get("n") or 1
    for name in _COUNT_FIELDS:
        if name == "best_of" and request.kind == "completions":
            continue  # reserved for: `ParsedRequest.sequences`
        value = body.get(name)
        if value is not None and value != n:
            raise InvalidRequest(
                f"'{name}' is not supported through the gateway: use 'n' for the number of "
                "choices (the reservation counts 'n').",
                param=name,
                code="unsupported_parameter",
            )


def forward_body(request: ParsedRequest, pool: Pool, *, default_max_tokens: int) -> bytes:
    """The client's body for ``pool``: its model name (and LoRA adapter, `adapters.select`),
    usage asked for on streams, and the length the reservation assumed as ``max_tokens``, under
    no other name (see the module)."""
    body: dict[str, Any] = {**request.body, "model": pool.name}
    adapters.select(body, pool.engine, pool.adapter, loaded=pool.adapters_loaded)
    if request.stream and not request.wants_usage:
        options = body.get("stream_options") or {}
        body["stream_options"] = {**options, "include_usage": True}
    if request.kind != "embeddings":
        for name in LENGTH_FIELDS:
            body.pop(name, None)
        body["max_tokens"] = request.max_tokens or default_max_tokens
    return msgspec.json.encode(body)
