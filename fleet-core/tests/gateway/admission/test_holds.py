"""Budget allowances in Redis, shared by every gateway: one entry per gateway per rule, refused
across replicas, exact under concurrency, applied once when sent again, expiring when their
gateway is gone, and a stateful property test of their whole life on two replicas.

Each "replica" is a `BudgetBook` with its own `RedisStore` (its own client and connections) on
one real Redis, as two gateway processes would be.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator, Coroutine, Sequence
from typing import Any, TypeVar

import msgspec
import pytest
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
from fleet_core.gateway.admission.batching_store import BatchingStore
from fleet_core.gateway.admission.budget_book import Amounts, BudgetBook, BudgetHold
from fleet_core.gateway.admission.directory import BudgetRule, StaticDirectory
from fleet_core.gateway.admission.key_ring import ANONYMOUS, Principal
from fleet_core.gateway.admission.limits import (
    Bucket,
    Charge,
    Decision,
    Hold,
    HoldUpdate,
    LimitStore,
)
from fleet_core.gateway.admission.rate_policy import Limits, RatePolicy
from fleet_core.gateway.admission.service import Admission, OnStoreError
from fleet_core.gateway.admission.store import (
    RedisStore,
    expiry_key,
    open_redis_store,
)
from fleet_core.shared.errors import Unavailable
from fleet_testing import servers
from fleet_testing.fix_proxy import ProxyFactory, TcpProxy

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


def batched(updates: Sequence[HoldUpdate]) -> list[HoldUpdate]:
    """As `Admission` sends them: every update of one flush under one batch id."""
    batch = f"b{next(BATCHES)}"
    return [msgspec.structs.replace(u, batch=batch) for u in updates]


BATCHES = itertools.count()


async def admit(
    store: LimitStore, book: BudgetBook, rules: list[BudgetRule], demand: Amounts
) -> tuple[BudgetHold | None, Decision | None]:
    """What `Admission.admit` does with the book: reserve, ask the store only when the slack
    does not cover it, count the grants or give the reservation back."""
    hold, asks = book.hold(rules, demand)
    if not asks:
        return hold, None
    decision = await store.reserve([], asks)
    if decision.admitted:
        assert book.placed(hold)
        return hold, decision
    updates = book.release(hold)
    if updates:
        await store.update_holds(batched(updates))
    return None, decision


@pytest.fixture
async def two(redis_url: str) -> AsyncIterator[tuple[RedisStore, RedisStore]]:
    a = await open_redis_store(redis_url, timeout_s=TEST_TIMEOUT_S)
    b = await open_redis_store(redis_url, timeout_s=TEST_TIMEOUT_S)
    try:
        yield a, b
    finally:
        await a.aclose()
        await b.aclose()


async def test_requests_on_one_gateway_refuse_on_another(
    two: tuple[RedisStore, RedisStore], redis_prefix: str, redis_url: str
) -> None:
    """A 1,000-token rule, three 400-token requests on gateway A, three on gateway B: what one
    gateway holds counts on the other."""
    a, b = two
    rule = rule_for(redis_prefix)
    books = BudgetBook(prefix=redis_prefix), BudgetBook(prefix=redis_prefix)
    for book in books:
        book.refreshed({}, started_at=0.0)
    demand = Amounts(tokens_input=1, tokens_output=400)
    admitted = []
    for store, book in ((a, books[0]),) * 3 + ((b, books[1]),) * 3:
        hold, _ = await admit(store, book, [rule], demand)
        if hold is not None:
            admitted.append(hold)
    assert len(admitted) == 2  # 802 of 1,000: a third would pass the limit on any gateway
    key = book_key(rule, prefix=redis_prefix)
    assert entries(redis_url, key) == {books[0].owner: books[0].allowance(rule)[0]}
    assert 802 <= held(redis_url, key) <= LIMIT


async def test_one_entry_per_gateway_and_no_store_call_within_the_slack(
    two: tuple[RedisStore, RedisStore], redis_prefix: str, redis_url: str
) -> None:
    a, _ = two
    rule = rule_for(redis_prefix, limit=1_000_000)
    book = BudgetBook(prefix=redis_prefix)
    book.refreshed({}, started_at=0.0)
    asked = 0
    for _ in range(100):
        hold, asks = book.hold([rule], Amounts(tokens_output=10))
        if asks:
            asked += 1
            assert (await a.reserve([], asks)).admitted
            assert book.placed(hold)
    assert asked == 20  # a growth of 5 requests' worth (4 of slack) every fifth request
    assert entries(redis_url, book_key(rule, prefix=redis_prefix)) == {book.owner: 1000}


async def test_a_refused_reservation_grows_nothing_and_takes_no_bucket(
    two: tuple[RedisStore, RedisStore], redis_prefix: str, redis_url: str
) -> None:
    a, _ = two
    rule = rule_for(redis_prefix, limit=100)
    book = BudgetBook(prefix=redis_prefix)
    book.refreshed({rule.id: 50}, started_at=0.0)  # the rollups already count 50
    bucket = Bucket(f"{redis_prefix}fleet:rl:{{acme}}:tenant:rpm", "tenant", "rpm", 1)
    refused, too_much = book.hold([rule], Amounts(tokens_output=51))
    decision = await a.reserve([Charge(bucket, 1)], too_much)
    assert (decision.admitted, decision.refused_hold, decision.excess) == (False, 0, 1)
    assert too_much[0].granted == 0
    assert book.release(refused) == []
    assert held(redis_url, book_key(rule, prefix=redis_prefix)) == 0
    hold, fits = book.hold([rule], Amounts(tokens_output=40))
    assert (await a.reserve([Charge(bucket, 1)], fits)).admitted  # the rpm unit was not taken
    assert book.placed(hold)
    assert fits[0].granted == 40  # near the limit: no slack (10 // 16)
    # The bucket refuses next: the growth it came with must not be made either.
    third, asks = book.hold([rule], Amounts(tokens_output=1))
    assert (await a.reserve([Charge(bucket, 1)], asks)).refused_by == bucket
    assert asks[0].granted == 0
    book.release(third)
    assert entries(redis_url, book_key(rule, prefix=redis_prefix)) == {book.owner: 40}


async def test_a_crashed_gateways_allowance_expires(
    two: tuple[RedisStore, RedisStore], redis_prefix: str, redis_url: str
) -> None:
    a, b = two
    rule = rule_for(redis_prefix)
    crashed = BudgetBook(prefix=redis_prefix, ttl_s=0.3)
    crashed.refreshed({}, started_at=0.0)
    assert (await admit(a, crashed, [rule], Amounts(tokens_output=900)))[0] is not None
    # The live gateway's own TTL is long: a stall of the machine between its write and the
    # checks below cannot expire its entry (only the crashed one's 0.3 s is under test).
    other = BudgetBook(prefix=redis_prefix, ttl_s=30)
    other.refreshed({}, started_at=0.0)
    assert (await admit(b, other, [rule], Amounts(tokens_output=900)))[0] is None
    await asyncio.sleep(0.4)  # nobody touches the crashed gateway's entry
    assert (await admit(b, other, [rule], Amounts(tokens_output=900)))[0] is not None
    key = book_key(rule, prefix=redis_prefix)
    assert entries(redis_url, key) == {other.owner: 900 + 100 // 16}
    with redis.Redis.from_url(redis_url) as client:
        assert 300 < client.pttl(key) <= 30_000  # the live entry's TTL, not the crashed one's
        assert 300 < client.pttl(expiry_key(key)) <= 30_000


async def test_an_update_batch_sent_again_is_applied_once(
    two: tuple[RedisStore, RedisStore], redis_prefix: str, redis_url: str
) -> None:
    """A call whose reply was lost may have run: sent again under its batch id, it is skipped.
    The same holds for taking back a growth whose answer was lost, and for one given up before
    it arrived (refused when it comes)."""
    a, b = two
    rule = rule_for(redis_prefix, limit=1_000_000)
    key = book_key(rule, prefix=redis_prefix)
    book = BudgetBook(prefix=redis_prefix)
    book.refreshed({}, started_at=0.0)
    hold, _ = await admit(a, book, [rule], Amounts(tokens_output=100))
    assert hold is not None
    grown = book.settle(hold, Amounts(tokens_output=700), request_id="r1")  # an overrun
    batch = batched(grown)
    await a.update_holds(batch)
    await b.update_holds(batch)  # the retry, on another connection
    assert entries(redis_url, key) == {book.owner: 700} == {book.owner: book.allowance(rule)[0]}

    lost, asks = book.hold([rule], Amounts(tokens_output=50))  # the slack is spent: it asks
    assert (await a.reserve([], asks)).admitted
    for ask in asks:
        ask.granted = None  # its answer never came
    undo = batched(book.release(lost))
    await b.update_holds(undo)
    await a.update_holds(undo)
    await a.update_holds(batched(undo))  # even under a new batch id: the growth is gone already
    assert entries(redis_url, key) == {book.owner: 700} == {book.owner: book.allowance(rule)[0]}

    late, asks = book.hold([rule], Amounts(tokens_output=50))
    await b.update_holds(batched(book.release(late)))  # given up before the growth arrived
    assert not (await a.reserve([], asks)).admitted
    assert entries(redis_url, key) == {book.owner: 700}


async def test_a_book_of_entries_and_its_sum_stay_exact_under_many_owners(
    two: tuple[RedisStore, RedisStore], redis_prefix: str, redis_url: str
) -> None:
    a, _ = two
    key = book_key(rule_for(redis_prefix), prefix=redis_prefix)
    updates = [HoldUpdate(key, f"g{n}", n % 7, n % 7, 60_000) for n in range(2_500)]
    await a.update_holds(batched(updates))
    assert entries(redis_url, key) == {f"g{n}": n % 7 for n in range(2_500)}
    assert held(redis_url, key) == sum(n % 7 for n in range(2_500))
    shrink = [HoldUpdate(key, f"g{n}", -10, 0, 60_000) for n in range(0, 2_500, 2)]
    await a.update_holds(batched(shrink))  # never below 0
    expected = {f"g{n}": 0 if n % 2 == 0 else n % 7 for n in range(2_500)}
    assert entries(redis_url, key) == expected
    assert held(redis_url, key) == sum(expected.values())


async def test_two_gateways_admitting_concurrently_never_pass_the_limit(
    redis_url: str, redis_prefix: str
) -> None:
    """Hundreds of requests at once on two gateways (batched admit calls, settlements and
    entry updates on many pooled connections): what is counted against the rule — reserved by
    requests in flight, used by settled ones (nothing reaches the rollups here) — never passes
    the limit, and at the end every entry is exactly what its gateway means it to be."""
    limit = 5_000
    rule = rule_for(redis_prefix, limit=limit)
    key = book_key(rule, prefix=redis_prefix)
    rng = random.Random(21)
    counted = 0
    stores = [
        BatchingStore(await open_redis_store(redis_url, timeout_s=TEST_TIMEOUT_S)) for _ in range(2)
    ]
    books = [BudgetBook(prefix=redis_prefix), BudgetBook(prefix=redis_prefix)]
    for book in books:
        book.refreshed({}, started_at=0.0)

    async def one(n: int) -> None:
        nonlocal counted
        side = n % 2
        demand = rng.randint(1, 200)
        await asyncio.sleep(rng.random() * 0.05)
        hold, _ = await admit(stores[side], books[side], [rule], Amounts(tokens_output=demand))
        if hold is None:
            return
        counted += demand
        assert counted <= limit
        await asyncio.sleep(rng.random() * 0.05)
        used = rng.randint(0, demand)
        counted -= demand - used
        updates = books[side].settle(hold, Amounts(tokens_output=used), request_id=f"r{n}")
        if updates:
            await stores[side].update_holds(batched(updates))

    try:
        await asyncio.gather(*(one(n) for n in range(400)))
        found = entries(redis_url, key)
        assert found == {b.owner: b.allowance(rule)[0] for b in books if b.owner in found}
        assert counted <= held(redis_url, key) <= limit
    finally:
        for store in stores:
            await store.aclose()


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


class _Ruled(StaticDirectory):
    """Environment mode's directory with one budget rule for everyone."""

    def __init__(self, rule: BudgetRule) -> None:
        super().__init__(keys=None, policy=RatePolicy(default=Limits(tpm=1_000_000)))
        self.rule = rule

    def rules(self, principal: Principal) -> Sequence[BudgetRule]:
        return (self.rule,)

    @property
    def has_rules(self) -> bool:
        return True


class _Errors:
    def __init__(self) -> None:
        self.store_errors = 0

    def refused(self, **_: str) -> None: ...

    def store_error(self) -> None:
        self.store_errors += 1

    def settlement_dropped(self) -> None: ...


async def _admission(
    redis_url: str, redis_prefix: str, tcp_proxy: ProxyFactory, on_store_error: OnStoreError
) -> tuple[Admission, BudgetBook, TcpProxy, _Errors, BudgetRule, BatchingStore]:
    target = servers.address_of(redis_url)
    proxy = tcp_proxy(target.host, target.port)
    store = BatchingStore(await open_redis_store(proxy.url_for(redis_url), timeout_s=1.0))
    rule = BudgetRule(
        f"rule_{redis_prefix.strip(':')}", "tenant", "anonymous", "tokens_total", 100_000, 3600
    )
    book = BudgetBook(prefix=redis_prefix)
    book.refreshed({rule.id: 0}, started_at=0.0)
    errors = _Errors()
    admission = Admission(
        directory=_Ruled(rule),
        store=store,
        metrics=errors,
        budgets=book,
        prefix=redis_prefix,
        on_store_error=on_store_error,
    )
    return admission, book, proxy, errors, rule, store


async def _until(check: Any, within_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)


async def test_an_entry_update_that_met_a_dead_redis_lands_once_it_is_back(
    redis_url: str, redis_prefix: str, tcp_proxy: ProxyFactory
) -> None:
    """An overrun's growth is kept when the store fails and sent again, under its batch id,
    with the next touch; once Redis is back the entry is exactly what the gateway means."""
    admission, book, proxy, errors, rule, store = await _admission(
        redis_url, redis_prefix, tcp_proxy, "closed"
    )
    key = book_key(rule, prefix=redis_prefix)
    try:
        reservation = await admission.admit(ANONYMOUS, Amounts(tokens_output=100))
        assert entries(redis_url, key) == {book.owner: 500}  # 100 and 4 requests' slack
        await asyncio.to_thread(proxy.cut)
        admission.settle(reservation, Amounts(tokens_output=5_000), request_id="r1")
        await _until(lambda: errors.store_errors > 0)
        assert entries(redis_url, key) == {book.owner: 500}
        await asyncio.to_thread(proxy.resume)
        admission.keep_holds()  # what the refresh loop calls every interval
        await _until(lambda: entries(redis_url, key) == {book.owner: 5_000})
        admission.keep_holds()
        await asyncio.sleep(0.1)  # nothing further lands
        assert entries(redis_url, key) == {book.owner: 5_000}
        assert book.allowance(rule) == (5_000, 0, 5_000)
    finally:
        await admission.drain()
        await store.aclose()


@pytest.mark.parametrize("on_store_error", ["open", "closed"])
async def test_a_growth_that_met_a_dead_redis_is_given_back_as_configured(
    redis_url: str, redis_prefix: str, tcp_proxy: ProxyFactory, on_store_error: OnStoreError
) -> None:
    """Closed: refused (503), nothing counted. Open: admitted without a budget reservation
    (counted as unheld use once settled). Either way the growth, which may or may not have
    been made, is taken back once Redis answers again."""
    admission, book, proxy, errors, rule, store = await _admission(
        redis_url, redis_prefix, tcp_proxy, on_store_error
    )
    key = book_key(rule, prefix=redis_prefix)
    try:
        await asyncio.to_thread(proxy.cut)
        if on_store_error == "closed":
            with pytest.raises(Unavailable):
                await admission.admit(ANONYMOUS, Amounts(tokens_output=100))
        else:
            reservation = await admission.admit(ANONYMOUS, Amounts(tokens_output=100))
            assert reservation.hold is None
        assert book.allowance(rule) == (0, 0, 0)
        assert book.own() == 0
        await _until(lambda: errors.store_errors >= 2)  # the undo failed too: kept
        assert admission._settlements._unsent_holds
        await asyncio.to_thread(proxy.resume)
        admission.keep_holds()
        await _until(lambda: not admission._settlements._unsent_holds)
        assert entries(redis_url, key) in ({}, {book.owner: 0})
        reservation = await admission.admit(ANONYMOUS, Amounts(tokens_output=100))
        assert reservation.hold is not None
        assert entries(redis_url, key) == {book.owner: book.allowance(rule)[0]}
    finally:
        await admission.drain()
        await store.aclose()
