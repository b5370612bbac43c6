"""Several reservations in one script call: each judged in order, all or nothing, as if alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis

from fleet_core.gateway.admission.batching_store import BatchingStore
from fleet_core.gateway.admission.limits import Bucket, Charge
from fleet_core.gateway.admission.store import RedisStore, open_redis_store
from fleet_testing.fix_redis_process import RedisProcess


@pytest.fixture
async def store(own_redis: RedisProcess) -> AsyncIterator[RedisStore]:
    opened = await open_redis_store(own_redis.url, timeout_s=5)
    yield opened
    await opened.aclose()


def script_calls(url: str) -> int:
    with redis.Redis.from_url(url) as client:
        stats = client.info("commandstats")
    return sum(int(stats.get(k, {}).get("calls", 0)) for k in ("cmdstat_evalsha", "cmdstat_eval"))


RPM = Bucket("{acme}:rpm", "tenant", "rpm", 3)
TPM = Bucket("{acme}:tpm", "tenant", "tpm", 1000)


async def test_reservations_in_one_call_are_judged_in_order(store: RedisStore) -> None:
    decisions = await store.reserve_many([([Charge(RPM, 1)], ()) for _ in range(5)])
    assert [d.admitted for d in decisions] == [True, True, True, False, False]
    assert decisions[3].refused_by == RPM
    assert 15 < decisions[3].retry_after <= 20.001  # one unit per 20 s at 3 per minute


async def test_a_refused_reservation_charges_nothing_in_a_batch(store: RedisStore) -> None:
    decisions = await store.reserve_many(
        [
            ([Charge(RPM, 1), Charge(TPM, 900)], ()),
            ([Charge(RPM, 1), Charge(TPM, 200)], ()),  # tpm short: its rpm unit must not be taken
            ([Charge(RPM, 1), Charge(TPM, 100)], ()),
            ([Charge(RPM, 1)], ()),
            ([], ()),
        ]
    )
    assert [d.admitted for d in decisions] == [True, False, True, True, True]
    assert decisions[1].refused_by == TPM
    # rpm: 3 units taken by reservations 1, 3 and 4; the refused one took none
    assert not (await store.reserve([Charge(RPM, 1)])).admitted


async def test_concurrent_reserves_in_one_tick_share_one_call(
    store: RedisStore, own_redis: RedisProcess
) -> None:
    batching = BatchingStore(store)
    bucket = Bucket("{globex}:rpm", "tenant", "rpm", 50)
    await batching.reserve([Charge(Bucket("{globex}:warm", "tenant", "rpm", 5), 1)])
    before = script_calls(own_redis.url)
    decisions = await asyncio.gather(*(batching.reserve([Charge(bucket, 1)]) for _ in range(200)))
    assert sum(d.admitted for d in decisions) == 50
    assert script_calls(own_redis.url) - before == 1


async def test_batches_are_split_by_tenant(store: RedisStore, own_redis: RedisProcess) -> None:
    batching = BatchingStore(store)
    await batching.reserve([Charge(Bucket("{a}:warm", "tenant", "rpm", 5), 1)])
    before = script_calls(own_redis.url)
    a, b = Bucket("{a}:rpm", "tenant", "rpm", 2), Bucket("{b}:rpm", "tenant", "rpm", 2)
    decisions = await asyncio.gather(*(batching.reserve([Charge(x, 1)]) for x in (a, b) * 3))
    assert [d.admitted for d in decisions] == [True, True, True, True, False, False]
    assert script_calls(own_redis.url) - before == 2  # one slot per call: one call per tenant
