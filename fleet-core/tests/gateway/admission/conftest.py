"""Fixtures for the limit-store tests: both stores, bucket factories, and a Redis we may kill.

The behavioural suite runs once per store through the parametrized `store` fixture. Redis keeps
time by its own clock, so that suite waits in real time, briefly; exact arithmetic is checked on a
`MemoryStore` driven by a `FakeClock`. `own_redis` (from the shared harness) is a redis-server
for one test alone, to stop and start again on the same port.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from fleet_core.gateway.admission.limits import Bucket, LimitStore
from fleet_core.gateway.admission.memory_store import MemoryStore
from fleet_core.gateway.admission.store import open_redis_store

START_TIMEOUT_S = 10.0
TEST_TIMEOUT_S = 5.0
"""Client timeout on the shared server: generous, as other suites may load the machine."""

BucketFactory = Callable[..., Bucket]


class FakeClock:
    """A monotonic clock that moves only when told."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[LimitStore]:
    """Each store in turn, on a real clock (Redis's own, or the process's)."""
    opened: LimitStore
    if request.param == "memory":
        opened = MemoryStore()
    else:
        opened = await open_redis_store(redis_url, timeout_s=TEST_TIMEOUT_S)
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture
def make_bucket(redis_prefix: str) -> BucketFactory:
    """Buckets under this test's key prefix, all of one tenant's hash tag."""

    def make(name: str, capacity: int, *, tag: str = "acme") -> Bucket:
        return Bucket(f"{redis_prefix}{{t:{tag}}}:{name}", "tenant", "tpm", capacity)

    return make
