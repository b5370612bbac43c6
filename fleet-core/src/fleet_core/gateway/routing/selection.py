"""Endpoint choice as a pure function: least outstanding requests, random among ties (P3).

Kept free of I/O and clocks so it can be tested exhaustively and swapped for a smarter policy
(prefix-cache affinity, KV-cache pressure) without touching the proxy.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Candidate", "choose"]


@dataclass(frozen=True, slots=True)
class Candidate:
    ready: bool
    in_flight: int
    slots: int | None = None  # None: unlimited

    @property
    def has_room(self) -> bool:
        return self.ready and (self.slots is None or self.in_flight < self.slots)


def choose(candidates: Sequence[Candidate], rng: random.Random) -> int | None:
    """Index of the ready candidate with the fewest requests in flight and a free slot."""
    open_ = [i for i, c in enumerate(candidates) if c.has_room]
    if not open_:
        return None
    least = min(candidates[i].in_flight for i in open_)
    return rng.choice([i for i in open_ if candidates[i].in_flight == least])
