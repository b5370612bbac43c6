"""The Redis store behind a queue: one script call per tenant per event-loop tick.

Kept apart from `store` (the only module that talks to Redis) because this is about waiters, not
Redis: `BatchingStore` owns each reservation's future, and gives back in full a reservation whose
waiter was cancelled while its batch was on the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from fleet_core.gateway.admission.limits import (
    Charge,
    Decision,
    Hold,
    HoldUpdate,
    StoreUnavailable,
    hash_tag,
)
from fleet_core.gateway.admission.store import Ask, RedisStore

__all__ = ["BatchingStore"]


class BatchingStore:
    """Reservations of one tenant made in the same event-loop tick share one script call.

    Under load many requests are admitted per tick; each still gets its own all-or-nothing
    decision, judged in arrival order, and the round trips per admission drop below one. Nothing
    waits for a batch to fill: the batch is sent at the end of the tick it started in.

    A reservation is all or nothing for its waiter too: one cancelled while the batch was on the
    wire (its client left, or shutdown) is given back in full as soon as Redis admits it, since
    nobody will ever settle it. ``aclose`` waits for batches and give-backs still on the wire.
    """

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        self._queue: list[tuple[Ask, asyncio.Future[Decision]]] = []
        self._sending: set[asyncio.Task[None]] = set()

    def on_lost(self, callback: Callable[[], None]) -> None:
        self._store.on_lost(callback)

    async def reserve(self, charges: Sequence[Charge], holds: Sequence[Hold] = ()) -> Decision:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Decision] = loop.create_future()
        if not self._queue:
            loop.call_soon(self._flush)
        self._queue.append(((charges, holds), future))
        try:
            return await future
        except asyncio.CancelledError:
            # Answered, but cancelled before the waiter resumed: the answer is lost with it.
            # (Its budget holds are the caller's to release: `Admission.admit` does.)
            if future.done() and not future.cancelled() and future.result().admitted:
                self._spawn(self._give_back(charges))
            raise

    def _flush(self) -> None:
        queue, self._queue = self._queue, []
        groups: dict[str, list[tuple[Ask, asyncio.Future[Decision]]]] = {}
        for item in queue:
            charges, holds = item[0]
            first = charges[0].bucket.key if charges else holds[0].key if holds else ""
            groups.setdefault(hash_tag(first), []).append(item)
        for group in groups.values():
            self._spawn(self._send(group))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, group: list[tuple[Ask, asyncio.Future[Decision]]]) -> None:
        try:
            decisions = await self._store.reserve_many([ask for ask, _ in group])
        except StoreUnavailable as exc:
            for _, future in group:
                if not future.done():
                    future.set_exception(exc)
            return
        orphans: list[Charge] = []
        for ((charges, _), future), decision in zip(group, decisions, strict=True):
            if not future.done():
                future.set_result(decision)
            elif decision.admitted:  # its waiter was cancelled: nobody else will give it back
                orphans += charges
        if orphans:
            await self._give_back(orphans)

    async def _give_back(self, charges: Sequence[Charge]) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self._store.settle([Charge(c.bucket, -c.amount) for c in charges])

    async def settle(self, charges: Sequence[Charge], batch_id: str | None = None) -> None:
        await self._store.settle(charges, batch_id)

    async def update_holds(self, updates: Sequence[HoldUpdate]) -> None:
        await self._store.update_holds(updates)

    async def ping(self) -> bool:
        return await self._store.ping()

    async def aclose(self) -> None:
        await asyncio.gather(*self._sending, return_exceptions=True)
        await self._store.aclose()
