"""Ledger ingest: the batch writer (COPY into staging, idempotent insert, rollup, one transaction
per batch) against the obvious alternative, one autocommitted INSERT per request.

Both write the same records into the same table of the same scratch database. The single-row loop
does less work per row (no rollup), so the ratio understates what batching buys. The server is
``FLEET_BENCH_DATABASE_URL`` (a URL allowed to create databases) or whatever the test harness
finds; a ``fleet_bench_<hex>`` database is created for the run and dropped after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg

from bench.gateway_bench import ROUNDS, median
from fleet_core.gateway.ledger import LedgerWriter, store
from fleet_core.gateway.metering.records import EngineUsage, GatewayCount, UsageRecord
from fleet_testing import databases, servers

__all__ = ["report", "run"]

ROWS = int(os.environ.get("FLEET_BENCH_LEDGER_ROWS", "20000"))
T0 = 1_700_000_000.0
_INSERT = (
    f"INSERT INTO ledger ({', '.join(store.COLUMNS)})"
    f" VALUES ({', '.join(['%s'] * len(store.COLUMNS))}) ON CONFLICT (request_id) DO NOTHING"
)


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """A PostgreSQL superuser URL: ``FLEET_BENCH_DATABASE_URL``, else one found or started."""
    with servers.postgres(os.environ, variable="FLEET_BENCH_DATABASE_URL") as server:
        yield server.url


@contextlib.contextmanager
def scratch_database(server: str | None = None) -> Iterator[str]:
    """A new, migrated database on ``server`` (default: `postgres_server`), dropped afterwards."""
    with contextlib.ExitStack() as stack:
        server = server or stack.enter_context(postgres_server())
        yield stack.enter_context(databases.scratch_database(server, migrated=True))


def records(rows: int, round_: int) -> list[UsageRecord]:
    """``rows`` distinct requests spread over tenants, models and minutes, as traffic would be."""
    return [
        UsageRecord(
            request_id=f"bench-{round_}-{n}",
            kind="chat",
            model=f"model-{n % 3}",
            served_model=f"model-{n % 3}",
            endpoint="http://engine:8000",
            status=200,
            outcome="ok",
            stream=n % 2 == 0,
            received_at=T0 + n * 0.01,
            first_byte_at=T0 + n * 0.01 + 0.05,
            done_at=T0 + n * 0.01 + 0.5,
            engine=EngineUsage(200 + n % 50, 40 + n % 20, n % 100) if n % 4 else None,
            gateway=GatewayCount(198 + n % 50, 41 + n % 20, "tiktoken"),
            tenant=f"tenant-{n % 10}",
            project=f"tenant-{n % 10}/p",
            key_id=f"key-{n % 10}",
        )
        for n in range(rows)
    ]


async def _clear(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("TRUNCATE ledger, usage_minute, usage_hour")


async def writer_rate(url: str, batch: list[UsageRecord]) -> float:
    """Rows/s through `LedgerWriter`, from the first record() to the last commit."""
    await _clear(url)
    with tempfile.TemporaryDirectory() as tmp:
        writer = LedgerWriter(url, spool_path=Path(tmp) / "spool", queue_limit=len(batch) + 1)
        async with writer:
            start = time.perf_counter()
            for record in batch:
                writer.record(record)
            await writer.wait_settled()
            elapsed = time.perf_counter() - start
    assert writer.stats.written == len(batch), writer.stats
    return len(batch) / elapsed


async def single_row_rate(url: str, batch: list[UsageRecord]) -> float:
    """Rows/s for one autocommitted INSERT per record on one connection."""
    await _clear(url)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        start = time.perf_counter()
        for record in batch:
            await conn.execute(_INSERT, store.row_values(record))
        elapsed = time.perf_counter() - start
    return len(batch) / elapsed


async def _round(url: str, rows: int, round_: int) -> tuple[float, float]:
    batch = records(rows, round_)
    return await writer_rate(url, batch), await single_row_rate(url, batch)


def run(rows: int = ROWS) -> dict[str, float]:
    """Medians over interleaved rounds, in rows/s."""
    writer: list[float] = []
    single: list[float] = []
    with scratch_database() as url:
        for round_ in range(ROUNDS):
            batched, one_by_one = asyncio.run(_round(url, rows, round_))
            writer.append(batched)
            single.append(one_by_one)
            print(f"bench: ledger round {round_ + 1} of {ROUNDS} done", file=sys.stderr)
    return {
        "rows": float(rows),
        "writer_rows_per_s": median(writer),
        "single_rows_per_s": median(single),
        "speedup": median(writer) / median(single),
    }


def report(figures: dict[str, float]) -> list[str]:
    return [
        "## Ledger ingest",
        "",
        f"{figures['rows']:.0f} usage records into the `ledger` table of one scratch database;",
        "medians of interleaved rounds. The batch writer also keeps both rollups (minute, hour);",
        "the single-row loop does not.",
        "",
        "| path | rows/s |",
        "|---|---|",
        f"| LedgerWriter (COPY + idempotent insert + rollup, 500/batch) "
        f"| {figures['writer_rows_per_s']:.0f} |",
        f"| one INSERT per row, autocommit | {figures['single_rows_per_s']:.0f} |",
        "",
        f"Batching is {figures['speedup']:.1f}x the single-row loop.",
        "",
    ]
