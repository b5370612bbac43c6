"""Runtime state of each endpoint: requests in flight, slots, and health. Keyed by URL.

State outlives routing-table swaps: when discovery rebuilds the table, an endpoint that stays keeps
its counters, and one that goes is simply dropped from the registry while requests already holding
it finish normally.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from fleet_core.errors import RateLimited
from fleet_core.gateway.routing.selection import Candidate, choose
from fleet_core.gateway.routing.table import Pool, Target

__all__ = ["EndpointRegistry", "EndpointState", "Lease"]

log = logging.getLogger("fleet.gateway.endpoints")


@dataclass
class EndpointState:
    url: str
    in_flight: int = 0
    ready: bool = True
    reason: str = "not checked yet"
    consecutive_failures: int = 0

    def mark(self, ready: bool, reason: str) -> None:
        if ready != self.ready:
            level = logging.INFO if ready else logging.WARNING
            log.log(
                level,
                "endpoint %s is now %s: %s",
                self.url,
                _word(ready),
                reason,
                extra={"endpoint": self.url, "ready": ready, "reason": reason},
            )
        self.ready, self.reason = ready, reason


def _word(ready: bool) -> str:
    return "ready" if ready else "down"


@dataclass
class Lease:
    """One request's hold on an endpoint; ``release`` exactly once, on every path."""

    target: Target
    state: EndpointState
    registry: EndpointRegistry
    _released: bool = field(default=False, repr=False)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.state.in_flight -= 1
            self.registry.notify()


class EndpointRegistry:
    """All endpoint states, plus the waiting room for requests that found every slot taken."""

    def __init__(self, *, eject_after: int, rng: random.Random | None = None) -> None:
        self._states: dict[str, EndpointState] = {}
        self._eject_after = eject_after
        self._rng = rng or random.Random()
        self._freed = asyncio.Event()

    def sync(self, urls: Iterable[str]) -> None:
        """Track exactly ``urls`` from now on (called with every new routing table)."""
        wanted = set(urls)
        self._states = {u: self._states.get(u) or EndpointState(u) for u in sorted(wanted)}

    def get(self, url: str) -> EndpointState:
        return self._states.setdefault(url, EndpointState(url))

    def states(self) -> Sequence[EndpointState]:
        return list(self._states.values())

    def notify(self) -> None:
        self._freed.set()

    def _candidates(self, pool: Pool, tried: set[str]) -> list[Candidate]:
        out = []
        for target in pool.targets:
            if target.url in tried:
                continue
            state = self.get(target.url)
            out.append(Candidate(state.ready, state.in_flight, target.slots))
        return out

    async def acquire(self, pool: Pool, tried: set[str], *, wait_s: float) -> Lease | None:
        """A lease on the best untried ready endpoint of ``pool``; None when none is left.

        When every ready endpoint is at its slot limit, wait up to ``wait_s`` for one to free,
        then refuse with 429: the engine is saturated and a retry later is the honest answer.
        """
        deadline = time.monotonic() + wait_s
        untried = [t for t in pool.targets if t.url not in tried]
        while True:
            index = choose(self._candidates(pool, tried), self._rng)
            if index is not None:
                target = untried[index]
                state = self.get(target.url)
                state.in_flight += 1
                return Lease(target, state, self)
            if not any(self.get(t.url).ready for t in untried):
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RateLimited(
                    f"every endpoint of {pool.name!r} is at its slot limit; retry shortly",
                    retry_after=1,
                    code="engine_overloaded",
                )
            self._freed.clear()
            try:
                await asyncio.wait_for(self._freed.wait(), remaining)
            except TimeoutError:
                continue

    def record_success(self, state: EndpointState) -> None:
        state.consecutive_failures = 0

    def record_failure(self, state: EndpointState, reason: str) -> None:
        """Passive ejection: enough consecutive connection failures take an endpoint out."""
        state.consecutive_failures += 1
        if state.consecutive_failures >= self._eject_after:
            state.mark(
                False,
                f"ejected after {state.consecutive_failures} consecutive "
                f"connection failures ({reason})",
            )
