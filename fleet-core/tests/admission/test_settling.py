"""Settlement under faults: what is reserved in Redis is settled, even when nobody waits for it.

Redis is real and reached through the TCP proxy fixture, given latency so that store calls are
still on the wire when the code under test moves on (cancel, shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from redis.asyncio import Redis

from fleet_core.admission.budgets import Amounts
from fleet_core.admission.directory import StaticDirectory
from fleet_core.admission.keys import ANONYMOUS
from fleet_core.admission.policy import Limits, RatePolicy
from fleet_core.admission.service import Admission
from fleet_core.admission.store import BatchingStore, open_redis_store
from fleet_testing import servers
from fleet_testing.fix_proxy import ProxyFactory, TcpProxy

TPM = 6000
LATENCY_S = 0.1


class Counts:
    """AdmissionMetrics, counted."""

    def __init__(self) -> None:
        self.refusals = 0
        self.store_errors = 0

    def refused(self, *, level: str, dimension: str) -> None:
        self.refusals += 1

    def store_error(self) -> None:
        self.store_errors += 1


@dataclass
class Slow:
    admission: Admission
    store: BatchingStore
    proxy: TcpProxy
    key: str
    redis_url: str

    async def level(self) -> float:
        async with Redis.from_url(self.redis_url) as client:
            return float(await client.hget(self.key, "level") or TPM)


@pytest.fixture
async def slow(redis_url: str, redis_prefix: str, tcp_proxy: ProxyFactory) -> AsyncIterator[Slow]:
    """Admission (tpm 6000 for everyone) on a Redis 100 ms away; the store closes after."""
    target = servers.address_of(redis_url)
    proxy = tcp_proxy(target.host, target.port)
    store = BatchingStore(await open_redis_store(proxy.url_for(redis_url), timeout_s=5))
    policy = RatePolicy(default=Limits(tpm=TPM))
    admission = Admission(
        directory=StaticDirectory(keys=None, policy=policy),
        store=store,
        metrics=Counts(),
        prefix=redis_prefix,
    )
    await store.ping()  # connect first: latency applies to the calls under test only
    proxy.latency_s = LATENCY_S
    key = f"{redis_prefix}fleet:rl:{{anonymous}}:tenant:tpm"
    try:
        yield Slow(admission, store, proxy, key, redis_url)
    finally:
        await store.aclose()


async def test_drain_waits_for_a_settlement_already_on_the_wire(slow: Slow) -> None:
    """drain() returned while a flush was in flight (its task had cleared itself), and the
    store's client was closed under it: the refund never landed."""
    started = time.monotonic()
    demand = Amounts(tokens_input=10, tokens_output=2990)
    reservation = await slow.admission.admit(ANONYMOUS, demand)
    slow.admission.settle(reservation, Amounts(tokens_input=10, tokens_output=490), request_id="r")
    await asyncio.sleep(0.05)  # the settle window has passed: the flush is on the wire
    await slow.admission.drain()
    slow.proxy.latency_s = 0
    refill = TPM / 60 * (time.monotonic() - started)
    assert TPM - 500 <= await slow.level() <= TPM - 500 + refill  # 2,500 given back


async def test_a_reservation_whose_waiter_was_cancelled_is_settled(slow: Slow) -> None:
    """The client left while its reservation was on its way: Redis charged it, nobody settled.
    The store gives it back when the answer arrives, and closing waits for that."""
    waiter = asyncio.create_task(
        slow.admission.admit(ANONYMOUS, Amounts(tokens_input=10, tokens_output=2990))
    )
    await asyncio.sleep(LATENCY_S / 2)  # sent, not yet answered
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
    await slow.admission.drain()
    await slow.store.aclose()  # at shutdown: after drain, before the process exits
    await asyncio.sleep(3 * LATENCY_S)  # anything the proxy still holds reaches Redis
    assert await slow.level() == TPM  # charged, then given back in full
