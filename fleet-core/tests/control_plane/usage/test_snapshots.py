"""Every usage answer is one snapshot: while the ledger writer commits batches beside it (each
its rows and rollups in one transaction), an answer holds whole batches only, across the minute
and hour boundaries where its parts (hour rollups, minute rollups, raw rows) meet."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg_pool import AsyncConnectionPool

from fleet_core.control_plane.usage import store as usage
from fleet_core.gateway.ledger import store as ledger
from fleet_core.gateway.metering.records import EngineUsage, GatewayCount, UsageRecord
from fleet_core.shared.storage.migrations import apply_migrations
from fleet_testing.records import usage_record

HOUR = datetime(2026, 9, 1, 11, tzinfo=UTC)
EDGES = (
    HOUR - timedelta(microseconds=1),  # the last instant of 10:59, in the hour before
    HOUR,  # the first of 11:00
    HOUR + timedelta(minutes=1) - timedelta(microseconds=1),  # the last of 11:00
)
BATCH = len(EDGES)
BATCHES = 40


def _record(n: int, done: datetime, *, counted: int = 11) -> UsageRecord:
    at = done.timestamp()
    return usage_record(
        request_id=f"r{n}",
        endpoint="http://e:1",
        received_at=at - 1,
        done_at=at,
        engine=EngineUsage(10, 5, 0),
        gateway=GatewayCount(counted, 5, "estimate:chars/4"),
    )


async def _write(url: str, batches: int = BATCHES) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for b in range(batches):
            batch = [_record(b * BATCH + i, done) for i, done in enumerate(EDGES)]
            await ledger.insert_batch(conn, batch)
            await asyncio.sleep(0)


async def test_every_answer_holds_whole_batches_across_the_hour_and_minute_edges(
    postgres_url: str,
) -> None:
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        await apply_migrations(conn)
    windows = [
        (HOUR - timedelta(hours=1), HOUR + timedelta(hours=1)),  # whole hours and none
        (HOUR - timedelta(minutes=30), HOUR + timedelta(minutes=30)),  # minute edges only
        (HOUR - timedelta(seconds=90), HOUR + timedelta(hours=2, seconds=30)),  # both
    ]
    seen: list[int] = []
    async with AsyncConnectionPool(
        postgres_url, min_size=2, max_size=2, open=False, kwargs={"autocommit": True}
    ) as pool:
        writer = asyncio.create_task(_write(postgres_url))
        while not writer.done():
            for start, end in windows:
                rows = await usage.usage(pool, group_by="project", start=start, end=end)
                seen.append(sum(r.requests for r in rows))
                agreed = await usage.agreement(pool, start=start, end=end)
                seen.append(sum(a.requests for a in agreed))
        await writer
        final = await usage.usage(pool, group_by="hour", start=windows[0][0], end=windows[0][1])
    torn = [(i % 6, total) for i, total in enumerate(seen) if total % BATCH]
    assert torn == []
    assert {r.key: r.requests for r in final} == {
        "2026-09-01T10:00:00Z": BATCHES,
        "2026-09-01T11:00:00Z": 2 * BATCHES,
    }


async def test_the_agreements_counts_and_percentiles_are_of_the_same_rows(
    postgres_url: str,
) -> None:
    """Its counts and its histogram are two statements: read at two moments while batches
    landed, the p95 could be of more rows than the counts it was shown beside."""
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        await apply_migrations(conn)
        exact = [_record(10_000 + i, HOUR, counted=10) for i in range(20)]  # no difference
        await ledger.insert_batch(conn, exact)
    window = (HOUR - timedelta(minutes=30), HOUR + timedelta(minutes=30))  # raw rows only
    torn: list[tuple[int, float | None]] = []
    async with AsyncConnectionPool(
        postgres_url, min_size=2, max_size=2, open=False, kwargs={"autocommit": True}
    ) as pool:
        writer = asyncio.create_task(_write(postgres_url, batches=800))
        while not writer.done():
            [agreed] = await usage.agreement(pool, start=window[0], end=window[1])
            off = agreed.compared - len(exact)  # rows 10% over, by the counts
            histogram = [(0.0, len(exact)), *([(0.1, off)] if off else [])]
            if agreed.prompt.p95_abs_relative_diff != usage.percentile_cont(histogram, 0.95):
                torn.append((agreed.compared, agreed.prompt.p95_abs_relative_diff))
        await writer
    assert torn == []
