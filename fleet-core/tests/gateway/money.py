"""The money invariants every fault test asserts, read from the real parts after the fact.

- every Redis token bucket is back to its capacity minus what the records bill (refill over the
  test's duration is the only slack allowed);
- ``fleet_requests_in_flight`` is 0;
- exactly one usage record per request admitted (and in database mode exactly one ledger row per
  record of a request admitted: refusals are counted on /metrics, not kept as rows), and no 500
  anywhere.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
import psycopg
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from fleet_core.gateway.metering.records import UsageRecord
from fleet_testing.waiting import eventually

__all__ = [
    "Books",
    "billed",
    "bucket_level",
    "envelope",
    "in_flight",
    "ledger_ids",
    "metric",
    "records",
]

SETTLE_WITHIN_S = 10.0


def billed(record: UsageRecord) -> int:
    """Tokens the record bills: what its settlement must leave taken from the tpm bucket."""
    return record.prompt_tokens + record.completion_tokens


async def records(url: str, headers: dict[str, str] | None = None) -> list[UsageRecord]:
    async with httpx.AsyncClient() as http:
        got = await http.get(f"{url}/api/v1/requests?limit=1000", headers=headers or {})
    assert got.status_code == 200, got.text
    return [msgspec.convert(r, UsageRecord) for r in got.json()["data"]]


async def in_flight(url: str, headers: dict[str, str] | None = None) -> float:
    return await metric(url, "fleet_requests_in_flight", headers)


async def metric(url: str, sample: str, headers: dict[str, str] | None = None) -> float:
    """The sum of a gateway's ``sample`` series (every label set) on /metrics; 0 if none."""
    async with httpx.AsyncClient() as http:
        got = await http.get(f"{url}/metrics", headers=headers or {})
    assert got.status_code == 200, got.text
    families = text_string_to_metric_families(got.text)
    return sum(s.value for family in families for s in family.samples if s.name == sample)


async def bucket_level(redis_url: str, key: str) -> float | None:
    """A bucket's stored level (as of its last touch), or None if it was never written."""
    async with Redis.from_url(redis_url) as client:
        level = await client.hget(key, "level")
    return None if level is None else float(level)


@dataclass
class Books:
    """One gateway's view for the invariants: where to look and what the test saw."""

    url: str
    redis_url: str
    tpm_key: str
    capacity: int
    ledger_url: str | None = None
    """In database mode: the ledger must hold exactly the records, one row each."""
    headers: dict[str, str] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    statuses: list[int] = field(default_factory=list)

    async def check(self, *, admitted: int) -> list[UsageRecord]:
        """Assert every invariant once the gateway has settled; returns the records."""
        assert 500 not in self.statuses, self.statuses
        seen: list[str] = []
        settled: list[UsageRecord] = []

        async def balanced() -> bool:
            found = await records(self.url, self.headers)
            gauge = await in_flight(self.url, self.headers)
            level = await bucket_level(self.redis_url, self.tpm_key)
            problem = self._problem(found, gauge, level, admitted)
            if problem is None and self.ledger_url is not None:
                problem = _ledger_problem(await ledger_ids(self.ledger_url), found)
            settled[:], seen[:] = found, [problem or ""]
            return problem is None

        await eventually(balanced, within=SETTLE_WITHIN_S, what=lambda: seen[0])
        return settled

    def _problem(
        self, found: Sequence[UsageRecord], gauge: float, level: float | None, admitted: int
    ) -> str | None:
        served = [r for r in found if r.outcome != "refused"]
        if len(served) != admitted:
            return f"{len(served)} records for {admitted} admitted requests: {found}"
        if any(r.status == 500 for r in found):
            return f"a 500 was recorded: {found}"
        if gauge != 0:
            return f"fleet_requests_in_flight is {gauge}"
        return self._bucket_problem(served, level)

    def _bucket_problem(self, served: Sequence[UsageRecord], level: float | None) -> str | None:
        used = sum(billed(r) for r in served)
        expected = self.capacity - used
        if level is None:
            return None if used == 0 and not served else "the bucket was never written"
        slack = self.capacity / 60 * (time.monotonic() - self.started)
        if not expected - 1e-6 <= level <= min(self.capacity, expected + slack) + 1e-6:
            return f"tpm bucket at {level:.1f}; capacity {self.capacity} - used {used} = {expected}"
        return None


async def ledger_ids(url: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cursor = await conn.execute("SELECT request_id FROM ledger")
        return [row[0] for row in await cursor.fetchall()]


def _ledger_problem(rows: Sequence[str], found: Sequence[UsageRecord]) -> str | None:
    admitted = [r.request_id for r in found if r.outcome != "refused"]
    if sorted(rows) != sorted(admitted):
        return f"{len(rows)} ledger rows for {len(admitted)} records of admitted requests"
    return None


def envelope(response: httpx.Response) -> dict[str, Any]:
    assert response.headers["content-type"].startswith("application/json"), response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error
