"""The arithmetic of a closed month, as pure functions over exact numbers.

Money is integer micro-units; GPU-time is GPU-microseconds, an integer for whole GPUs and an
exact fraction where MIG slices count as their part of a card (ADR 0026); a rate is micro-units
per GPU-hour. Every amount is computed exactly (``Fraction``) and rounded once, so the invariants
hold to the micro-unit for any input: ``busy + idle == pool``, ``0 <= busy <= pool`` and
``sum(allocated) == pool`` whenever anyone used the fleet (ADR 0006).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TypeVar

__all__ = [
    "US_PER_HOUR",
    "ClusterUsage",
    "Figures",
    "allocate",
    "apportion",
    "price",
    "round_half_up",
]

US_PER_HOUR = 3_600_000_000
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class ClusterUsage:
    """One cluster's month: GPU-time observed at each rate, and GPU-time some request occupied."""

    cluster: str
    capacity: Sequence[tuple[Fraction | int, int]]
    """``(gpu_us, gpu_hour_micro)`` per rate in effect; GPU-time observed at that rate."""
    busy_gpu_us: Fraction | int
    """The union of in-flight time per replica × its GPUs (not yet capped by capacity)."""

    @property
    def capacity_gpu_us(self) -> Fraction:
        return sum((Fraction(gpu_us) for gpu_us, _ in self.capacity), Fraction(0))

    @property
    def cost(self) -> Fraction:
        """The exact cost of the observed capacity, in micro-units."""
        return Fraction(sum(gpu_us * rate for gpu_us, rate in self.capacity), US_PER_HOUR)

    @property
    def busy_cost(self) -> Fraction:
        """Busy GPU-time valued at the cluster's mean observed rate, never above its cost.

        Busy time is capped by observed capacity: time the inventory did not see is not in the
        pool, so it cannot be busy in it either.
        """
        capacity = self.capacity_gpu_us
        if capacity == 0:
            return Fraction(0)
        return self.cost * min(self.busy_gpu_us, capacity) / capacity


@dataclass(frozen=True)
class Figures:
    pool: int
    busy: int
    idle: int
    by_cluster: dict[str, int]
    """The pool apportioned to each cluster (sums to ``pool``)."""


def round_half_up(value: Fraction) -> int:
    """The nearest integer, halves up: monotone, so ``a <= b`` gives ``round(a) <= round(b)``."""
    return int((value * 2 + 1) // 2)


def apportion(total: int, weights: Sequence[int]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainder; ties go to the earlier).

    Each part is its exact quota rounded down, and the units left over go one each to the parts
    with the largest remainders, so the parts sum to ``total`` exactly. All-zero weights get
    nothing: there is no basis to split on (the caller reports the total as unallocated).
    """
    if total < 0 or any(w < 0 for w in weights):
        raise ValueError("apportion needs a non-negative total and weights")
    whole = sum(weights)
    if whole == 0:
        return [0] * len(weights)
    parts = [total * w // whole for w in weights]
    remainders = [total * w % whole for w in weights]
    left = total - sum(parts)
    order = sorted(range(len(weights)), key=lambda i: (-remainders[i], i))
    for i in order[:left]:
        parts[i] += 1
    return parts


def allocate(pool: int, usage: Mapping[K, Fraction | int]) -> dict[K, int]:
    """The pool split by usage (exact fractions or integers); keys in sorted order break
    remainder ties (deterministic)."""
    keys = sorted(usage, key=repr)
    weights = _integers([Fraction(usage[k]) for k in keys])
    return dict(zip(keys, apportion(pool, weights), strict=True))


def _integers(values: Sequence[Fraction]) -> list[int]:
    """Exact fractions as integers in the same proportions (over their common denominator)."""
    common = math.lcm(*(value.denominator for value in values))
    return [int(value * common) for value in values]


def price(clusters: Sequence[ClusterUsage]) -> Figures:
    """pool, busy and idle of the fleet, each rounded once from exact sums."""
    pool = round_half_up(sum((c.cost for c in clusters), Fraction(0)))
    busy = round_half_up(sum((c.busy_cost for c in clusters), Fraction(0)))
    ordered = sorted(clusters, key=lambda c: c.cluster)
    # exact cost as integer weights: numerators over one common denominator
    shares = apportion(pool, _integers([c.cost for c in ordered]))
    return Figures(
        pool=pool,
        busy=busy,
        idle=pool - busy,
        by_cluster={c.cluster: s for c, s in zip(ordered, shares, strict=True)},
    )
