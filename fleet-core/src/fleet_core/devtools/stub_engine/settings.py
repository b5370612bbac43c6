"""What a stub engine imitates and how it misbehaves: one frozen struct, built once.

``main()`` builds it from the command line and the environment; tests and the gateway's ``--demo``
mode build it directly. Values are checked when the struct is built, so a configuration that cannot
work fails at start-up with one line instead of on the first request.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["DEFAULT_REPLY", "Profile", "StubSettings"]

Profile = Literal["vllm", "llamacpp"]
"""Which real engine's wire details (``/health``, ``/v1/models``, ``/metrics``, errors) to copy."""

DEFAULT_REPLY = "Hello from the Fleet stub engine: this is a canned reply."


class StubSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a stub engine needs; every field has a default."""

    model: str = "fleet-stub"
    """The one served model name; any other ``model`` in a request is a 404."""

    profile: Profile = "vllm"
    """The engine to imitate."""

    latency_ms: float = 0.0
    """Delay before a response starts (queueing plus prefill), once a sequence slot is free."""

    token_delay_ms: float = 0.0
    """Delay before each generated token; a non-streamed reply waits for all of them at once."""

    fail_after_tokens: int | None = None
    """Cut every stream right after this many content frames (no ``[DONE]``, unclean chunked end);
    non-streamed generation requests answer 500. ``None`` disables the fault."""

    api_key: str | None = None
    """When set, every ``/v1`` route requires ``Authorization: Bearer <api_key>``."""

    reply: str = DEFAULT_REPLY
    """The canned completion; one whitespace-separated word is one token."""

    max_num_seqs: int = 256
    """Requests generating at once; later ones wait (``num_requests_waiting``), as in vLLM."""

    max_model_len: int = 4096
    """Advertised in the vLLM profile's ``/v1/models``; informational only."""

    embedding_dim: int = 8
    """Length of the deterministic embedding vectors."""

    kv_capacity_tokens: int | None = None
    """KV-cache size in tokens: occupancy is then the prompt and reply tokens of running
    requests over it. ``None``: occupancy is running requests over ``max_num_seqs``."""

    kv_baseline: float = 0.0
    """KV occupancy (0–1) held by nothing the stub serves, added to its own: scripted pressure."""

    prefix_cache_chars: int = 0
    """Model a prefix cache: a prompt whose first N characters were seen recently is a hit and
    starts after ``prefix_hit_latency_ms`` instead of ``latency_ms``. 0 disables it."""

    prefix_hit_latency_ms: float = 0.0
    """Delay before a response starts when its prompt prefix is cached."""

    prefix_cache_entries: int = 256
    """Prefixes the modelled cache holds, least recently used evicted first (a real engine's
    is bounded by its KV cache)."""

    def __post_init__(self) -> None:
        problem = _problem(self)
        if problem is not None:
            raise ValueError(problem)


def _problem(settings: StubSettings) -> str | None:
    if not settings.model:
        return "model must not be empty; pass --model NAME"
    if settings.profile not in ("vllm", "llamacpp"):
        return f"profile must be 'vllm' or 'llamacpp', not {settings.profile!r}"
    if settings.latency_ms < 0 or settings.token_delay_ms < 0:
        return "latency_ms and token_delay_ms must be >= 0"
    if settings.fail_after_tokens is not None and settings.fail_after_tokens < 0:
        return "fail_after_tokens must be >= 0 (or unset to disable the fault)"
    if not settings.reply.split():
        return "reply must contain at least one word"
    if settings.max_num_seqs < 1 or settings.max_model_len < 1 or settings.embedding_dim < 1:
        return "max_num_seqs, max_model_len and embedding_dim must be >= 1"
    return _cache_problem(settings)


def _cache_problem(settings: StubSettings) -> str | None:
    if settings.kv_capacity_tokens is not None and settings.kv_capacity_tokens < 16:
        return "kv_capacity_tokens must be >= 16 (one block), or unset"
    if not 0.0 <= settings.kv_baseline <= 1.0:
        return "kv_baseline must be between 0 and 1"
    if settings.prefix_cache_chars < 0 or settings.prefix_hit_latency_ms < 0:
        return "prefix_cache_chars and prefix_hit_latency_ms must be >= 0"
    if settings.prefix_cache_entries < 1:
        return "prefix_cache_entries must be >= 1"
    return None
