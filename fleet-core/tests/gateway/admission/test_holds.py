"""Budget allowances in Redis, shared by every gateway: one entry per gateway per rule, refused
across replicas, exact under concurrency, applied once when sent again, and expiring when their
gateway is gone (`test_holds_machine.py` runs their whole life as a stateful property test,
`test_hold_faults.py` meets a dead Redis).

Each "replica" is a `BudgetBook` with its own `RedisStore` (its own client and connections) on
one real Redis, as two gateway processes would be.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest
import redis

from fleet_core.gateway.admission.allowances import book_key
from fleet_core.gateway.admission.batching_store import BatchingStore
from fleet_core.gateway.admission.budget_book import Amounts, BudgetBook
from fleet_core.gateway.admission.limits import Bucket, Charge, HoldUpdate
from fleet_core.gateway.admission.store import RedisStore, expiry_key, open_redis_store

from .conftest import TEST_TIMEOUT_S
from .redis_books import LIMIT, admit, batched, entries, held, rule_for


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
