"""One usage record per request, and the sinks records go to.

A record holds both measurements side by side — the engine's usage when it sent one, and the
gateway's count of the text it actually forwarded — because P6 says neither is trusted alone.
The sink is an interface: a bounded ring in memory (served at GET /api/v1/requests) and, in
database mode, the Postgres ledger.

What a record bills (`UsageRecord.billed_tokens`) is decided once, when the record is built (or
read back from the spool), and kept beside its fields: settlement, the metrics and the ledger row
each read it, and a request's record is read that way several times in the gateway's hot path.
The figures are derived, never sent: a record's JSON (the spool, the request log) is its fields.
The engine's figures are billed only within the bounds the record carries (``bounds.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Literal, Protocol

import msgspec

from fleet_core.gateway.metering import bounds

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


class UsageRecord(msgspec.Struct, frozen=True, kw_only=True, rename="camel", dict=True):
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
    prompt_cap: int | None = None
    """The most prompt tokens the engine's usage may bill (`bounds.prompt_cap`: the bound of the
    gateway's own count when the engine's figure is within it, else with the body's uncounted
    parts added); None: no bound but 0 (records spooled before bounds were kept)."""
    completion_cap: int | None = None
    """The most completion tokens it may bill: what was reserved (`bounds.completion_cap`)."""

    def __post_init__(self) -> None:
        # ``dict=True`` gives the record a ``__dict__`` beside its fields: the billed figures
        # live there, computed once here (msgspec runs this on construction, ``replace`` and
        # decoding alike) and never encoded.
        self.__dict__[_BILLED], self.__dict__[_FLAGGED] = _billed_tokens(self)

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
        """``(prompt_tokens, completion_tokens, cached_tokens)`` at once: what settlement, the
        metrics and the ledger read of every record, decided when the record was built."""
        billed: tuple[int, int, int] = self.__dict__[_BILLED]
        return billed

    @property
    def prompt_tokens(self) -> int:
        """The billed prompt tokens: the engine's when it said, else the gateway's count."""
        return self.billed_tokens()[0]

    @property
    def completion_tokens(self) -> int:
        return self.billed_tokens()[1]

    @property
    def cached_tokens(self) -> int:
        return self.billed_tokens()[2]

    @property
    def out_of_bounds(self) -> tuple[str, ...]:
        """The engine's figures billed at their bound rather than as reported (``bounds.py``)."""
        flagged: tuple[str, ...] = self.__dict__[_FLAGGED]
        return flagged

    @property
    def fresh_tokens(self) -> int:
        prompt, _, cached = self.billed_tokens()
        return prompt - cached


_BILLED = "_billed_tokens"
_FLAGGED = "_out_of_bounds"
_NOTHING = (0, 0, 0)


def _billed_tokens(record: UsageRecord) -> tuple[tuple[int, int, int], tuple[str, ...]]:
    """The billed ``(prompt, completion, cached)`` tokens, and the engine's figures that were out
    of bounds: none unless `UsageRecord.billed`; the engine's usage when it sent one, held to the
    record's bounds (`bounds.bound`), else the gateway's count (which sees no cache)."""
    outcome = record.outcome  # `UsageRecord.billed`, inline: this runs for every record
    if outcome == "refused" or record.endpoint is None:
        return _NOTHING, ()
    if outcome == "upstream_error" and record.first_byte_at is None:
        return _NOTHING, ()
    engine = record.engine
    if engine is not None:
        prompt, completion, cached, flagged = bounds.bound(
            engine.prompt_tokens,
            engine.completion_tokens,
            engine.cached_tokens,
            prompt_most=record.prompt_cap,
            completion_most=record.completion_cap,
        )
        return (prompt, completion, cached), flagged
    gateway = record.gateway
    completion, most = gateway.completion_tokens, record.completion_cap
    # The relayed text of an engine that ignored max_tokens: billed no further than reserved.
    return (gateway.prompt_tokens, completion if most is None else min(completion, most), 0), ()


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
