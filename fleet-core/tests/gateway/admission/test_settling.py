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

from fleet_core.gateway.admission import settling
from fleet_core.gateway.admission.batching_store import BatchingStore
from fleet_core.gateway.admission.budget_book import Amounts
from fleet_core.gateway.admission.directory import StaticDirectory
from fleet_core.gateway.admission.key_ring import ANONYMOUS
from fleet_core.gateway.admission.rate_policy import Limits, RatePolicy
from fleet_core.gateway.admission.service import DRAIN_S, Admission
from fleet_core.gateway.admission.store import open_redis_store
from fleet_core.shared import stopping
from fleet_testing import servers
from fleet_testing.fix_proxy import ProxyFactory, TcpProxy
from fleet_testing.waiting import eventually

TPM = 6000
LATENCY_S = 0.1


class Counts:
    """AdmissionMetrics, counted."""

    def __init__(self) -> None:
        self.refusals = 0
        self.store_errors = 0
        self.dropped = 0

    def refused(self, *, level: str, dimension: str) -> None:
        self.refusals += 1

    def store_error(self) -> None:
        self.store_errors += 1

    def settlement_dropped(self) -> None:
        self.dropped += 1


@dataclass
class Slow:
    admission: Admission
    store: BatchingStore
    proxy: TcpProxy
    key: str
    redis_url: str
    counts: Counts

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
    counts = Counts()
    admission = Admission(
        directory=StaticDirectory(keys=None, policy=policy),
        store=store,
        metrics=counts,
        prefix=redis_prefix,
    )
    await store.ping()  # connect first: latency applies to the calls under test only
    proxy.latency_s = LATENCY_S
    key = f"{redis_prefix}fleet:rl:{{anonymous}}:tenant:tpm"
    try:
        yield Slow(admission, store, proxy, key, redis_url, counts)
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


async def _cut_settlement(slow: Slow, used: int, request_id: str) -> None:
    """Admit 3,000 tokens on a live Redis, cut it, settle to ``used``: the store call fails."""
    reservation = await slow.admission.admit(
        ANONYMOUS, Amounts(tokens_input=10, tokens_output=2990)
    )
    await asyncio.to_thread(slow.proxy.cut)
    errors = slow.counts.store_errors
    slow.admission.settle(reservation, Amounts(tokens_output=used), request_id=request_id)
    await eventually(lambda: slow.counts.store_errors > errors, within=5)


async def test_a_settlement_that_met_a_dead_redis_lands_once_it_is_back(slow: Slow) -> None:
    """The failed batch is kept and sent again (same id) until Redis answers."""
    slow.proxy.latency_s = 0
    started = time.monotonic()
    await _cut_settlement(slow, used=500, request_id="r")
    assert await slow.level() < TPM - 2900  # the whole reservation is still charged
    await asyncio.sleep(1.0)  # a retry or two fail meanwhile
    await asyncio.to_thread(slow.proxy.resume)

    async def given_back() -> bool:
        return await slow.level() >= TPM - 500 - 1

    await eventually(given_back, within=5, what="the 2,500 given back")
    await asyncio.sleep(1.0)  # no further retry applies it again
    refill = TPM / 60 * (time.monotonic() - started)
    assert TPM - 500 <= await slow.level() <= TPM - 500 + refill  # 2,500 given back, once
    assert slow.counts.dropped == 0


async def test_drain_gives_up_on_a_dead_redis_within_its_bound(slow: Slow) -> None:
    slow.proxy.latency_s = 0
    await _cut_settlement(slow, used=500, request_id="r")
    started = time.monotonic()
    await slow.admission.drain()
    assert time.monotonic() - started < DRAIN_S + 1
    assert slow.counts.dropped == 1


async def test_over_the_cap_the_oldest_failed_batch_is_dropped_and_counted(
    slow: Slow, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(settling, "UNSETTLED_CAP", 1)
    slow.proxy.latency_s = 0
    second = await slow.admission.admit(ANONYMOUS, Amounts(tokens_output=1000))
    await _cut_settlement(slow, used=500, request_id="r1")  # refund 2,500: dropped below
    slow.admission.settle(second, Amounts(tokens_output=0), request_id="r2")  # a second batch
    await eventually(lambda: slow.counts.dropped == 1, within=5)
    await asyncio.to_thread(slow.proxy.resume)
    await slow.admission.drain()
    # Charged 3,000 + 1,000; only r2's refund of 1,000 landed (plus the refill meanwhile).
    assert TPM - 3000 <= await slow.level() < TPM - 2500


async def test_drain_is_bounded_by_a_store_that_hangs_and_counts_what_it_cut_short(
    slow: Slow,
) -> None:
    """Redis answers nothing in time (the proxy delays every chunk 30 s; the client would wait
    5 s per call): drain still ends within its bound, and the settlement it cut short on the
    wire is counted as dropped, not lost silently."""
    reservation = await slow.admission.admit(ANONYMOUS, Amounts(tokens_output=3000))
    slow.proxy.latency_s = 30
    slow.admission.settle(reservation, Amounts(tokens_output=500), request_id="r")
    await asyncio.sleep(0.05)  # the settle window has passed: the flush is on the wire
    started = time.monotonic()
    await slow.admission.drain(within_s=1.0)
    assert time.monotonic() - started < 1.0 + stopping.RECANCEL_S + 1
    assert slow.counts.dropped == 1
    assert slow.counts.store_errors == 0  # cut short by shutdown, not failed
