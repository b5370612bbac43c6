"""Fixtures for the ledger tests: a migrated database, record factories, and a way to wait.

Every test runs against a real Postgres (its own database); outages are a `TcpProxy` cut between
the writer and the server, never a mock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from fleet_core.gateway.ledger import LedgerWriter, store
from fleet_core.gateway.metering.records import EngineUsage, GatewayCount, UsageRecord
from fleet_core.shared.storage.migrations import apply_migrations

T0 = 1_699_999_980.0  # 2023-11-14 22:13:00 UTC, the start of a minute
SETTLE_TIMEOUT_S = 15.0

RecordFactory = Callable[..., UsageRecord]


@pytest.fixture
async def ledger_url(postgres_url: str) -> str:
    """A fresh database with every migration applied."""
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        await apply_migrations(conn)
    return postgres_url


@pytest.fixture
def spool_path(tmp_path: Path) -> Path:
    return tmp_path / "spool" / "ledger.jsonl"


def usage(
    n: int,
    *,
    engine: EngineUsage | None = None,
    gateway: GatewayCount | None = None,
    tenant: str | None = "acme",
    project: str | None = "acme/research",
    model: str = "llama",
    done_at: float = T0 + 1.5,
) -> UsageRecord:
    """Request ``n``: distinct ids, token counts that vary with ``n``."""
    return UsageRecord(
        request_id=f"req-{n:06d}",
        kind="chat",
        model=model,
        served_model=f"{model}-served",
        endpoint="http://engine-a:8000",
        status=200,
        outcome="ok",
        stream=n % 2 == 0,
        received_at=done_at - 1.25,
        first_byte_at=done_at - 0.5,
        done_at=done_at,
        engine=engine,
        gateway=gateway or GatewayCount(10 + n % 7, 20 + n % 5, "tiktoken"),
        tenant=tenant,
        project=project,
        key_id="key-1" if tenant else None,
    )


async def settle(writer: LedgerWriter, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
    """Wait until everything recorded so far is committed (the spool replayed included)."""
    async with asyncio.timeout(timeout_s):
        await writer.wait_settled()
    assert writer.settled


def spool_files(spool_path: Path) -> dict[str, int]:
    """The spool and its companions that exist, with their line counts."""
    names = [spool_path.name + suffix for suffix in ("", ".replaying", ".rejected")]
    paths = [spool_path.with_name(name) for name in names]
    return {p.name: p.read_bytes().count(b"\n") for p in paths if p.exists()}


async def totals(url: str) -> tuple[int, store.Totals, store.Totals]:
    """Row count, the ledger's sums and the rollup's sums (after checking that the hourly
    rollup's sums are the minute rollup's: both come from the same inserted rows)."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        rollup = await store.rollup_totals(conn)
        assert await store.hour_totals(conn) == rollup
        return await store.count_rows(conn), await store.ledger_totals(conn), rollup


def rejected_bytes(spool_path: Path) -> bytes:
    return spool_path.with_name(spool_path.name + ".rejected").read_bytes()
