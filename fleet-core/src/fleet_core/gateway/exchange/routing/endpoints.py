"""Runtime state of each endpoint: requests in flight, slots, health, engine signals. By URL.

State outlives routing-table swaps: when discovery rebuilds the table, an endpoint that stays keeps
its counters, and one that goes is simply dropped from the registry while requests already holding
it finish normally.

The decisions themselves are pure functions elsewhere (`selection`, `affinity`, `fairness`); this
module feeds them the current state and keeps the waiting room: a request that finds every slot
of its pool taken waits in a fair queue across tenants, and each freed slot is handed straight to
the next waiter in that queue (so a newcomer cannot take it first).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import msgspec

from fleet_core.gateway.exchange.routing import affinity
from fleet_core.gateway.exchange.routing.fairness import FairQueue, Waiting
from fleet_core.gateway.exchange.routing.selection import Candidate, Scoring, choose
from fleet_core.gateway.exchange.routing.signals import EngineSignals
from fleet_core.gateway.exchange.routing.table import Pool, Target
from fleet_core.shared.errors import RateLimited

__all__ = ["ANY_TICKET", "EndpointRegistry", "EndpointState", "Lease", "Ticket"]

log = logging.getLogger("fleet.gateway.endpoints")


@dataclass
class EndpointState:
    url: str
    in_flight: int = 0
    ready: bool = True
    reason: str = "not checked yet"
    consecutive_failures: int = 0
    signals: EngineSignals | None = None
    """The engine's last successful ``/metrics`` scrape, if any."""
    finished: int = 0
    """Attempts on this endpoint that ended, since this process started (cumulative)."""
    errors: int = 0
    """Of those, the ones the endpoint failed: transport, timeout, malformed, 429/5xx, broken
    stream. A client's 4xx or a client that left is not the endpoint's error."""

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


@dataclass(slots=True)
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


class Ticket(msgspec.Struct, frozen=True):
    """What routing knows of a request: whose it is, what it may cost, what it is like.
    A struct, not a frozen dataclass: one is made per request, at a sixth of the cost."""

    tenant: str = "anonymous"
    cost: float = 1.0
    """Tokens it may take (prompt plus the reserved completion): its fair-queue weight."""
    priority: int = 1
    key: str | None = None
    """Its affinity key (session or prompt prefix), for ``prefix_affinity`` pools."""


ANY_TICKET = Ticket()


@dataclass
class _Waiter:
    pool: Pool
    tried: set[str]
    ticket: Ticket
    granted: asyncio.Future[Lease | None]


class EndpointRegistry:
    """All endpoint states, plus the fair waiting room for requests that found every slot taken."""

    def __init__(
        self,
        *,
        eject_after: int,
        rng: random.Random | None = None,
        scoring: Scoring | None = None,
        signal_max_age: float = 10.0,
        epsilon: float = 0.25,
    ) -> None:
        self._states: dict[str, EndpointState] = {}
        self._eject_after = eject_after
        self._rng = rng or random.Random()
        self._scoring = scoring or Scoring()
        self._max_age = signal_max_age
        self._epsilon = epsilon
        self._rings: dict[tuple[str, ...], affinity.Ring] = {}
        self._queues: dict[str, FairQueue[_Waiter]] = {}  # by pool: waiters compete for it

    def sync(self, urls: Iterable[str]) -> None:
        """Track exactly ``urls`` from now on (called with every new routing table)."""
        wanted = set(urls)
        self._states = {u: self._states.get(u) or EndpointState(u) for u in sorted(wanted)}
        self._rings.clear()

    def get(self, url: str) -> EndpointState:
        state = self._states.get(url)
        if state is None:  # not setdefault: that would build a state on every call
            state = self._states[url] = EndpointState(url)
        return state

    def states(self) -> Sequence[EndpointState]:
        return list(self._states.values())

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def fresh_signals(self, url: str) -> EngineSignals | None:
        signals = self.get(url).signals
        fresh = signals is not None and signals.fresh(time.monotonic(), max_age=self._max_age)
        return signals if fresh else None

    def _candidate(self, target: Target, now: float) -> Candidate:
        state = self.get(target.url)
        signals = state.signals
        if signals is None or not signals.fresh(now, max_age=self._max_age):
            return Candidate(state.ready, state.in_flight, target.slots)
        return Candidate(
            state.ready, state.in_flight, target.slots, signals.waiting, signals.kv_usage
        )

    def _ring(self, targets: Sequence[Target]) -> affinity.Ring:
        urls = tuple(t.url for t in targets)
        ring = self._rings.get(urls)
        if ring is None:
            ring = self._rings[urls] = affinity.build_ring(urls)
        return ring

    def _pick(self, pool: Pool, untried: list[Target], ticket: Ticket) -> int | None:
        now = time.monotonic()
        candidates = [self._candidate(t, now) for t in untried]
        if pool.routing == "prefix_affinity" and ticket.key is not None:
            pairs = list(zip(untried, candidates, strict=True))
            open_ = {t.url: c.in_flight for t, c in pairs if c.has_room}
            url = affinity.pick(self._ring(untried), ticket.key, open_, epsilon=self._epsilon)
            return None if url is None else [t.url for t in untried].index(url)
        return choose(candidates, self._rng, self._scoring)

    def _try_lease(self, pool: Pool, tried: set[str], ticket: Ticket) -> Lease | None:
        untried = [t for t in pool.targets if t.url not in tried]
        index = self._pick(pool, untried, ticket)
        if index is None:
            return None
        target = untried[index]
        state = self.get(target.url)
        state.in_flight += 1
        return Lease(target, state, self)

    def _any_ready(self, pool: Pool, tried: set[str]) -> bool:
        return any(self.get(t.url).ready for t in pool.targets if t.url not in tried)

    async def acquire(
        self, pool: Pool, tried: set[str], *, wait_s: float, ticket: Ticket = ANY_TICKET
    ) -> Lease | None:
        """A lease on the best untried ready endpoint of ``pool``; None when none is left.

        When every ready endpoint is at its slot limit, wait (fairly, across tenants) up to
        ``wait_s`` for a slot, then refuse with 429: the engine is saturated and a retry later
        is the honest answer.
        """
        lease = self._try_lease(pool, tried, ticket)
        if lease is not None or not self._any_ready(pool, tried):
            return lease
        granted: asyncio.Future[Lease | None] = asyncio.get_running_loop().create_future()
        queue = self._queues.setdefault(pool.name, FairQueue())
        entry = queue.push(
            ticket.tenant,
            _Waiter(pool, tried, ticket, granted),
            cost=ticket.cost,
            priority=ticket.priority,
        )
        try:
            await asyncio.wait((granted,), timeout=wait_s)
        except asyncio.CancelledError:  # the client left while waiting
            queue.cancel(entry)
            if granted.done() and (won := granted.result()) is not None:
                won.release()  # granted as it was cancelled: the slot must not leak
            raise
        queue.cancel(entry)  # a no-op when it was served
        if granted.done():
            return granted.result()
        raise RateLimited(
            f"every endpoint of {pool.name!r} is at its slot limit; retry shortly",
            retry_after=1,
            code="engine_overloaded",
        )

    def notify(self) -> None:
        """A slot freed (or an endpoint came back): hand slots to waiters in fair order."""
        for queue in self._queues.values():
            if len(queue):
                self._dispatch(queue)

    def _dispatch(self, queue: FairQueue[_Waiter]) -> None:
        held: list[Waiting[_Waiter]] = []
        while (entry := queue.pop()) is not None:
            waiter = entry.item
            lease = self._try_lease(waiter.pool, waiter.tried, waiter.ticket)
            if lease is None and self._any_ready(waiter.pool, waiter.tried):
                held.append(entry)
                if not waiter.tried:
                    break  # no room in the pool at all: nobody behind can be served either
                continue  # it excluded endpoints it tried; one behind it may fit elsewhere
            queue.served(entry)
            waiter.granted.set_result(lease)
        queue.putback(held)

    def count(self, url: str, *, failed: bool) -> None:
        """One attempt on ``url`` ended (`GatewayService` calls it once per attempt, when the
        request's record is written). An endpoint no longer tracked is not re-added."""
        state = self._states.get(url)
        if state is not None:
            state.finished += 1
            state.errors += failed

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
