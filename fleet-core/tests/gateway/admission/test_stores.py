"""Both limit stores keep the same promises (P5): all-or-nothing reservations, signed settlements.

The first group runs against each store (`store` fixture) on real clocks, with buckets whose refill
during a test is small next to the tolerances. Then: exact arithmetic on a `MemoryStore` with a
fake clock; and for `RedisStore`, exactness under concurrency from two clients, one script call per
operation, what it leaves in Redis, and its behaviour when Redis stops or freezes.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.resources
import math
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from redis.crc import key_slot
from redis.exceptions import RedisError

from fleet_core.gateway.admission.limits import Bucket, Charge, LimitStore, StoreUnavailable
from fleet_core.gateway.admission.memory_store import MemoryStore
from fleet_core.gateway.admission.store import (
    SETTLED_TTL_S,
    RedisStore,
    epoch_key,
    open_redis_store,
    script_source,
    settled_key,
)
from fleet_testing.fix_redis_process import RedisProcess

from .conftest import TEST_TIMEOUT_S, BucketFactory, FakeClock

TOLERANCE_S = 0.25
"""Real time a test may take between two calls; buckets of 60/min refill 1 unit per second."""
FAIL_FAST_S = 2.0


async def take(store: LimitStore, *charges: tuple[Bucket, int]) -> bool:
    return (await store.reserve([Charge(bucket, amount) for bucket, amount in charges])).admitted


def near(actual: float, expected: float) -> bool:
    """A wait measured after some real time has passed: at most ``expected``, not much less."""
    return expected - TOLERANCE_S < actual <= expected


# Both stores, real time.


async def test_an_empty_request_is_admitted(store: LimitStore) -> None:
    assert (await store.reserve([])).admitted
    await store.settle([])


async def test_a_full_bucket_admits_up_to_capacity_then_refuses(
    store: LimitStore, make_bucket: BucketFactory
) -> None:
    bucket = make_bucket("a", 60)
    admitted = [await take(store, (bucket, 1)) for _ in range(60)]
    decision = await store.reserve([Charge(bucket, 5)])
    assert all(admitted)
    assert not decision.admitted
    assert decision.refused_by == bucket
    assert near(decision.retry_after, 5.0)


async def test_a_refused_request_charges_no_bucket(
    store: LimitStore, make_bucket: BucketFactory
) -> None:
    fits, full = make_bucket("fits", 60), make_bucket("full", 60)
    assert await take(store, (full, 50))
    decision = await store.reserve([Charge(fits, 20), Charge(full, 20)])
    assert (decision.admitted, decision.refused_by) == (False, full)
    assert await take(store, (fits, 60))  # still full: the refusal took nothing from it


async def test_refused_by_is_the_bucket_with_the_longest_wait(
    store: LimitStore, make_bucket: BucketFactory
) -> None:
    slow, fast = make_bucket("slow", 60), make_bucket("fast", 120)  # 1/s and 2/s
    assert await take(store, (slow, 60), (fast, 120))
    slow_refuses = await store.reserve([Charge(slow, 3), Charge(fast, 4)])  # waits 3 s vs 2 s
    fast_refuses = await store.reserve([Charge(slow, 1), Charge(fast, 4)])  # waits 1 s vs 2 s
    assert slow_refuses.refused_by == slow
    assert near(slow_refuses.retry_after, 3.0)
    assert fast_refuses.refused_by == fast
    assert near(fast_refuses.retry_after, 2.0)


async def test_an_amount_above_capacity_never_fits(
    store: LimitStore, make_bucket: BucketFactory
) -> None:
    small, large = make_bucket("small", 60), make_bucket("large", 6000)
    decision = await store.reserve([Charge(large, 6000), Charge(small, 61)])
    assert (decision.refused_by, decision.retry_after) == (small, math.inf)
    assert await take(store, (large, 6000))


async def test_a_refund_makes_room_up_to_capacity(
    store: LimitStore, make_bucket: BucketFactory
) -> None:
    bucket = make_bucket("a", 60)
    assert await take(store, (bucket, 60))
    assert not await take(store, (bucket, 10))
    await store.settle([Charge(bucket, -10)])
    assert await take(store, (bucket, 10))
    await store.settle([Charge(bucket, -1000)])
    assert await take(store, (bucket, 60))  # the refund filled it, and no further
    assert not await take(store, (bucket, 5))


async def test_an_overrun_takes_the_level_below_zero_and_delays_the_next_request(
    store: LimitStore, make_bucket: BucketFactory
) -> None:
    bucket = make_bucket("a", 60)
    assert await take(store, (bucket, 60))
    await store.settle([Charge(bucket, 30)])
    decision = await store.reserve([Charge(bucket, 1)])
    assert not decision.admitted
    assert near(decision.retry_after, 31.0)  # 30 of debt, then the 1 unit asked for


async def test_a_bucket_refills_over_time_and_retry_after_is_enough(
    store: LimitStore, make_bucket: BucketFactory
) -> None:
    bucket = make_bucket("a", 6000)  # 100 per second
    assert await take(store, (bucket, 6000))
    decision = await store.reserve([Charge(bucket, 20)])
    assert not decision.admitted
    assert near(decision.retry_after, 0.2)
    await asyncio.sleep(decision.retry_after + 0.01)
    assert await take(store, (bucket, 20))


async def test_buckets_under_different_keys_are_independent(
    store: LimitStore, make_bucket: BucketFactory
) -> None:
    drained, same_tenant = make_bucket("a", 60), make_bucket("b", 60)
    other_tenant = make_bucket("a", 60, tag="globex")
    assert await take(store, (drained, 60))
    assert await take(store, (same_tenant, 60))
    assert await take(store, (other_tenant, 60))
    assert not await take(store, (drained, 5))


async def test_a_bucket_named_twice_is_charged_the_sum(
    store: LimitStore, make_bucket: BucketFactory
) -> None:
    bucket = make_bucket("a", 60)
    assert await take(store, (bucket, 30), (bucket, 30))
    assert not await take(store, (bucket, 5))


# MemoryStore on a fake clock: exact arithmetic.


async def test_memory_refill_and_retry_after_are_exact(
    clock: FakeClock, make_bucket: BucketFactory
) -> None:
    store, bucket = MemoryStore(clock), make_bucket("a", 60)
    assert await take(store, (bucket, 60))
    clock.advance(0.5)
    assert (await store.reserve([Charge(bucket, 1)])).retry_after == 0.5
    clock.advance(0.5)
    assert await take(store, (bucket, 1))
    assert (await store.reserve([Charge(bucket, 1)])).retry_after == 1.0


async def test_memory_settlement_is_exact(clock: FakeClock, make_bucket: BucketFactory) -> None:
    store, overrun, refunded = MemoryStore(clock), make_bucket("a", 60), make_bucket("b", 60)
    assert await take(store, (overrun, 60), (refunded, 60))
    await store.settle([Charge(overrun, 30), Charge(refunded, -1000)])
    assert (await store.reserve([Charge(overrun, 1)])).retry_after == 31.0
    assert await take(store, (refunded, 60))
    assert (await store.reserve([Charge(refunded, 1)])).retry_after == 1.0
    clock.advance(31.0)
    assert await take(store, (overrun, 1))


async def test_memory_forgets_a_bucket_once_it_would_be_full(
    clock: FakeClock, make_bucket: BucketFactory
) -> None:
    store = MemoryStore(clock)
    idle, in_debt, later = make_bucket("idle", 60), make_bucket("debt", 60), make_bucket("c", 60)
    assert await take(store, (idle, 1), (in_debt, 60))
    await store.settle([Charge(in_debt, 60)])  # 60 below zero: two minutes to full
    clock.advance(121.0)
    assert await take(store, (later, 1))
    assert len(store) == 2  # idle is gone; in_debt is kept until twice its time to full
    assert await take(store, (idle, 60))


async def test_memory_concurrent_reserves_admit_exactly_capacity(
    clock: FakeClock, make_bucket: BucketFactory
) -> None:
    store, bucket = MemoryStore(clock), make_bucket("a", 50)
    results = await asyncio.gather(*(take(store, (bucket, 1)) for _ in range(200)))
    assert sum(results) == 50


# RedisStore: what only a shared, remote store has to get right.


@pytest.fixture
async def own_store(own_redis: RedisProcess) -> AsyncIterator[RedisStore]:
    """A store on a Redis of this test's own, with the production timeouts."""
    store = await open_redis_store(own_redis.url)
    try:
        yield store
    finally:
        await store.aclose()


@pytest.fixture
async def own_client(own_redis: RedisProcess) -> AsyncIterator[Redis]:
    """A plain client on the same Redis, to look at what the store did."""
    client = Redis.from_url(own_redis.url, socket_timeout=TEST_TIMEOUT_S)
    try:
        yield client
    finally:
        await client.aclose()


async def test_redis_concurrent_reserves_from_two_gateways_admit_exactly_capacity(
    redis_url: str, make_bucket: BucketFactory
) -> None:
    bucket = make_bucket("a", 50)  # refills 50/60 per second: nothing in a fast test
    stores = [await open_redis_store(redis_url, timeout_s=TEST_TIMEOUT_S) for _ in range(2)]
    try:
        started = time.monotonic()
        results = await asyncio.gather(*(take(stores[i % 2], (bucket, 1)) for i in range(200)))
        elapsed = time.monotonic() - started
    finally:
        for store in stores:
            await store.aclose()
    assert 50 <= sum(results) <= 50 + math.floor(elapsed * bucket.rate)


async def test_redis_reserve_and_settle_are_one_script_call_each(
    own_store: RedisStore, own_client: Redis, make_bucket: BucketFactory
) -> None:
    charges = [Charge(make_bucket(name, 60), 1) for name in "abc"]
    assert (await own_store.reserve(charges)).admitted  # warm-up: loads the scripts
    await own_store.settle(charges)

    assert await _script_calls_during(own_client, own_store.reserve(charges)) == 1
    assert await _script_calls_during(own_client, own_store.settle(charges)) == 1
    refusal = own_store.reserve([Charge(charges[0].bucket, 61), *charges[1:]])
    assert await _script_calls_during(own_client, refusal) == 1


_WORDS = st.lists(
    st.one_of(st.integers(), st.binary(), st.text(st.characters(blacklist_categories=["Cs"]))),
    max_size=40,
)


@given(command=st.sampled_from(["EVALSHA", "SCRIPT LOAD", b"HSET"]), words=_WORDS)
def test_redis_commands_are_packed_in_c_into_the_bytes_redis_py_would_send(
    command: str | bytes, words: list[int | bytes | str]
) -> None:
    ours = _store_connection()
    assert type(ours).__name__.startswith("CPacked")
    assert b"".join(ours.pack_command(command, *words)) == b"".join(
        Connection().pack_command(command, *words)
    )


@functools.cache
def _store_connection() -> Connection:
    """A connection as `open_redis_store`'s client makes them (unopened: packing needs none)."""

    async def make() -> Connection:
        store = await open_redis_store("redis://127.0.0.1:9/0")
        connection = store._client.connection_pool.make_connection()
        await store.aclose()
        assert isinstance(connection, Connection)
        return connection

    return asyncio.run(make())


async def test_redis_reloads_its_scripts_after_the_script_cache_is_flushed(
    own_store: RedisStore, own_client: Redis, make_bucket: BucketFactory
) -> None:
    bucket = make_bucket("a", 60)
    assert await take(own_store, (bucket, 1))
    await own_client.script_flush()
    assert await take(own_store, (bucket, 1))
    await own_client.script_flush()
    await own_store.settle([Charge(bucket, -2)])


async def test_redis_keeps_a_bucket_as_a_hash_expiring_once_it_would_be_full(
    redis_url: str, make_bucket: BucketFactory
) -> None:
    bucket = make_bucket("a", 60)
    store = await open_redis_store(redis_url, timeout_s=TEST_TIMEOUT_S)
    client = Redis.from_url(redis_url, decode_responses=True, socket_timeout=TEST_TIMEOUT_S)
    try:
        assert await take(store, (bucket, 1))
        fresh = await client.hgetall(bucket.key), await client.pttl(bucket.key)
        await store.settle([Charge(bucket, 120)])
        in_debt = await client.hgetall(bucket.key), await client.pttl(bucket.key)
    finally:
        await client.aclose()
        await store.aclose()
    assert fresh[0]["level"] == "59"  # exact: a new bucket is full, less what was taken
    assert 119_000 < fresh[1] <= 120_000  # the two-minute floor
    assert abs(float(in_debt[0]["level"]) - (-61.0)) < TOLERANCE_S
    assert 241_000 < in_debt[1] <= 242_000  # twice the 121 s it needs to be full again


async def test_redis_scripts_touch_only_the_keys_they_are_given(
    own_store: RedisStore, own_client: Redis, make_bucket: BucketFactory
) -> None:
    tpm, rpm = make_bucket("tpm", 6000), make_bucket("rpm", 60)
    # The caller's contract for Redis Cluster: one request's keys share a hash slot.
    assert key_slot(tpm.key.encode()) == key_slot(rpm.key.encode())
    assert await take(own_store, (tpm, 100), (rpm, 1))
    await own_store.settle([Charge(tpm, -40), Charge(rpm, 0)], "b1")
    assert not await take(own_store, (tpm, 6000), (rpm, 61))
    marker = settled_key(tpm.key, "b1")  # the batch's applied-once marker, in the same slot
    assert key_slot(marker.encode()) == key_slot(tpm.key.encode())
    epoch = epoch_key(tpm.key)  # the tag's state epoch (ADR 0023), in the same slot too
    assert key_slot(epoch.encode()) == key_slot(tpm.key.encode())
    assert await own_client.ttl(epoch) == -1  # never expires: its absence means a loss
    keys = {tpm.key.encode(), rpm.key.encode(), marker.encode(), epoch.encode()}
    assert set(await own_client.keys("*")) == keys
    assert SETTLED_TTL_S - 5 < await own_client.ttl(marker) <= SETTLED_TTL_S


async def test_redis_applies_a_settlement_sent_twice_under_one_id_once(
    own_store: RedisStore, own_client: Redis, make_bucket: BucketFactory
) -> None:
    """A batch whose reply was lost may have run; its retry (same id) must not count."""
    refunded, overrun = make_bucket("refunded", 6000), make_bucket("overrun", 6000)
    assert await take(own_store, (refunded, 3000), (overrun, 100))
    batch = [Charge(refunded, -1000), Charge(overrun, 50)]
    await own_store.settle(batch, "lost-reply")
    await own_store.settle(batch, "lost-reply")  # the retry after a reply that never came
    levels = [float(await own_client.hget(b.key, "level") or "nan") for b in (refunded, overrun)]
    # 6000 - 3000 + 1000 and 6000 - 100 - 50, plus at most a moment's refill (100/s).
    assert 4000 <= levels[0] < 4000 + 100 * TOLERANCE_S
    assert 5850 <= levels[1] < 5850 + 100 * TOLERANCE_S
    await own_store.settle(batch, "another")  # a different batch is applied
    assert float(await own_client.hget(refunded.key, "level") or "nan") >= 5000


async def test_redis_down_fails_fast_and_the_store_recovers_when_it_is_back(
    own_redis: RedisProcess, own_store: RedisStore, make_bucket: BucketFactory
) -> None:
    charges = [Charge(make_bucket("a", 60), 1)]
    assert (await own_store.reserve(charges)).admitted
    own_redis.stop()
    await _fails_fast(own_store.reserve(charges))
    await _fails_fast(own_store.settle(charges))
    own_redis.start()  # the same port, an empty server: answered at once
    refused = await own_store.reserve(charges)  # the state was lost: the bucket refills anew
    assert not refused.admitted
    assert refused.retry_after <= 1.0  # 60 a minute: one a second from the restart


async def test_redis_not_answering_fails_after_the_timeout(
    own_redis: RedisProcess, own_store: RedisStore, make_bucket: BucketFactory
) -> None:
    charges = [Charge(make_bucket("a", 60), 1)]
    assert (await own_store.reserve(charges)).admitted
    own_redis.freeze()
    try:
        await _fails_fast(own_store.reserve(charges))
    finally:
        own_redis.thaw()
    assert (await own_store.reserve(charges)).admitted


async def _script_calls_during(client: Redis, operation: Awaitable[object]) -> int:
    """How many EVAL/EVALSHA calls the server counted while ``operation`` ran."""
    before = await _script_calls(client)
    await operation
    return await _script_calls(client) - before


async def _script_calls(client: Redis) -> int:
    stats = await client.info("commandstats")
    commands: Sequence[str] = ("cmdstat_eval", "cmdstat_evalsha")
    return sum(int(stats.get(command, {}).get("calls", 0)) for command in commands)


async def _fails_fast(operation: Awaitable[object]) -> None:
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as raised:
        await operation
    assert time.monotonic() - started < FAIL_FAST_S
    assert isinstance(raised.value.__cause__, RedisError | OSError)


def test_each_lua_helper_is_written_once_and_each_script_gets_the_ones_it_calls() -> None:
    """The scripts share helpers through ``lib_*.lua`` files (a Redis script cannot include
    another): no helper is written twice, and every composed script defines what it uses once."""
    folder = importlib.resources.files("fleet_core.gateway.admission").joinpath("lua")
    texts = {f.name: f.read_text("utf-8") for f in folder.iterdir() if f.name.endswith(".lua")}
    written = Counter(name for text in texts.values() for name in _defined(text))
    assert [name for name, times in written.items() if times > 1] == []
    for script in ("admit.lua", "settle.lua", "holds.lua"):
        composed = script_source(script)
        assert [line for line in composed.splitlines() if line.startswith("-- #include")] == []
        defined = Counter(_defined(composed))
        assert max(defined.values()) == 1
        called = set(re.findall(r"\b([a-z_]+)\(", composed)) & set(written)
        assert called <= set(defined), script


def _defined(lua: str) -> list[str]:
    return re.findall(r"^local function (\w+)\(", lua, flags=re.MULTILINE)
