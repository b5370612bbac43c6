"""The pretend engine's scheduler and books: bounded concurrency and the counters tests read.

Like vLLM, at most ``max_num_seqs`` requests generate at once and the rest wait; the running and
waiting counts are the real in-flight numbers, so ``/metrics`` tells a router the truth. The
counters (started, finished, cancelled, failed, tokens) let a test prove what happened upstream,
for example that a client's disconnect really stopped generation.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator

from fleet_core.devtools.stub_engine import replies
from fleet_core.devtools.stub_engine.errors import EngineFailure
from fleet_core.devtools.stub_engine.settings import StubSettings
from fleet_core.devtools.stub_engine.wire import ENCODER, StatsSnapshot

__all__ = ["Engine", "Stats"]


class Stats:
    """Counters of one engine; touched only from its event loop, so plain integers suffice."""

    __slots__ = (
        "kv_tokens",
        "peak_running",
        "prefix_hits",
        "prefix_misses",
        "prompt_tokens",
        "requests_cancelled",
        "requests_failed",
        "requests_finished",
        "requests_started",
        "running",
        "tokens_generated",
        "waiting",
    )

    def __init__(self) -> None:
        self.requests_started = 0
        self.requests_finished = 0
        self.requests_cancelled = 0
        self.requests_failed = 0
        self.tokens_generated = 0
        self.prompt_tokens = 0
        self.running = 0
        self.waiting = 0
        self.kv_tokens = 0
        self.peak_running = 0
        self.prefix_hits = 0
        self.prefix_misses = 0

    def snapshot(self) -> StatsSnapshot:
        return StatsSnapshot(**{name: getattr(self, name) for name in self.__slots__})


class Engine:
    """One stub engine's state: settings in a handy form, sequence slots and counters."""

    def __init__(self, settings: StubSettings) -> None:
        self.settings = settings
        self.stats = Stats()
        self.latency = settings.latency_ms / 1000
        self.token_delay = settings.token_delay_ms / 1000
        self.reply = replies.reply_tokens(settings.reply)
        self.reply_json = tuple(ENCODER.encode(token) for token in self.reply)
        self.hit_latency = settings.prefix_hit_latency_ms / 1000
        self.kv_capacity = settings.kv_capacity_tokens or settings.max_num_seqs * (
            settings.max_model_len
        )
        # asyncio primitives bind to the running loop on first contention, not here.
        self._slots = asyncio.Semaphore(settings.max_num_seqs)
        self._prefixes: OrderedDict[str, None] = OrderedDict()

    @property
    def kv_usage(self) -> float:
        """KV occupancy 0–1: the scripted baseline plus what running requests hold."""
        settings, stats = self.settings, self.stats
        own = (
            stats.kv_tokens / self.kv_capacity
            if settings.kv_capacity_tokens
            else stats.running / settings.max_num_seqs
        )
        return min(1.0, settings.kv_baseline + own)

    def prefill_delay(self, prompt_head: str) -> float:
        """The delay before answering: shorter when the prompt's prefix is cached (LRU)."""
        chars = self.settings.prefix_cache_chars
        if not chars:
            return self.latency
        key = prompt_head[:chars]
        if key in self._prefixes:
            self._prefixes.move_to_end(key)
            self.stats.prefix_hits += 1
            return self.hit_latency
        self._prefixes[key] = None
        if len(self._prefixes) > self.settings.prefix_cache_entries:
            self._prefixes.popitem(last=False)
        self.stats.prefix_misses += 1
        return self.latency

    @contextlib.asynccontextmanager
    async def sequence(self, prompt_tokens: int) -> AsyncIterator[None]:
        """Hold one of the ``max_num_seqs`` slots; waiting and running counts follow, and the
        request's prompt and reply tokens occupy the KV cache while it runs."""
        stats = self.stats
        stats.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            stats.waiting -= 1
        held = prompt_tokens + len(self.reply)
        stats.running += 1
        stats.peak_running = max(stats.peak_running, stats.running)
        stats.kv_tokens += held
        stats.prompt_tokens += prompt_tokens
        try:
            yield
        finally:
            stats.running -= 1
            stats.kv_tokens -= held
            self._slots.release()

    def fail(self) -> EngineFailure:
        """Book a request the injected fault refuses outright, and the error to raise."""
        self.stats.requests_started += 1
        self.stats.requests_failed += 1
        return EngineFailure(
            f"injected failure: this engine breaks after {self.settings.fail_after_tokens} tokens"
        )
