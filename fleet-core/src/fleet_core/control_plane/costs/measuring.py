"""What "observed" and "busy" mean, as pure functions: the reference the SQL in ``store`` streams.

Times are integer microseconds since the epoch. The closing queries compute the same figures with
window functions over millions of rows; these functions say what those figures are, and the tests
hold the SQL to them. GPUs are counted in cards, exactly: a MIG slice is its share of one (1/7),
so GPU-time is a ``Fraction`` of GPU-microseconds wherever slices are in it (ADR 0026).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from fractions import Fraction
from typing import TypeVar

__all__ = ["Cards", "Measurements", "RateSlice", "observed_intervals", "replica_usage"]

K = TypeVar("K", bound=Hashable)
Cards = int | Fraction
"""A number of GPUs in cards: whole, or with slices as their part of a card."""


@dataclass(frozen=True)
class RateSlice:
    cluster: str
    gpu_hour_micro: int
    currency: str
    effective_from: datetime | None
    gpu_us: Fraction


@dataclass
class Measurements:
    """What the queries found for a month; every figure exact (GPU-time a fraction, for slices)."""

    observed_us: dict[str, int] = field(default_factory=dict)
    """Per cluster, microseconds of the month some sample vouched for."""
    existed_us: dict[str, int] = field(default_factory=dict)
    """Per cluster, microseconds of the month within its lifetime: first report to decommission,
    or to what its last report vouches for."""
    capacity_gpu_us: dict[str, Fraction] = field(default_factory=dict)
    slices: list[RateSlice] = field(default_factory=list)
    """Observed GPU-time per cluster and rate in effect."""
    busy_gpu_us: dict[str, Fraction] = field(default_factory=dict)
    used_gpu_us: dict[tuple[str, str], Fraction] = field(default_factory=dict)
    """Per (tenant, project): its share of busy GPU-time, the weight of the split. The part on
    whole GPUs is rounded half up to the GPU-µs, as before slices were priced (old months
    recompute the same); the part on slices is exact."""
    unplaced: int = 0


def observed_intervals(
    samples: Sequence[tuple[int, Cards]], *, start: int, end: int, max_gap_us: int
) -> list[tuple[int, int, Cards]]:
    """``(from, to, cards)`` the inventory vouches for within ``[start, end)``.

    A sample holds until the next one, but for at most ``max_gap_us``: the rest of a longer gap
    is unobserved, not assumed. ``samples`` are ``(observed_at, cards)`` in time order.
    """
    found = []
    for i, (at, gpus) in enumerate(samples):
        following = samples[i + 1][0] if i + 1 < len(samples) else None
        until = at + max_gap_us if following is None else min(following, at + max_gap_us)
        lo, hi = max(at, start), min(until, end)
        if hi > lo:
            found.append((lo, hi, gpus))
    return found


def replica_usage(
    requests: Iterable[tuple[int, int, K]], *, gpus: Cards
) -> tuple[Cards, dict[K, Fraction]]:
    """Busy GPU-time of one replica, and each key's share of it.

    The replica's GPUs are busy while at least one request is in flight; requests in flight
    together split each moment equally. ``requests`` are ``(start, end, key)``, already clipped
    to the period; ``gpus`` is what the replica holds in cards (gpusPerReplica × gpuShare). The
    shares sum to the busy time.
    """
    events = sorted(
        (
            (t, delta, key)
            for start, end, key in requests
            if end > start
            for t, delta in ((start, 1), (end, -1))
        ),
        key=lambda event: event[:2],
    )
    busy: Cards = 0
    shares: dict[K, Fraction] = {}
    active: dict[K, int] = {}
    for i, (t, delta, key) in enumerate(events):
        active[key] = active.get(key, 0) + delta
        following = events[i + 1][0] if i + 1 < len(events) else t
        n = sum(active.values())
        if following > t and n > 0:
            busy += (following - t) * gpus
            for held, count in active.items():
                if count:
                    shares[held] = shares.get(held, Fraction(0)) + Fraction(
                        (following - t) * gpus * count, n
                    )
    return busy, shares
