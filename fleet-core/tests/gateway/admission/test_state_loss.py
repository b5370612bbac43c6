"""A Redis that restarts empty has lost every bucket and every budget allowance: the gateway
sees that (the hash tag's state epoch is gone, ADR 0023) and neither admits again what it
admitted before the loss nor waits out stale connections to the old server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from fleet_core.gateway.admission.allowances import book_key
from fleet_core.gateway.admission.budget_book import Amounts, BudgetBook
from fleet_core.gateway.admission.limits import Bucket, Charge, HoldUpdate, StoreUnavailable
from fleet_core.gateway.admission.store import RedisStore, epoch_key, open_redis_store
from fleet_testing.fix_redis_process import RedisProcess

from .conftest import BucketFactory
from .test_budgets import RULE


@pytest.fixture
async def own_store(own_redis: RedisProcess) -> AsyncIterator[RedisStore]:
    store = await open_redis_store(own_redis.url)
    try:
        yield store
    finally:
        await store.aclose()


async def _restart_empty(redis: RedisProcess) -> None:
    """Stop the server and start it again, empty; then let the loop see the old sockets close
    (``start`` blocks it), as a gateway's running loop does at once."""
    redis.stop()
    redis.start()
    await asyncio.sleep(0.1)


async def _admitted(store: RedisStore, *charges: Charge) -> int:
    return sum([(await store.reserve(list(charges))).admitted for _ in range(4)])


async def test_a_restart_empty_does_not_refill_a_drained_bucket(
    own_redis: RedisProcess, own_store: RedisStore, make_bucket: BucketFactory
) -> None:
    """rpm 2: two admitted, then refused; it used to admit two more right after a restart."""
    lost: list[str] = []
    own_store.on_lost(lambda: lost.append("lost"))
    rpm = Charge(make_bucket("rpm", 2), 1)
    assert await _admitted(own_store, rpm) == 2
    await _restart_empty(own_redis)
    assert await _admitted(own_store, rpm) == 0  # refills at 2/60 per second from the restart
    assert lost == ["lost"]  # once, on the first call that met the new epoch
    refused = await own_store.reserve([rpm])
    assert 25 < refused.retry_after <= 30  # one unit at 1/30 per second, from the restart


async def test_a_tokens_bucket_keeps_its_limit_across_a_restart(
    own_redis: RedisProcess, own_store: RedisStore, make_bucket: BucketFactory
) -> None:
    """tpm 1000: what passes in the minute around a restart is the limit plus the refill."""
    tpm = make_bucket("tpm", 1_000)
    served = 0
    for _ in range(3):
        served += 400 * (await own_store.reserve([Charge(tpm, 400)])).admitted
    await _restart_empty(own_redis)
    for _ in range(3):
        served += 400 * (await own_store.reserve([Charge(tpm, 400)])).admitted
    assert served == 800  # two of the first three; none after (it used to be 1,600)


async def test_a_gateway_that_starts_on_an_empty_redis_sees_no_loss(
    own_store: RedisStore, make_bucket: BucketFactory
) -> None:
    lost: list[str] = []
    own_store.on_lost(lambda: lost.append("lost"))
    assert await _admitted(own_store, Charge(make_bucket("rpm", 2), 1)) == 2  # full at first
    assert lost == []


async def test_a_second_gateway_learns_of_the_loss_another_found_first(
    own_redis: RedisProcess, own_store: RedisStore, make_bucket: BucketFactory
) -> None:
    """The first call after the restart came from a gateway that had never seen the tag: the
    epoch it made is marked lost by the next gateway that knew the old one."""
    rpm = Charge(make_bucket("rpm", 2), 1)
    assert await _admitted(own_store, rpm) == 2
    await _restart_empty(own_redis)
    newcomer = await open_redis_store(own_redis.url)
    try:
        assert (await newcomer.reserve([Charge(make_bucket("other", 2), 1)])).admitted
    finally:
        await newcomer.aclose()
    assert await _admitted(own_store, rpm) == 0


async def test_stale_connections_are_dropped_at_the_first_failure_and_not_answered(
    own_redis: RedisProcess, own_store: RedisStore, make_bucket: BucketFactory
) -> None:
    """Eight pooled connections to a server that is gone: the first call drops them all and
    goes again on a new one (each stale socket used to fail a request of its own, for 20 s)."""
    charge = Charge(make_bucket("tpm", 10**9), 1)
    await asyncio.gather(*(own_store.reserve([charge]) for _ in range(8)))
    await _restart_empty(own_redis)
    failures = 0
    for _ in range(8):
        try:
            await own_store.reserve([charge])
        except StoreUnavailable:
            failures += 1
    assert failures == 0


async def test_the_epoch_shares_the_tags_slot_and_never_expires(
    own_redis: RedisProcess, own_store: RedisStore, make_bucket: BucketFactory
) -> None:
    bucket = make_bucket("rpm", 2)
    await own_store.reserve([Charge(bucket, 1)])
    client = Redis.from_url(own_redis.url)
    try:
        assert await client.ttl(epoch_key(bucket.key)) == -1
        assert await client.hget(epoch_key(bucket.key), "lost") == b"0"
    finally:
        await client.aclose()


async def test_a_gateway_writes_its_allowances_again_as_soon_as_it_sees_the_loss(
    own_redis: RedisProcess, own_store: RedisStore
) -> None:
    """A budget book's entries went with the restart: without them every other gateway would
    judge against a sum of nothing until this one's next touch (a 1,000-token rule served
    1,640). The gateway that sees the loss writes each of its entries again at once."""
    book = BudgetBook(ttl_s=60.0)
    book.refreshed({}, started_at=0.0)
    own_store.on_lost(lambda: rebuilt.extend(book.touches(everything=True)))
    rebuilt: list[HoldUpdate] = []
    hold, asks = book.hold([RULE], Amounts(tokens_output=30))
    assert (await own_store.reserve([Charge(make_tpm(), 30)], asks)).admitted
    assert book.placed(hold)
    held = await _book_sum(own_redis)
    assert held is not None
    assert held >= 30
    await _restart_empty(own_redis)
    await own_store.reserve([Charge(make_tpm(), 1)])  # any call under the tag sees the loss
    assert await _book_sum(own_redis) is None
    await own_store.update_holds(rebuilt)
    assert await _book_sum(own_redis) == held


async def _book_sum(redis: RedisProcess) -> int | None:
    client = Redis.from_url(redis.url)
    try:
        found = await client.hget(book_key(RULE), "sum")
    finally:
        await client.aclose()
    return None if found is None else int(found)


def make_tpm() -> Bucket:
    """A bucket under the rule's tenant tag (``acme``)."""
    return Bucket("fleet:rl:{acme}:tpm", "tenant", "tpm", 10**6)
