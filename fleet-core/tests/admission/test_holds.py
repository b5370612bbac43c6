"""Budget holds in Redis, shared by every gateway: refused across replicas, expiring when their
gateway is gone, and a stateful property test of the whole life of a hold on two replicas.

Each "replica" is a `BudgetBook` with its own `RedisStore` (its own client and connections) on
one real Redis, as two gateway processes would be.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    rule,
    run_state_machine_as_test,
)

from fleet_core.admission.budgets import Amounts, BudgetBook, BudgetHold, book_key
from fleet_core.admission.directory import BudgetRule
from fleet_core.admission.limits import Bucket, Charge, HoldUpdate
from fleet_core.admission.store import RedisStore, expiry_key, open_redis_store

from .conftest import TEST_TIMEOUT_S

T = TypeVar("T")
LIMIT = 1000


def rule_for(prefix: str, limit: int = LIMIT) -> BudgetRule:
    # the rule id carries the prefix: book keys are namespaced by the store's own prefix too
    return BudgetRule(f"rule_{prefix.strip(':')}", "tenant", "acme", "tokens_total", limit, 3600)


def held(url: str, key: str) -> int:
    with redis.Redis.from_url(url) as client:
        return int(client.hget(key, "sum") or 0)


def entries(url: str, key: str) -> dict[str, int]:
    with redis.Redis.from_url(url) as client:
        raw = client.hgetall(key)
    return {k.decode(): int(v) for k, v in raw.items() if k != b"sum"}


@pytest.fixture
async def two(redis_url: str) -> AsyncIterator[tuple[RedisStore, RedisStore]]:
    a = await open_redis_store(redis_url, timeout_s=TEST_TIMEOUT_S)
    b = await open_redis_store(redis_url, timeout_s=TEST_TIMEOUT_S)
    try:
        yield a, b
    finally:
        await a.aclose()
        await b.aclose()


async def test_holds_on_one_gateway_refuse_on_another(
    two: tuple[RedisStore, RedisStore], redis_prefix: str, redis_url: str
) -> None:
    """The issue's case: a 1,000-token rule, three 400-token requests on A, three on B."""
    a, b = two
    rule = rule_for(redis_prefix)
    books = BudgetBook(prefix=redis_prefix), BudgetBook(prefix=redis_prefix)
    for book in books:
        book.refreshed({}, started_at=0.0)
    demand = Amounts(tokens_input=1, tokens_output=400)
    admitted = []
    for store, book in ((a, books[0]),) * 3 + ((b, books[1]),) * 3:
        hold, asks = book.hold([rule], demand)
        decision = await store.reserve([], asks)
        if decision.admitted:
            admitted.append(hold)
        else:
            await store.update_holds(book.release(hold))
    assert len(admitted) == 2  # 802 of 1,000: a third would pass the limit on any gateway
    assert held(redis_url, book_key(rule, prefix=redis_prefix)) == 802


async def test_a_refused_reservation_places_no_hold_and_takes_no_bucket(
    two: tuple[RedisStore, RedisStore], redis_prefix: str, redis_url: str
) -> None:
    a, _ = two
    rule = rule_for(redis_prefix, limit=100)
    book = BudgetBook(prefix=redis_prefix)
    book.refreshed({rule.id: 60}, started_at=0.0)  # the rollups already count 60
    bucket = Bucket(f"{redis_prefix}fleet:rl:{{acme}}:tenant:rpm", "tenant", "rpm", 1)
    _, too_much = book.hold([rule], Amounts(tokens_output=41))
    decision = await a.reserve([Charge(bucket, 1)], too_much)
    assert (decision.admitted, decision.refused_hold, decision.excess) == (False, 0, 1)
    assert held(redis_url, book_key(rule, prefix=redis_prefix)) == 0
    _, fits = book.hold([rule], Amounts(tokens_output=40))
    assert (await a.reserve([Charge(bucket, 1)], fits)).admitted  # the rpm unit was not taken
    # The bucket refuses next: the hold it came with must not be placed either.
    _, third = book.hold([rule], Amounts(tokens_output=0))
    assert (await a.reserve([Charge(bucket, 1)], third)).refused_by == bucket
    assert len(entries(redis_url, book_key(rule, prefix=redis_prefix))) == 1


async def test_a_crashed_gateways_holds_expire(
    two: tuple[RedisStore, RedisStore], redis_prefix: str, redis_url: str
) -> None:
    a, b = two
    rule = rule_for(redis_prefix)
    crashed = BudgetBook(prefix=redis_prefix, ttl_s=0.3)
    crashed.refreshed({}, started_at=0.0)
    _, asks = crashed.hold([rule], Amounts(tokens_output=900))
    assert (await a.reserve([], asks)).admitted
    other = BudgetBook(prefix=redis_prefix, ttl_s=0.3)
    other.refreshed({}, started_at=0.0)
    _, mine = other.hold([rule], Amounts(tokens_output=900))
    assert not (await b.reserve([], mine)).admitted
    await asyncio.sleep(0.4)  # nobody touches the crashed gateway's hold
    assert (await b.reserve([], mine)).admitted
    assert held(redis_url, book_key(rule, prefix=redis_prefix)) == 900
    with redis.Redis.from_url(redis_url) as client:
        key = book_key(rule, prefix=redis_prefix)
        assert 0 < client.pttl(key) <= 300
        assert 0 < client.pttl(expiry_key(key)) <= 300


async def test_thousands_of_holds_in_one_call_are_put_and_dropped_exactly(
    two: tuple[RedisStore, RedisStore], redis_prefix: str, redis_url: str
) -> None:
    """A book's holds are put and dropped a chunk of ids per command (Lua's unpack has a
    limit): calls of more holds than a chunk leave every entry, expiry and the sum exact."""
    a, _ = two
    key = book_key(rule_for(redis_prefix), prefix=redis_prefix)
    await a.update_holds([HoldUpdate(key, f"h{n}", n % 7, 60_000) for n in range(2_500)])
    assert entries(redis_url, key) == {f"h{n}": n % 7 for n in range(2_500)}
    assert held(redis_url, key) == sum(n % 7 for n in range(2_500))
    await a.update_holds([HoldUpdate(key, f"h{n}", None) for n in range(0, 2_500, 2)])
    assert entries(redis_url, key) == {f"h{n}": n % 7 for n in range(1, 2_500, 2)}
    assert held(redis_url, key) == sum(n % 7 for n in range(1, 2_500, 2))
    with redis.Redis.from_url(redis_url) as client:
        assert client.zcard(expiry_key(key)) == 1_250


async def test_an_id_updated_twice_in_one_call_ends_as_its_last_update(
    two: tuple[RedisStore, RedisStore], redis_prefix: str, redis_url: str
) -> None:
    a, _ = two
    key = book_key(rule_for(redis_prefix), prefix=redis_prefix)
    await a.update_holds([HoldUpdate(key, "kept", 40, 60_000), HoldUpdate(key, "gone", 9, 60_000)])
    await a.update_holds(
        [
            HoldUpdate(key, "kept", 5, 60_000),
            HoldUpdate(key, "gone", 7, 60_000),
            HoldUpdate(key, "kept", None),
            HoldUpdate(key, "kept", 3, 60_000),
            HoldUpdate(key, "gone", None),
            HoldUpdate(key, "new", 11, 60_000),
            HoldUpdate(key, "new", 12, 60_000),
        ]
    )
    assert entries(redis_url, key) == {"kept": 3, "new": 12}
    assert held(redis_url, key) == 15
    with redis.Redis.from_url(redis_url) as client:
        assert client.zcard(expiry_key(key)) == 2


class _Replica:
    def __init__(self, store: RedisStore, book: BudgetBook) -> None:
        self.store = store
        self.book = book
        self.in_flight: dict[str, BudgetHold] = {}
        self.settled: dict[str, tuple[str, int, int]] = {}
        """request id -> (hold id, amount in the store, amount used): a hold settled under its
        reservation keeps the reservation in the store until the next touch writes its use."""

    def hold_ids(self) -> set[str]:
        return {h.id for h in self.in_flight.values()} | {i for i, _, _ in self.settled.values()}

    def touched(self) -> None:
        """A touch rewrote every hold (each was last written a quarter ttl ago or more)."""
        self.settled = {r: (i, used, used) for r, (i, _, used) in self.settled.items()}


class HoldsMachine(RuleBasedStateMachine):
    """Two replicas reserve, settle, commit, refresh, touch and crash, on one real Redis.

    After every step the rule's book in Redis holds exactly what the live replicas track, entry
    by entry (in flight: the demand; settled and not yet in every rollup: what was used, or the
    demand if that was more, until a touch writes what was used), and its
    sum is the sum of its entries; a crashed replica's holds are gone once they expired.

    Time is driven, not waited for: the holds live ``TTL_S`` (long: no step of a run on a loaded
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
        self.rule = rule_for(self.prefix)
        self.key = book_key(self.rule, prefix=self.prefix)
        self.replicas = [self._replica(), self._replica()]
        self.crashed: list[_Replica] = []
        self.ids = itertools.count()
        self.clock = 0.0
        self.touch_clock = 1e9

    def _replica(self) -> _Replica:
        store = self.run(open_redis_store(self.url, timeout_s=TEST_TIMEOUT_S))
        book = BudgetBook(prefix=self.prefix, ttl_s=self.TTL_S, grace_s=2.0)
        book.refreshed({}, started_at=0.0)
        return _Replica(store, book)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def keep_alive(self, replicas: list[_Replica]) -> None:
        """What each live gateway's refresh loop does: touch its holds (a quarter ttl apart)."""
        for replica in replicas:
            self.touch_clock += self.TTL_S
            self.run(replica.store.update_holds(replica.book.touches(now=self.touch_clock)))
            replica.touched()

    def advance(self, seconds: float) -> None:
        """``seconds`` pass for the book: every hold's expiry and both keys' ttls come that much
        closer (a key whose ttl runs out is gone, as Redis would drop it)."""
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
        """A little more than ``TTL_S`` passes while the ``survivors`` keep touching their holds
        (a fifth of the ttl apart): only holds nobody touched expire. No touch comes last, so
        the next admission would purge a survivor's hold that a touch had failed to keep."""
        for _ in range(6):
            self.keep_alive(survivors)
            self.advance(self.TTL_S / 5)

    def teardown(self) -> None:
        try:
            self.settle_everything()
        finally:
            self.close()

    def settle_everything(self) -> None:
        """Every request in flight settles and reaches the rollups: no hold may be left."""
        for side, replica in enumerate(self.replicas):
            for request in list(replica.in_flight):
                self.settle(request, used=10)
            self.commit_and_refresh(side)
        if self.crashed:  # theirs expire; the next admission purges them
            self.outlive_the_ttl(self.replicas)
            self.purge(self.replicas[0])
        assert entries(self.url, self.key) == {}
        assert held(self.url, self.key) == 0
        assert [r.book.own() for r in self.replicas] == [0, 0]

    def close(self) -> None:
        for replica in [*self.replicas, *self.crashed]:
            self.run(replica.store.aclose())
        self.loop.close()
        with redis.Redis.from_url(self.url) as client:
            client.delete(self.key, expiry_key(self.key))

    @rule(target=requests, side=st.integers(0, 1), amount=st.integers(0, 600))
    def reserve(self, side: int, amount: int) -> str:
        self.keep_alive(self.replicas)
        replica = self.replicas[side]
        hold, asks = replica.book.hold([self.rule], Amounts(tokens_output=amount))
        decision = self.run(replica.store.reserve([], asks))
        request_id = f"r{next(self.ids)}"
        if decision.admitted:
            replica.in_flight[request_id] = hold
        else:
            live = sum(entries(self.url, self.key).values())
            assert decision.excess == live + amount - LIMIT > 0
            self.run(replica.store.update_holds(replica.book.release(hold)))
        return request_id

    @rule(request=consumes(requests), used=st.integers(0, 700))
    def settle(self, request: str, used: int) -> None:
        self.keep_alive(self.replicas)
        for replica in self.replicas:
            hold = replica.in_flight.pop(request, None)
            if hold is not None:
                updates = replica.book.settle(hold, Amounts(tokens_output=used), request_id=request)
                self.run(replica.store.update_holds(updates))
                stored = max(used, hold.demand.tokens_output)  # only a growth is written now
                replica.settled[request] = (hold.id, stored, used)

    @rule(side=st.integers(0, 1))
    def commit_and_refresh(self, side: int) -> None:
        """The ledger commits everything settled here; a refresh within the grace keeps the
        holds, one past it drops them."""
        self.keep_alive(self.replicas)
        replica = self.replicas[side]
        self.clock += 10.0
        replica.book.committed(list(replica.settled), at=self.clock)
        assert replica.book.refreshed({}, started_at=self.clock + 1.0) == []
        updates = replica.book.refreshed({}, started_at=self.clock + 3.0)
        assert len(updates) == len(replica.settled)
        self.run(replica.store.update_holds(updates))
        replica.settled.clear()

    @rule(side=st.integers(0, 1))
    def crash_and_restart(self, side: int) -> None:
        """A replica dies with its holds; a new one takes its place; the holds expire."""
        self.crashed.append(self.replicas[side])
        self.replicas[side] = self._replica()
        self.outlive_the_ttl(self.replicas)  # the survivors keep touching theirs meanwhile
        self.purge(self.replicas[side])
        dead = set().union(*(c.hold_ids() for c in self.crashed))
        assert not dead & set(entries(self.url, self.key))

    def tracked(self) -> dict[str, int]:
        """Hold id -> amount, for every hold the live replicas track (in flight: the demand;
        settled and not yet in every rollup: what was used, or the reservation until touched)."""
        expected: dict[str, int] = {}
        for replica in self.replicas:
            for hold in replica.in_flight.values():
                expected[hold.id] = hold.demand.tokens_output
            for hold_id, stored, _ in replica.settled.values():
                expected[hold_id] = stored
        return expected

    def purge(self, replica: _Replica) -> None:
        """An admission of nothing, which drops the expired holds before it judges: refused only
        when the live holds alone pass the limit (settled use may)."""
        probe, asks = replica.book.hold([self.rule], Amounts())
        decision = self.run(replica.store.reserve([], asks))
        live = sum(self.tracked().values())
        assert (decision.admitted, decision.excess) == (
            (True, 0) if live <= LIMIT else (False, live - LIMIT)
        )
        self.run(replica.store.update_holds(replica.book.release(probe)))

    @invariant()
    def redis_holds_what_the_live_replicas_track(self) -> None:
        expected = self.tracked()
        found = entries(self.url, self.key)
        assert found == expected
        assert held(self.url, self.key) == sum(expected.values())


def test_holds_state_machine_on_two_replicas(redis_url: str) -> None:
    HoldsMachine.url = redis_url
    run_state_machine_as_test(
        HoldsMachine,
        settings=settings(
            max_examples=10,
            stateful_step_count=15,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
