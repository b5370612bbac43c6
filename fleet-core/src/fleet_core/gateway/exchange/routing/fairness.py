"""Fair queueing between tenants for requests that found every slot taken (ADR 0013).

Start-time fair queueing (Goyal, Vin and Cheng, 1996), weighted by token cost: a waiting request
gets a start tag ``S = max(V, F_tenant)`` and its tenant's finish tag moves to
``F_tenant = S + cost / priority``; the queue serves the smallest start tag first and the virtual
time ``V`` follows the start tag of what it served last. A tenant that enqueued a hundred long
requests has start tags far in the virtual future, so another tenant's first request, tagged at
the present ``V``, is served after at most about one of them — not after all hundred. Arrival
order decides only between equal tags. Pure: no clock, no I/O, no asyncio.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["FairQueue", "Waiting"]

T = TypeVar("T")


@dataclass(order=True)
class Waiting(Generic[T]):
    """A queued item; ``cancel`` it to drop it from the queue (removed lazily)."""

    start: float
    seq: int
    tenant: str = field(compare=False)
    item: T = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class FairQueue(Generic[T]):
    def __init__(self) -> None:
        self._heap: list[Waiting[T]] = []
        self._finish: dict[str, float] = {}
        self._virtual = 0.0
        self._seq = itertools.count()
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def push(self, tenant: str, item: T, *, cost: float, priority: int = 1) -> Waiting[T]:
        """Queue ``item`` for ``tenant``; ``cost`` in tokens, ``priority`` ≥ 1 is its share."""
        start = max(self._virtual, self._finish.get(tenant, 0.0))
        self._finish[tenant] = start + max(cost, 1.0) / max(priority, 1)
        entry = Waiting(start, next(self._seq), tenant, item)
        heapq.heappush(self._heap, entry)
        self._live += 1
        return entry

    def cancel(self, entry: Waiting[T]) -> None:
        if not entry.cancelled:
            entry.cancel()
            self._live -= 1

    def pop(self) -> Waiting[T] | None:
        """The next item by start tag (cancelled ones skipped). Call `served` if it was, or
        `putback` if it must wait on."""
        while self._heap:
            entry = heapq.heappop(self._heap)
            if not entry.cancelled:
                self._live -= 1
                return entry
        return None

    def served(self, entry: Waiting[T]) -> None:
        """``entry`` left the queue for service: virtual time moves to its start tag."""
        entry.cancelled = True  # out of the queue: a late `cancel` must not count it again
        self._virtual = max(self._virtual, entry.start)
        if not self._live:
            self._forget()

    def putback(self, entries: list[Waiting[T]]) -> None:
        """Return popped entries that could not be served yet, keeping their tags."""
        for entry in entries:
            heapq.heappush(self._heap, entry)
            self._live += 1

    def _forget(self) -> None:
        """An empty queue keeps no history: finish tags behind V mean nothing any more."""
        self._finish = {t: f for t, f in self._finish.items() if f > self._virtual}
