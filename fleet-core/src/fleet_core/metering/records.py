"""One usage record per request, and the sinks records go to.

A record holds both measurements side by side — the engine's usage when it sent one, and the
gateway's count of the text it actually forwarded — because P6 says neither is trusted alone.
The sink is an interface: a bounded ring in memory now (served at GET /api/v1/requests), the
Postgres ledger later.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Literal, Protocol

import msgspec

__all__ = ["EngineUsage", "FanOut", "GatewayCount", "RingSink", "UsageRecord", "UsageSink"]

Outcome = Literal["ok", "client_error", "upstream_error", "client_disconnected", "refused"]


class EngineUsage(msgspec.Struct, frozen=True, rename="camel"):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


class GatewayCount(msgspec.Struct, frozen=True, rename="camel"):
    prompt_tokens: int
    completion_tokens: int
    method: str


class UsageRecord(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    request_id: str
    """Minted by the gateway for this request alone: the ledger's key. Never the client's."""
    kind: str
    model: str
    served_model: str
    endpoint: str | None
    status: int
    outcome: Outcome
    stream: bool
    received_at: float
    first_byte_at: float | None
    done_at: float
    engine: EngineUsage | None
    gateway: GatewayCount
    tenant: str | None = None
    project: str | None = None
    key_id: str | None = None
    units: int | None = None
    """Micro-units billed (tokens × the model's rates); None when the model has no rates."""
    client_request_id: str | None = None
    """The client's own ``X-Request-Id``, kept for its reference; not unique, never a key."""

    @property
    def billed(self) -> bool:
        """Whether this record bills anything.

        Nothing is billed for a request that never reached an engine (refused at admission,
        or gone while waiting for one), nor for one that failed upstream before its first byte.
        """
        if self.outcome == "refused" or self.endpoint is None:
            return False
        return not (self.outcome == "upstream_error" and self.first_byte_at is None)

    def billed_tokens(self) -> tuple[int, int, int]:
        """``(prompt_tokens, completion_tokens, cached_tokens)`` at once: what settlement and
        the metrics read of every record, deciding `billed` once instead of in each."""
        if not self.billed:
            return 0, 0, 0
        engine = self.engine
        if engine is not None:
            return engine.prompt_tokens, engine.completion_tokens, engine.cached_tokens
        return self.gateway.prompt_tokens, self.gateway.completion_tokens, 0

    @property
    def prompt_tokens(self) -> int:
        """The billed prompt tokens: the engine's when it said, else the gateway's count."""
        if not self.billed:
            return 0
        return self.engine.prompt_tokens if self.engine else self.gateway.prompt_tokens

    @property
    def completion_tokens(self) -> int:
        if not self.billed:
            return 0
        return self.engine.completion_tokens if self.engine else self.gateway.completion_tokens

    @property
    def cached_tokens(self) -> int:
        return self.engine.cached_tokens if self.engine and self.billed else 0

    @property
    def fresh_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


class UsageSink(Protocol):
    def record(self, record: UsageRecord) -> None:
        """Accept a record without blocking the response that produced it."""


class RingSink:
    """The newest ``capacity`` records in memory, for the console's request log."""

    def __init__(self, capacity: int = 1000) -> None:
        self._ring: deque[UsageRecord] = deque(maxlen=capacity)

    def record(self, record: UsageRecord) -> None:
        self._ring.append(record)

    def recent(self, limit: int) -> Sequence[UsageRecord]:
        return list(reversed(self._ring))[:limit]


class FanOut:
    """Hands every record to several sinks (the ring and, in database mode, the ledger)."""

    def __init__(self, *sinks: UsageSink) -> None:
        self._sinks = sinks

    def record(self, record: UsageRecord) -> None:
        for sink in self._sinks:
            sink.record(record)
