"""Unit rates as integers, and what a request's tokens cost, exactly.

A rate is kept as integer micro-units per 1,000 tokens (``PER_TOKENS``). On the wire it is units
per million tokens — the same number divided by 1,000 — so a wire rate has at most three
decimals, parsed exactly (never through a float). A request's micro-units are
``Σ tokens × rate`` summed exactly, divided by 1,000 and rounded once, halves up: the cost pool's
rule (`costs.allocation.round_half_up`), so 1, 3, 5 and 7 tokens at 0.5 units per million tokens
cost 1, 2, 3 and 4 micro-units — never the 0, 2, 2, 4 a float with banker's rounding gave.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from fleet_core.shared.errors import InvalidRequest

__all__ = ["MAX_RATE", "PER_TOKENS", "Rates", "from_wire", "to_wire"]

PER_TOKENS = 1000
"""A stored rate is micro-units per this many tokens."""
MAX_RATE = 10**15
"""The largest stored rate: 10^12 units per million tokens."""


@dataclass(frozen=True, slots=True)
class Rates:
    """Integer micro-units per 1,000 tokens for fresh input, cached input and output."""

    input_fresh: int
    input_cached: int
    output: int

    def micro_units(self, *, fresh: int, cached: int, output: int) -> int:
        """The tokens' price in micro-units: exact sum, one rounding, halves up."""
        exact = fresh * self.input_fresh + cached * self.input_cached + output * self.output
        return (2 * exact + PER_TOKENS) // (2 * PER_TOKENS)

    def billed(self, tokens: tuple[int, int, int]) -> int:
        """What a record's billed ``(prompt, completion, cached)`` tokens cost: its cached
        prompt tokens at the cached rate, the rest of its prompt at the fresh rate."""
        prompt, completion, cached = tokens  # `micro_units`, inline: it runs per request
        exact = (prompt - cached) * self.input_fresh + cached * self.input_cached
        exact += completion * self.output
        return (2 * exact + PER_TOKENS) // (2 * PER_TOKENS)


def from_wire(value: Decimal, *, param: str) -> int:
    """A wire rate (units per million tokens) as stored micro-units per 1,000 tokens; 400 for a
    value that is not a finite, non-negative number with at most three decimals."""
    scaled = value * PER_TOKENS if value.is_finite() else Decimal(-1)
    if scaled < 0 or scaled > MAX_RATE or scaled != scaled.to_integral_value():
        raise InvalidRequest(
            f"{param} must be between 0 and {MAX_RATE // PER_TOKENS} units per million tokens, "
            "with at most three decimals",
            param=param,
        )
    return int(scaled)


def to_wire(rate: int) -> float:
    """A stored rate as units per million tokens; its shortest repr is the exact decimal."""
    return rate / PER_TOKENS
