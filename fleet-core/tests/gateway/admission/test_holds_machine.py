"""The whole life of budget allowances on two replicas and one real Redis, as a stateful property
test: reserve, settle, commit, refresh, touch and crash, every update sent twice.

Each "replica" is a `BudgetBook` with its own `RedisStore` (its own client and connections) on
one real Redis, as two gateway processes would be.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from fleet_core.gateway.admission.allowances import book_key
from fleet_core.gateway.admission.budget_book import Amounts, BudgetBook, BudgetHold
from fleet_core.gateway.admission.limits import Hold, HoldUpdate
from fleet_core.gateway.admission.store import RedisStore, expiry_key, open_redis_store

from .conftest import TEST_TIMEOUT_S
from .redis_books import LIMIT, batched, entries, held, rule_for

T = TypeVar("T")


class _Replica:
    def __init__(self, store: RedisStore, book: BudgetBook) -> None:
        self.store = store
        self.book = book
        self.in_flight: dict[str, BudgetHold] = {}
        self.settled: list[str] = []
        self.used: dict[str, int] = {}
        """Settled request -> its use, until committed."""


class HoldsMachine(RuleBasedStateMachine):
    """Two replicas reserve, settle, commit, refresh, touch and crash, on one real Redis, under
    a limit drawn per run; every update is sent twice under its batch id (a lost reply retried).

    After every step each live replica's entry in the rule's book is exactly the allowance it
    tracks, the book's sum is the sum of its entries, each allowance covers what the replica
    counts, and what every replica counts (in flight: the demand; settled and not yet in the
    rollups: the use) stays within the limit, but for overruns (a use past the reservation,
    charged unchecked); a crashed replica's entry is gone once it expired.

    Time is driven, not waited for: entries live ``TTL_S`` (long: no step of a run on a loaded
    machine comes near it), and ``advance`` moves every deadline in the book as that much time
    passing would (Redis's own clock, which the scripts read, cannot be set).
    """

    url = ""
    counter = itertools.count()
    TTL_S = 60.0

    requests = Bundle("requests")

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.prefix = f"hm{next(self.counter)}:"
        self.replicas: list[_Replica] = []
        self.crashed: list[_Replica] = []
        self.ids = itertools.count()
        self.clock = 0.0
        self.touch_clock = 1e9
        self.overrun = 0
        self.rolled = 0
        """What the rollups show: every committed record's use."""
        self.limit = LIMIT

    @initialize(limit=st.integers(50, 5000))
    def start(self, limit: int) -> None:
        self.limit = limit
        self.rule = rule_for(self.prefix, limit=limit)
        self.key = book_key(self.rule, prefix=self.prefix)
        self.replicas = [self._replica(), self._replica()]

    def _replica(self) -> _Replica:
        store = self.run(open_redis_store(self.url, timeout_s=TEST_TIMEOUT_S))
        book = BudgetBook(prefix=self.prefix, ttl_s=self.TTL_S, grace_s=2.0)
        book.refreshed({self.rule.id: self.rolled}, started_at=self.clock)
        return _Replica(store, book)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def send(self, replica: _Replica, updates: Sequence[HoldUpdate]) -> None:
        if updates:
            batch = batched(updates)
            self.run(replica.store.update_holds(batch))
            self.run(replica.store.update_holds(batch))  # the reply was lost: sent again

    def keep_alive(self, replicas: list[_Replica]) -> None:
        """What each live gateway's refresh loop does: touch its entries (a quarter ttl apart)."""
        for replica in replicas:
            self.touch_clock += self.TTL_S
            self.send(replica, replica.book.touches(now=self.touch_clock))

    def advance(self, seconds: float) -> None:
        """``seconds`` pass for the book: every entry's expiry and both keys' ttls come that
        much closer (a key whose ttl runs out is gone, as Redis would drop it)."""
        step = round(seconds * 1000)
        with redis.Redis.from_url(self.url) as client:
            expiry = expiry_key(self.key)
            deadlines = client.zrange(expiry, 0, -1, withscores=True)
            if deadlines:
                client.zadd(expiry, {member: score - step for member, score in deadlines})
            for key in (self.key, expiry):
                left = client.pttl(key)
                if left > step:
                    client.pexpire(key, left - step)
                elif left >= 0:
                    client.delete(key)

    def outlive_the_ttl(self, survivors: list[_Replica]) -> None:
        """A little more than ``TTL_S`` passes while the ``survivors`` keep touching their
        entries (a fifth of the ttl apart): only entries nobody touched expire."""
        for _ in range(6):
            self.keep_alive(survivors)
            self.advance(self.TTL_S / 5)
        self.keep_alive(survivors)

    def teardown(self) -> None:
        try:
            if self.replicas:
                self.settle_everything()
        finally:
            self.close()

    def settle_everything(self) -> None:
        """Every request in flight settles and reaches the rollups; with no admission since,
        every refresh gives the slack back: no entry may hold anything."""
        for side, replica in enumerate(self.replicas):
            for request in list(replica.in_flight):
                self.settle(request, used=10)
            self.commit_and_refresh(side)
            self.clock += 10.0
            self.refresh_all(self.clock)
        if self.crashed:  # theirs expire; the next admission purges them
            self.outlive_the_ttl(self.replicas)
            self.purge(self.replicas[0])
        assert set(entries(self.url, self.key).values()) <= {0}
        assert held(self.url, self.key) == 0
        assert [r.book.own() for r in self.replicas] == [0, 0]

    def close(self) -> None:
        for replica in [*self.replicas, *self.crashed]:
            self.run(replica.store.aclose())
        self.loop.close()
        with redis.Redis.from_url(self.url) as client:
            for key in client.scan_iter(f"{self.prefix}*"):
                client.delete(key)

    @rule(target=requests, side=st.integers(0, 1), amount=st.integers(0, 600))
    def reserve(self, side: int, amount: int) -> str:
        self.keep_alive(self.replicas)
        replica = self.replicas[side]
        before = sum(entries(self.url, self.key).values())
        hold, asks = replica.book.hold([self.rule], Amounts(tokens_output=amount))
        request_id = f"r{next(self.ids)}"
        if not asks:  # the slack covered it
            replica.in_flight[request_id] = hold
            return request_id
        decision = self.run(replica.store.reserve([], asks))
        if decision.admitted:
            assert replica.book.placed(hold)
            replica.in_flight[request_id] = hold
        else:
            assert decision.excess == self.rolled + before + asks[0].need - self.limit > 0
            self.send(replica, replica.book.release(hold))
        return request_id

    @rule(request=consumes(requests), used=st.integers(0, 700))
    def settle(self, request: str, used: int) -> None:
        self.keep_alive(self.replicas)
        for replica in self.replicas:
            hold = replica.in_flight.pop(request, None)
            if hold is not None:
                updates = replica.book.settle(hold, Amounts(tokens_output=used), request_id=request)
                self.overrun += max(0, used - hold.demand.tokens_output)
                self.send(replica, updates)
                replica.settled.append(request)
                replica.used[request] = used

    @rule(side=st.integers(0, 1))
    def commit_and_refresh(self, side: int) -> None:
        """The ledger commits everything settled here and the rollups show it at once; every
        replica refreshes within the grace (their use stays in the entry: counted twice for a
        moment), then past it (it leaves the entry: the rollups alone count it)."""
        self.keep_alive(self.replicas)
        replica = self.replicas[side]
        self.clock += 10.0
        replica.book.committed(replica.settled, at=self.clock)
        self.rolled += sum(replica.used.pop(r) for r in replica.settled)
        unrolled = replica.book.allowance(self.rule)[2]
        self.refresh_all(self.clock + 1.0)
        assert replica.book.allowance(self.rule)[2] == unrolled
        self.refresh_all(self.clock + 3.0)
        assert replica.book.allowance(self.rule)[2] == sum(replica.used.values())
        replica.settled.clear()
        self.clock += 3.0

    def refresh_all(self, started_at: float) -> None:
        for replica in self.replicas:
            used = {self.rule.id: self.rolled}
            self.send(replica, replica.book.refreshed(used, started_at=started_at))

    @rule(side=st.integers(0, 1))
    def crash_and_restart(self, side: int) -> None:
        """A replica dies with its entry; a new one takes its place; the entry expires."""
        dead = self.replicas[side]
        self.crashed.append(dead)
        self.replicas[side] = self._replica()
        self.outlive_the_ttl(self.replicas)  # the survivors keep touching theirs meanwhile
        self.purge(self.replicas[side])
        assert not {c.book.owner for c in self.crashed} & set(entries(self.url, self.key))

    def purge(self, replica: _Replica) -> None:
        """An ask of nothing, which drops the expired entries before it judges."""
        probe = Hold(self.key, "probe", f"probe{next(self.ids)}", 0, 0, self.limit, 0, 0, 1000)
        assert self.run(replica.store.reserve([], [probe])).admitted
        assert probe.granted == 0

    @invariant()
    def redis_holds_what_the_live_replicas_mean(self) -> None:
        if not self.replicas:
            return
        found = entries(self.url, self.key)
        counted = 0
        for replica in self.replicas:
            allowance, in_flight, unrolled = replica.book.allowance(self.rule)
            assert found.get(replica.book.owner, 0) == allowance
            assert allowance >= in_flight + unrolled
            counted += in_flight + unrolled
        assert held(self.url, self.key) == sum(found.values())
        assert self.rolled + counted <= self.limit + self.overrun


def test_allowances_state_machine_on_two_replicas(redis_url: str) -> None:
    HoldsMachine.url = redis_url
    run_state_machine_as_test(
        HoldsMachine,
        settings=settings(
            max_examples=15,
            stateful_step_count=15,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
