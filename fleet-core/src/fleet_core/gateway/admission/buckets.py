"""Token-bucket arithmetic over plain floats, free of I/O and of clocks.

Both limit stores decide with these functions: `MemoryStore` calls them, and the Lua scripts in
``lua/`` repeat them operation for operation (Redis cannot call Python), so the two stores agree to
the bit. Keeping the arithmetic here, apart from storage, lets it be tested exhaustively.

Units: levels and amounts in tokens (or requests), times in seconds. A bucket refills
``capacity / 60`` per second and never holds more than ``capacity``; settlement may leave it below
zero (an overrun, P5), which it then pays back at the same rate.

Change a function here and the matching one in ``lua/lib_buckets.lua`` (shared by the admit and
settle scripts; ``retry_after`` is in ``lua/admit.lua``) with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "MIN_TTL_S",
    "Refusal",
    "admit",
    "apply",
    "can_take",
    "rate",
    "refill",
    "retry_after",
    "ttl",
]

SECONDS_PER_MINUTE = 60.0
MIN_TTL_S = 120.0
"""An idle bucket is forgotten after at least this long; by then it is full, as if new."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Which bucket (index into the request's charges) refused, and how long it needs."""

    index: int
    retry_after: float
    """Seconds; ``math.inf`` when the amount exceeds the capacity and can never fit."""


def rate(capacity: float) -> float:
    """Units per second a bucket of this per-minute ``capacity`` gains."""
    return capacity / SECONDS_PER_MINUTE


def refill(level: float, elapsed: float, capacity: float) -> float:
    """The level ``elapsed`` seconds later, capped at ``capacity``.

    A negative ``elapsed`` (a clock stepped back) adds nothing. The cap applies even without time
    passing, so a capacity lowered by configuration takes effect at once.
    """
    return min(capacity, level + max(0.0, elapsed) * rate(capacity))


def can_take(level: float, amount: float) -> bool:
    return level >= amount


def retry_after(level: float, amount: float, capacity: float) -> float:
    """Seconds until ``level`` has refilled to ``amount``; ``math.inf`` if it never will."""
    if amount > capacity or capacity <= 0:
        return math.inf
    return max(0.0, (amount - level) / rate(capacity))


def apply(level: float, amount: float, capacity: float) -> float:
    """Take ``amount`` (or refund it, if negative): the result may be negative, never above cap."""
    return min(capacity, level - amount)


def ttl(level: float, capacity: float) -> float:
    """How long a bucket left at ``level`` must be kept: twice its time to full, at least 120 s.

    Past that, a forgotten bucket reads as full, which by then it is.
    """
    if capacity <= 0:
        return MIN_TTL_S
    return max(MIN_TTL_S, 2.0 * (capacity - level) / rate(capacity))


def admit(
    levels: Sequence[float], amounts: Sequence[float], capacities: Sequence[float]
) -> Refusal | None:
    """None when every level holds its amount; else the refusing bucket with the longest wait.

    On a tie the first such bucket refuses. The levels must already be refilled to now.
    """
    worst: Refusal | None = None
    for index, (level, amount, capacity) in enumerate(
        zip(levels, amounts, capacities, strict=True)
    ):
        if can_take(level, amount):
            continue
        wait = retry_after(level, amount, capacity)
        if worst is None or wait > worst.retry_after:
            worst = Refusal(index, wait)
    return worst
