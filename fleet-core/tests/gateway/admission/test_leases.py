"""Leased buckets (ADR 0016): local admission from a slice Redis granted, never more than Redis
admits across gateways, corrections and give-backs landing in Redis, small buckets exact.

Each "gateway" is a `LeasedStore` on its own client to one real Redis.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from fleet_core.gateway.admission import leases
from fleet_core.gateway.admission.batching_store import BatchingStore
from fleet_core.gateway.admission.budget_book import Amounts
from fleet_core.gateway.admission.directory import StaticDirectory
from fleet_core.gateway.admission.key_ring import ANONYMOUS
from fleet_core.gateway.admission.leases import LeasedStore
from fleet_core.gateway.admission.limits import Bucket, Charge, Hold, StoreUnavailable
from fleet_core.gateway.admission.memory_store import MemoryStore
from fleet_core.gateway.admission.rate_policy import Limits, RatePolicy
from fleet_core.gateway.admission.service import Admission
from fleet_core.gateway.admission.store import open_redis_store
from fleet_core.gateway.settings import admission_from_env
from fleet_core.shared.errors import ConfigError, Unavailable
from fleet_testing.fix_redis_process import RedisProcess

from .conftest import FakeClock

Opener = Callable[[], Awaitable[LeasedStore]]


@pytest.fixture
async def gateway(redis_url: str) -> AsyncIterator[Opener]:
    """Opens `LeasedStore`s on the shared Redis (one per gateway); closes them after."""
    opened: list[LeasedStore] = []

    async def open_one() -> LeasedStore:
        opened.append(LeasedStore(BatchingStore(await open_redis_store(redis_url, timeout_s=5))))
        return opened[-1]

    yield open_one
    for store in opened:
        await store.aclose()


def bucket(prefix: str, capacity: int, dimension: str = "tpm") -> Bucket:
    return Bucket(
        f"{prefix}{{t:{secrets.token_hex(3)}}}:{dimension}", "tenant", dimension, capacity
    )  # type: ignore[arg-type]


async def level(url: str, b: Bucket) -> float:
    """The bucket's level in Redis now (refilled to Redis's clock), as the scripts compute it."""
    async with Redis.from_url(url) as client:
        state = await client.hmget(b.key, ["level", "ts"])
        seconds, micros = await client.time()
    if state[0] is None:
        return float(b.capacity)
    elapsed = seconds + micros / 1e6 - float(state[1])
    return min(b.capacity, float(state[0]) + max(0.0, elapsed) * b.capacity / 60)


async def leased(store: LeasedStore, charge: Charge) -> None:
    """Reserve once (exactly, starting the lease), then wait until the slice holds ``charge``."""
    assert (await store.reserve([charge])).admitted
    for _ in range(200):
        if store.held(charge.bucket.key) >= charge.amount:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no lease was granted")


def run_now(coroutine: Any) -> Any:
    """The coroutine's result if it finishes without suspending; fails if it would wait."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise AssertionError("the reservation suspended")


async def test_a_request_that_fits_its_slices_is_admitted_without_suspending(
    gateway: Opener, redis_prefix: str
) -> None:
    store = await gateway()
    rpm, tpm = bucket(redis_prefix, 60_000, "rpm"), bucket(redis_prefix, 6_000_000)
    await leased(store, Charge(rpm, 1))
    await leased(store, Charge(tpm, 100))
    decision = run_now(store.reserve([Charge(rpm, 1), Charge(tpm, 100)]))
    assert decision.admitted


async def test_a_request_with_budget_holds_goes_to_redis_with_them(
    gateway: Opener, redis_prefix: str
) -> None:
    store = await gateway()
    tpm = bucket(redis_prefix, 6_000_000)
    await leased(store, Charge(tpm, 100))
    held = store.held(tpm.key)
    book = f"{tpm.key}:book"
    hold = Hold(  # a growth past its rule's limit: refused
        book, "g1", "grant-1", need=10, extra=0, limit=5, base=0, keep=0, ttl_ms=60_000
    )
    decision = await store.reserve([Charge(tpm, 100)], [hold])
    assert decision.refused_hold == 0
    assert store.held(tpm.key) == held  # the slice was not touched


async def test_small_buckets_stay_exact_across_gateways(gateway: Opener, redis_prefix: str) -> None:
    stores = [await gateway(), await gateway()]
    rpm = bucket(redis_prefix, 5, "rpm")
    decisions = await asyncio.gather(*(stores[i % 2].reserve([Charge(rpm, 1)]) for i in range(40)))
    assert sum(d.admitted for d in decisions) == 5
    refused = next(d for d in decisions if not d.admitted)
    assert refused.refused_by == rpm
    assert refused.retry_after > 1  # Redis's real Retry-After


async def test_two_gateways_never_admit_more_than_the_bucket_holds(
    gateway: Opener, redis_prefix: str, redis_url: str
) -> None:
    stores = [await gateway(), await gateway()]
    rpm = bucket(redis_prefix, 3_000, "rpm")  # lease cap 30
    started = time.monotonic()
    admitted = 0
    for _ in range(40):  # waves of concurrent requests from both, until the bucket is empty
        decisions = await asyncio.gather(
            *(stores[i % 2].reserve([Charge(rpm, 1)]) for i in range(200))
        )
        admitted += sum(d.admitted for d in decisions)
        await asyncio.sleep(0.01)
    refill = rpm.capacity / 60 * (time.monotonic() - started)
    assert rpm.capacity * 0.9 <= admitted <= rpm.capacity + refill


async def test_what_is_admitted_locally_is_what_redis_granted(
    gateway: Opener, redis_prefix: str, redis_url: str
) -> None:
    """Redis level + every slice + every admitted charge = capacity (before refill): closing
    gives the slices back."""
    stores = [await gateway(), await gateway()]
    tpm = bucket(redis_prefix, 600_000)  # lease cap 6,000
    await leased(stores[0], Charge(tpm, 500))
    await leased(stores[1], Charge(tpm, 500))
    taken = 1000 + sum(
        [
            d.admitted * 200
            for d in await asyncio.gather(*(s.reserve([Charge(tpm, 200)]) for s in stores * 10))
        ]
    )
    await asyncio.sleep(0.05)  # top-ups land
    slices = stores[0].held(tpm.key) + stores[1].held(tpm.key)
    assert slices > 0
    now = await level(redis_url, tpm)
    assert now + slices + taken <= tpm.capacity + 10_000 * 1  # ≤ 1 s of refill at 10,000/s
    for store in stores:
        await store.aclose()
    restored = await level(redis_url, tpm)
    assert tpm.capacity - taken <= restored <= tpm.capacity - taken + 20_000  # 2 s refill


async def test_refunds_and_overruns_land_in_the_slice_then_in_redis(
    gateway: Opener, redis_prefix: str, redis_url: str
) -> None:
    store = await gateway()
    tpm = bucket(redis_prefix, 6_000_000)
    await leased(store, Charge(tpm, 1000))  # 1,000 taken exactly
    held = store.held(tpm.key)
    assert run_now(store.reserve([Charge(tpm, 1000)])).admitted
    await store.settle([Charge(tpm, -600)], "refund")  # used 400 of 1,000
    await store.settle([Charge(tpm, 250)], "overrun")
    assert store.held(tpm.key) == held - 1000 + 600 - 250
    await store.aclose()
    restored = await level(redis_url, tpm)
    used = 1000 + 400 + 250
    assert tpm.capacity - used <= restored <= tpm.capacity - used + 200_000  # 2 s refill


async def test_a_refund_never_grows_a_slice_past_its_cap(
    gateway: Opener, redis_prefix: str
) -> None:
    store = await gateway()
    tpm = bucket(redis_prefix, 600_000)
    await leased(store, Charge(tpm, 100))
    await store.settle([Charge(tpm, -50_000)], "big-refund")
    assert store.held(tpm.key) == leases.lease_cap(tpm)


async def test_an_idle_slice_goes_back_to_redis(
    gateway: Opener, redis_prefix: str, redis_url: str
) -> None:
    store = await gateway()
    tpm = bucket(redis_prefix, 600_000)
    await leased(store, Charge(tpm, 500))
    assert store.held(tpm.key) > 0
    await asyncio.sleep(leases.IDLE_S + 3 * leases.SWEEP_S)
    assert store.held(tpm.key) == 0
    assert tpm.capacity - 500 <= await level(redis_url, tpm) <= tpm.capacity


async def test_a_dead_store_mid_lease_keeps_the_slice_then_behaves_as_configured(
    own_redis: RedisProcess,
) -> None:
    for on_error in ("closed", "open"):
        store = LeasedStore(BatchingStore(await open_redis_store(own_redis.url, timeout_s=0.5)))
        policy = RatePolicy(default=Limits(rpm=60_000))  # lease cap 600 requests
        admission = Admission(
            directory=StaticDirectory(keys=None, policy=policy),
            store=store,
            metrics=_Counts(),
            prefix=f"{on_error}:",
            on_store_error=on_error,  # type: ignore[arg-type]
        )
        demand = Amounts(tokens_input=1, tokens_output=1)
        await admission.admit(ANONYMOUS, demand)
        key = f"{on_error}:fleet:rl:{{anonymous}}:tenant:rpm"
        for _ in range(200):  # until the lease is granted
            await asyncio.sleep(0.01)
            if store.held(key):
                break
        slice_ = store.held(key)
        assert slice_ > 0
        own_redis.stop()
        try:
            for _ in range(slice_):  # Redis granted these: they are admitted without it
                await admission.admit(ANONYMOUS, demand)
            if on_error == "closed":
                with pytest.raises(Unavailable):
                    await admission.admit(ANONYMOUS, demand)
            else:
                await admission.admit(ANONYMOUS, demand)
        finally:
            own_redis.start()
            await store.aclose()


async def test_a_settlement_whose_redis_part_failed_is_applied_once_when_sent_again(
    own_redis: RedisProcess,
) -> None:
    store = LeasedStore(BatchingStore(await open_redis_store(own_redis.url, timeout_s=0.5)))
    try:
        tpm = bucket("", 6_000_000)
        other = Bucket(tpm.key.replace(":tpm", ":other"), "tenant", "tpm", 10)  # never leased
        await leased(store, Charge(tpm, 1000))
        held = store.held(tpm.key)
        own_redis.stop()
        with pytest.raises(StoreUnavailable):
            await store.settle([Charge(tpm, -300), Charge(other, -5)], "batch")
        own_redis.start()
        await store.settle([Charge(tpm, -300), Charge(other, -5)], "batch")
        assert store.held(tpm.key) == held + 300
    finally:
        await store.aclose()


class _Counts:
    def refused(self, **_: str) -> None: ...

    def store_error(self) -> None: ...

    def settlement_dropped(self) -> None: ...


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    capacity=st.integers(min_value=1, max_value=2_000_000),
    sizes=st.lists(st.integers(min_value=1, max_value=50_000), min_size=1, max_size=120),
)
def test_leases_never_admit_more_than_redis_would(
    redis_url: str, capacity: int, sizes: list[int]
) -> None:
    """Any capacity, any request sizes, two gateways: what is admitted never passes what one
    exact bucket admits over the same time (capacity plus its refill)."""

    async def scenario() -> None:
        stores = [
            LeasedStore(BatchingStore(await open_redis_store(redis_url, timeout_s=5)))
            for _ in range(2)
        ]
        tpm = Bucket(f"prop:{{t:{uuid.uuid4().hex}}}:tpm", "tenant", "tpm", capacity)
        started = time.monotonic()
        admitted = 0
        try:
            for wave in range(0, len(sizes), 8):
                part = sizes[wave : wave + 8]
                decisions = await asyncio.gather(
                    *(stores[i % 2].reserve([Charge(tpm, n)]) for i, n in enumerate(part))
                )
                admitted += sum(n for n, d in zip(part, decisions, strict=True) if d.admitted)
                await asyncio.sleep(0)
        finally:
            for store in stores:
                await store.aclose()
        refill = capacity / 60 * (time.monotonic() - started + 0.05)
        assert admitted <= capacity + refill

    asyncio.run(scenario())


def test_fleet_rate_lease_is_auto_off_or_refused() -> None:
    assert admission_from_env({}).rate_lease == "auto"
    assert admission_from_env({"FLEET_RATE_LEASE": "off"}).rate_lease == "off"
    with pytest.raises(ConfigError, match="FLEET_RATE_LEASE='sometimes' is not one of: auto, off"):
        admission_from_env({"FLEET_RATE_LEASE": "sometimes"})


class _SharedMemory(MemoryStore):
    """One process-memory store behind several `LeasedStore`s: closing one leaves it open."""

    async def aclose(self) -> None:
        return None

    def level(self, b: Bucket) -> float:
        return self._level(Charge(b, 0), self._now())


def gateway_ops(largest: int, *, most: int) -> st.SearchStrategy[list[tuple[int, int, int]]]:
    """Up to ``most`` requests: (which of two gateways, size up to ``largest``, its correction
    from a full refund to an overrun of a sixth of ``largest``)."""
    return st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=1),
            st.integers(min_value=1, max_value=largest),
            st.integers(min_value=-largest, max_value=largest // 6),
        ),
        min_size=1,
        max_size=most,
    )


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(min_value=1, max_value=2_000_000), ops=gateway_ops(30_000, most=150))
def test_every_unit_is_in_the_store_a_slice_or_a_request(
    capacity: int, ops: list[tuple[int, int, int]]
) -> None:
    """On a frozen clock, after any reservations and corrections from two gateways: the store's
    level plus both slices is the capacity less what the admitted requests hold (so nothing is
    admitted that the store did not grant); closing puts the slices back."""

    async def scenario() -> None:
        clock = FakeClock()
        shared = _SharedMemory(clock)
        stores = [LeasedStore(shared, clock=clock) for _ in range(2)]
        tpm = Bucket("{t:prop}:tpm", "tenant", "tpm", capacity)
        holding = 0
        for gateway, size, correction in ops:
            if (await stores[gateway].reserve([Charge(tpm, size)])).admitted:
                delta = max(correction, -size)  # a refund gives back at most what was reserved
                await stores[gateway].settle([Charge(tpm, delta)], uuid.uuid4().hex)
                holding += size + delta
            for _ in range(3):
                await asyncio.sleep(0)  # top-ups land
        slices = stores[0].held(tpm.key) + stores[1].held(tpm.key)
        assert shared.level(tpm) + slices == pytest.approx(capacity - holding)
        assert max(stores[0].held(tpm.key), stores[1].held(tpm.key)) <= leases.lease_cap(tpm)
        for store in stores:
            await store.aclose()
        assert shared.level(tpm) == pytest.approx(min(capacity, capacity - holding))

    asyncio.run(scenario())


@settings(max_examples=200, deadline=None)
@given(
    capacities=st.lists(st.integers(min_value=1, max_value=400_000), min_size=2, max_size=4),
    ops=gateway_ops(4_000, most=120),
)
def test_a_request_over_several_buckets_takes_from_every_slice_or_from_none(
    capacities: list[int], ops: list[tuple[int, int, int]]
) -> None:
    """Each request charges every bucket at once (a tenant's and a project's rpm and tpm): a
    slice that cannot cover its part undoes what the slices before it gave. On a frozen clock,
    per bucket, the store's level plus both slices is the capacity less what admitted requests
    hold, whichever bucket refused."""

    async def scenario() -> None:
        clock = FakeClock()
        shared = _SharedMemory(clock)
        stores = [LeasedStore(shared, clock=clock) for _ in range(2)]
        buckets = [Bucket(f"{{t:multi}}:{i}", "tenant", "tpm", c) for i, c in enumerate(capacities)]
        holding = [0] * len(buckets)
        for gateway, size, correction in ops:
            charges = [Charge(b, size) for b in buckets]
            if (await stores[gateway].reserve(charges)).admitted:
                delta = max(correction, -size)
                await stores[gateway].settle([Charge(b, delta) for b in buckets], uuid.uuid4().hex)
                holding = [h + size + delta for h in holding]
            for _ in range(3):
                await asyncio.sleep(0)  # top-ups land
        for b, capacity, held in zip(buckets, capacities, holding, strict=True):
            slices = stores[0].held(b.key) + stores[1].held(b.key)
            assert shared.level(b) + slices == pytest.approx(capacity - held)
        for store in stores:
            await store.aclose()

    asyncio.run(scenario())


class _SlowMemory(_SharedMemory):
    """A store whose answers take ``latency_s`` of the fake clock: what a top-up's round trip
    costs a gateway whose event loop is saturated (several iterations of tens of ms each).
    `answer_due` lets through the calls whose time has come."""

    def __init__(self, clock: FakeClock, latency_s: float) -> None:
        super().__init__(clock)
        self._clock, self._latency_s = clock, latency_s
        self._waiting: list[tuple[float, asyncio.Event]] = []
        self.exact = 0
        """Reservations of a single request's charge (the exact path), not top-ups."""

    async def reserve(self, charges: Any, holds: Any = ()) -> Any:
        if [charge.amount for charge in charges] == [1]:
            self.exact += 1
        answered = asyncio.Event()
        self._waiting.append((self._clock.now + self._latency_s, answered))
        await answered.wait()
        return await super().reserve(charges, holds)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def answer_due(self) -> None:
        for due, answered in self._waiting:
            if due <= self._clock.now:
                answered.set()
        self._waiting = [
            (due, answered) for due, answered in self._waiting if due > self._clock.now
        ]


def test_a_slice_keeps_up_with_demand_while_its_top_ups_are_slow() -> None:
    """1,000 requests/s of one unit each, top-ups answered after 150 ms: once the slice has
    grown, requests are admitted from it, not sent the exact way. Sized by local takes alone,
    the requests that missed the slice did not count as demand, so it stayed too small to last
    a round trip and nearly all of them went to the store (ADR 0016, "Keeping up")."""

    async def scenario() -> None:
        clock = FakeClock()
        shared = _SlowMemory(clock, latency_s=0.15)
        store = LeasedStore(shared, clock=clock)
        rpm = Bucket("{t:slow}:rpm", "tenant", "rpm", 60_000_000)
        pending: set[asyncio.Task[Any]] = set()
        exact_before = 0
        for tick in range(300):  # 3 s in ticks of 10 ms, 10 requests each
            if tick == 100:
                exact_before = shared.exact
            for _ in range(10):
                task = asyncio.ensure_future(store.reserve([Charge(rpm, 1)]))
                pending.add(task)
                task.add_done_callback(pending.discard)
            clock.advance(0.01)
            shared.answer_due()
            for _ in range(5):
                await asyncio.sleep(0)
        for _ in range(100):  # the clock goes on until every request and top-up has its answer
            if not pending and shared.waiting == 0:
                break
            clock.advance(0.01)
            shared.answer_due()
            for _ in range(5):
                await asyncio.sleep(0)
        assert not pending
        assert shared.waiting == 0
        missed = shared.exact - exact_before
        assert missed <= 20, f"{missed} of the last 2,000 requests missed the slice"
        await store.aclose()

    asyncio.run(scenario())
