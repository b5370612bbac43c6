"""Database-mode loops stop when cancelled, even as the pool hands them a connection.

CI once saw a gateway's shutdown time out after 60 s: its key-usage loop (`catalog.KeyUsage.run`)
was still sleeping long after the lifespan had cancelled it. The cause, reproduced here on a real
pool and a real Postgres: psycopg_pool waits for a connection with ``asyncio.wait_for``, which on
Python 3.11 returns the connection instead of raising when its task is cancelled in the same loop
iteration as the connection arrives (CPython gh-86296). The loop never learned it was cancelled.

The race is made certain, not waited for: the pool has one connection, held by the test, so the
loop queues for it; the cancellation is sent by a callback on the very wait that the hand-over
completes, then the test gives the connection back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from fleet_core.gateway.admission.catalog import KeyUsage, refresh_budgets
from fleet_core.shared.storage.db import open_pool
from fleet_testing.waiting import eventually

STOP_WITHIN_S = 2.0
"""How soon a cancelled loop must end: a behaviour deadline (it ends at its next round)."""

Loop = Callable[[AsyncConnectionPool], Coroutine[Any, Any, None]]


def _key_usage(pool: AsyncConnectionPool) -> Coroutine[Any, Any, None]:
    usage = KeyUsage(pool, interval_s=0.01)
    usage.seen("key-1")  # something to write, so the round asks the pool
    return usage.run()


def _budgets(pool: AsyncConnectionPool) -> Coroutine[Any, Any, None]:
    return refresh_budgets(pool, lambda used, started: None, interval_s=0.01)


@pytest.fixture
async def pool(postgres_url: str) -> AsyncIterator[AsyncConnectionPool]:
    async with open_pool(postgres_url, max_size=1) as opened:
        yield opened


async def _queued(pool: AsyncConnectionPool) -> None:
    await eventually(
        lambda: pool.get_stats().get("requests_queued", 0) >= 1,
        within=5,
        what="the loop asking the pool",
        interval=0.005,
    )


def _connection_wait() -> asyncio.Task[Any]:
    """The task ``asyncio.wait_for`` made for the pool's wait (CPython 3.11's wait_for wraps the
    awaited coroutine in a task; psycopg_pool awaits a Condition)."""
    [wait] = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "Condition.wait"]
    return wait


@pytest.mark.parametrize("loop", [_key_usage, _budgets], ids=["key-usage", "budgets"])
async def test_a_loop_cancelled_as_the_pool_hands_it_a_connection_stops(
    pool: AsyncConnectionPool, loop: Loop
) -> None:
    held = await pool.getconn()
    task = asyncio.create_task(loop(pool))
    try:
        await _queued(pool)
        _connection_wait().add_done_callback(lambda _: task.cancel())
        await pool.putconn(held)  # the hand-over: the wait completes, and the cancel arrives
        done, _ = await asyncio.wait({task}, timeout=STOP_WITHIN_S)
        assert done, "the loop swallowed its cancellation and runs on"
        assert task.cancelled()
    finally:
        task.cancel()
        await asyncio.wait({task}, timeout=STOP_WITHIN_S)
