"""The writer with the database up: what reaches the ledger, the rollup, and idempotency."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import msgspec
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from fleet_core.gateway.ledger import LedgerWriter, store
from fleet_core.gateway.metering.records import EngineUsage, GatewayCount
from fleet_testing.waiting import eventually

from .conftest import SETTLE_TIMEOUT_S, T0, rejected_bytes, settle, spool_files, totals, usage


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


async def test_a_batch_round_trips_every_field(ledger_url: str, spool_path: Path) -> None:
    engine = EngineUsage(prompt_tokens=120, completion_tokens=30, cached_tokens=100)
    with_engine = usage(1, engine=engine, gateway=GatewayCount(118, 31, "tiktoken"))
    anonymous = usage(2, tenant=None, project=None, gateway=GatewayCount(7, 9, "chars/4"))
    async with LedgerWriter(ledger_url, spool_path=spool_path) as writer:
        writer.record(with_engine)
        writer.record(anonymous)
    assert writer.stats.batches == 1  # both records went in one transaction
    async with await psycopg.AsyncConnection.connect(ledger_url) as conn:
        first = await store.get_row(conn, "req-000001")
        second = await store.get_row(conn, "req-000002")
    assert first is not None
    assert second is not None
    assert (first.received_at, first.first_byte_at, first.done_at) == (
        at(T0 + 0.25),
        at(T0 + 1.0),
        at(T0 + 1.5),
    )
    assert (first.tenant, first.project, first.key_id) == ("acme", "acme/research", "key-1")
    assert (first.model, first.served_model, first.endpoint) == (
        "llama",
        "llama-served",
        "http://engine-a:8000",
    )
    assert (first.kind, first.status, first.outcome, first.stream) == ("chat", 200, "ok", False)
    assert (first.engine_prompt_tokens, first.engine_completion_tokens) == (120, 30)
    assert first.engine_cached_tokens == 100
    assert (first.gw_prompt_tokens, first.gw_completion_tokens, first.count_method) == (
        118,
        31,
        "tiktoken",
    )
    # Billed: the engine's usage when it reported one, split into cached and fresh.
    assert (first.prompt_tokens, first.completion_tokens) == (120, 30)
    assert (first.cached_tokens, first.fresh_tokens, first.units) == (100, 20, None)
    # No engine usage: the gateway's count, nothing cached, and NULL engine columns.
    assert (second.tenant, second.project, second.key_id, second.stream) == (None, None, None, True)
    assert (second.engine_prompt_tokens, second.engine_completion_tokens) == (None, None)
    assert second.engine_cached_tokens is None
    assert (second.prompt_tokens, second.completion_tokens) == (7, 9)
    assert (second.cached_tokens, second.fresh_tokens, second.count_method) == (0, 7, "chars/4")


async def test_the_binary_copy_types_are_the_ledgers_column_types(ledger_url: str) -> None:
    """The rows go in as binary COPY with types named in the store: they must be the table's."""
    async with await psycopg.AsyncConnection.connect(ledger_url) as conn:
        cursor = await conn.execute(
            "SELECT a.attname, t.typname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid"
            " WHERE a.attrelid = 'ledger'::regclass AND a.attnum > 0 AND NOT a.attisdropped"
        )
        table = dict(await cursor.fetchall())
    assert [table[column] for column in store.COLUMNS] == list(store._TYPES)


async def test_text_a_client_chose_round_trips_byte_for_byte(
    ledger_url: str, spool_path: Path
) -> None:
    """Model names and client request ids come from clients: tabs, newlines, backslashes and
    non-ASCII text reach the ledger unchanged (no COPY escaping is ours to get wrong)."""
    awkward = "m\\odel\t\twith\n\r\x08\x0c\x0b·模型 \\N"
    record = msgspec.structs.replace(usage(1, model=awkward), client_request_id=awkward[::-1])
    async with LedgerWriter(ledger_url, spool_path=spool_path) as writer:
        writer.record(record)
    async with await psycopg.AsyncConnection.connect(ledger_url) as conn:
        row = await store.get_row(conn, "req-000001")
    assert row is not None
    assert (row.model, row.served_model, row.client_request_id) == (
        awkward,
        f"{awkward}-served",
        awkward[::-1],
    )


async def test_the_rollup_sums_rows_per_tenant_project_model_and_minute(
    ledger_url: str, spool_path: Path
) -> None:
    engine = EngineUsage(prompt_tokens=50, completion_tokens=5, cached_tokens=10)
    records = [
        usage(1, engine=engine, done_at=T0 + 1),
        usage(2, engine=engine, done_at=T0 + 59.9),
        usage(3, engine=engine, done_at=T0 + 60),  # the next minute
        usage(4, engine=engine, done_at=T0 + 61, model="qwen"),
        usage(5, engine=engine, done_at=T0 + 2, tenant="other", project="other/p"),
    ]
    async with LedgerWriter(ledger_url, spool_path=spool_path) as writer:
        for record in records:
            writer.record(record)
    async with await psycopg.AsyncConnection.connect(ledger_url) as conn:
        minutes = await store.minutes_for_tenant(conn, "acme")
        rows = await store.rows_for_tenant(conn, "acme", since=at(T0 + 60))
    assert [(m.minute, m.model, m.requests) for m in minutes] == [
        (at(T0), "llama", 2),
        (at(T0 + 60), "llama", 1),
        (at(T0 + 60), "qwen", 1),
    ]
    first = minutes[0]
    assert (first.tokens_input, first.tokens_output) == (100, 10)
    assert (first.tokens_cached, first.tokens_fresh, first.units) == (20, 80, 0)
    assert [r.request_id for r in rows] == ["req-000003", "req-000004"]
    count, ledger, rollup = await totals(ledger_url)
    assert count == 5
    assert ledger == rollup


async def test_recording_a_request_twice_keeps_one_row_and_counts_it_once(
    ledger_url: str, spool_path: Path
) -> None:
    record = usage(1, engine=EngineUsage(40, 4, 0))
    async with LedgerWriter(ledger_url, spool_path=spool_path) as writer:
        writer.record(record)
        writer.record(record)  # in the same batch
    async with LedgerWriter(ledger_url, spool_path=spool_path) as again:
        again.record(record)  # a later batch, as a replay after a lost commit would be
        again.record(usage(2))
    assert (writer.stats.written, writer.stats.duplicates) == (1, 1)
    assert (again.stats.written, again.stats.duplicates) == (1, 1)
    count, ledger, rollup = await totals(ledger_url)
    assert count == 2
    assert rollup.requests == 2
    assert ledger == rollup


async def test_batches_are_at_most_batch_size(ledger_url: str, spool_path: Path) -> None:
    async with LedgerWriter(ledger_url, spool_path=spool_path, batch_size=100) as writer:
        for n in range(1000):
            writer.record(usage(n))
        await settle(writer)
    assert writer.stats.written == 1000
    assert 10 <= writer.stats.batches < 1000
    count, ledger, rollup = await totals(ledger_url)
    assert count == 1000
    assert ledger == rollup


async def test_the_writer_can_borrow_the_applications_pool(
    ledger_url: str, spool_path: Path
) -> None:
    async with AsyncConnectionPool(ledger_url, min_size=1, max_size=2, open=False) as pool:
        async with LedgerWriter(pool, spool_path=spool_path) as writer:
            writer.record(usage(1))
        assert not pool.closed  # the pool is its owner's to close
    assert writer.stats.written == 1
    assert (await totals(ledger_url))[0] == 1


async def test_a_full_queue_spills_to_the_spool_and_loses_nothing(
    ledger_url: str, spool_path: Path
) -> None:
    async with LedgerWriter(ledger_url, spool_path=spool_path, queue_limit=10) as writer:
        for n in range(50):  # no await in between: the queue cannot drain meanwhile
            writer.record(usage(n))
        assert writer.stats.spooled == 40
        await settle(writer)
    assert writer.stats.replayed == 40
    assert (await totals(ledger_url))[0] == 50


async def test_a_record_the_database_refuses_is_set_aside_not_the_batch(
    ledger_url: str, spool_path: Path
) -> None:
    async with LedgerWriter(ledger_url, spool_path=spool_path) as writer:
        for n in range(20):
            writer.record(usage(n, model="bad\x00model" if n == 7 else "llama"))
    assert (writer.stats.written, writer.stats.rejected) == (19, 1)
    assert spool_files(spool_path) == {"ledger.jsonl.rejected": 1}
    assert b"req-000007" in rejected_bytes(spool_path)
    assert (await totals(ledger_url))[0] == 19


@pytest.mark.parametrize("size", [1, 500])
async def test_an_empty_writer_closes_cleanly(ledger_url: str, spool_path: Path, size: int) -> None:
    async with LedgerWriter(ledger_url, spool_path=spool_path, batch_size=size) as writer:
        pass
    assert writer.stats == type(writer.stats)()


async def test_a_record_psycopg_cannot_encode_is_set_aside_and_the_writer_carries_on(
    ledger_url: str, spool_path: Path
) -> None:
    """Regression: a figure past int8 raised OverflowError in psycopg's encoder, neither an
    invalid nor an unavailable error, and the writer's task died with every later record
    held in memory. Now it is set aside with its reason like any record the database refuses."""
    async with LedgerWriter(ledger_url, spool_path=spool_path) as writer:
        for n in range(10):
            writer.record(usage(n) if n != 3 else msgspec.structs.replace(usage(n), units=2**70))
        await settle(writer)
        writer.record(usage(10))  # still writing
        await settle(writer)
        assert writer.problem is None
    assert (writer.stats.written, writer.stats.rejected) == (10, 1)
    rejected = rejected_bytes(spool_path)
    assert b"req-000003" in rejected
    assert b"OverflowError" in rejected or b"int too large" in rejected
    assert (await totals(ledger_url))[0] == 10


async def test_a_writer_whose_task_died_says_so(ledger_url: str, spool_path: Path) -> None:
    """Readiness reads `LedgerWriter.problem`: a writer whose task ended (a bug) is a problem,
    a writer closed on purpose is not; what it held still reaches the spool at close."""

    def broken(batch: object) -> None:
        raise RuntimeError("a bug after commit")

    writer = LedgerWriter(ledger_url, spool_path=spool_path, on_commit=broken)
    async with writer:
        assert writer.problem is None
        writer.record(usage(1))
        problem = await eventually(
            lambda: writer.problem, within=SETTLE_TIMEOUT_S, what="the writer's death"
        )
        assert "ledger writer stopped" in problem
        writer.record(usage(2))
    assert writer.problem is None  # closed on purpose
    assert spool_files(spool_path) == {"ledger.jsonl": 1}  # the record after the death
