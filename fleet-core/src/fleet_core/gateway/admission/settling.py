"""Settlement in the background: token-bucket corrections and budget-entry updates.

A request's settlement (the unused part of its reservation refunded, an overrun charged) and the
updates of this gateway's entries in the budget books never delay a response: `Settlements`
sums them for a short window (`service.SETTLE_WINDOW_S`) and sends them in one store call per
tenant, and the entry updates in one more.

A settlement batch that meets a dead store (or is cut short) is kept (at most `UNSETTLED_CAP`
batches, the oldest dropped and counted beyond that) and sent again with backoff until the store
answers. Each batch carries an id the store applies once, so a batch whose reply was lost (it
may have run) is never applied twice (`store.RedisStore.settle`, ADR 0003). Entry updates the
store failed to take are kept too, and sent again under their batch id with the next touch.

Shutdown (`Settlements.drain`) sends what is still waiting or kept and waits for what is on its
way, for at most its bound however dead the store; what is left then is counted in
``fleet_settlements_dropped_total`` and logged on one line, never lost silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from fleet_core.gateway.admission.limits import (
    Bucket,
    Charge,
    HoldUpdate,
    LimitStore,
    StoreUnavailable,
    hash_tag,
)
from fleet_core.shared import stopping

__all__ = ["SettlementMetrics", "Settlements"]

log = logging.getLogger("fleet.admission")

SETTLE_RETRY_FIRST_S = 0.5
"""The wait before a failed settlement batch is first sent again; it doubles on each failure."""
SETTLE_RETRY_MAX_S = 10.0
"""The longest wait between two sends of failed settlement batches."""
UNSETTLED_CAP = 10_000
"""The most failed settlement batches kept for retry; beyond it the oldest is dropped."""


class SettlementMetrics(Protocol):
    def store_error(self) -> None: ...

    def settlement_dropped(self) -> None: ...


@dataclass(frozen=True, eq=False)
class _Batch:
    """One settlement store call: its id (the store applies it once) and its corrections."""

    id: str
    charges: list[Charge]


class Settlements:
    """Corrections and entry updates summed for ``window_s`` and sent in the background, kept
    and sent again when the store fails, drained at shutdown."""

    def __init__(self, store: LimitStore, metrics: SettlementMetrics, *, window_s: float) -> None:
        self._store = store
        self._metrics = metrics
        self._window_s = window_s
        self._pending: dict[Bucket, int] = {}
        self._pending_holds: dict[tuple[str, str, str], HoldUpdate] = {}
        """Entry updates waiting for the next flush, summed per (book, owner, grant)."""
        self._unsent_holds: deque[list[HoldUpdate]] = deque()
        """Entry-update batches the store failed to take (each under its batch id), oldest
        first: sent again by the next touch (`resend_holds`), applied once however often sent."""
        self._resending_holds = False
        self._flusher: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Future[Any]] = set()
        """Settlements under way: drain awaits them."""
        self._sending: set[_Batch] = set()
        """Settlement batches handed to the store, not yet known to have landed or failed."""
        self._unsettled: deque[_Batch] = deque()
        """Settlement batches the store failed to take, oldest first, waiting for a retry."""
        self._retrier: asyncio.Task[None] | None = None
        self._closing = False
        """Set by `drain`: no more retries in the background."""
        self._landings = 0

    def correct(self, buckets: Sequence[Bucket], delta: int) -> None:
        """Add ``delta`` to each of ``buckets`` in the background.

        Corrections that arrive within ``window_s`` of each other are summed per bucket and sent
        as one store call per tenant (its buckets share one hash tag): under load many
        settlements cost one round trip, never more than one each. Settlement is additive, so
        the sum is the same correction; the only cost is that a refund lands a moment later.
        """
        pending = self._pending
        for bucket in buckets:
            pending[bucket] = pending.get(bucket, 0) + delta
        if self._flusher is None:  # else the flush under way takes this one too
            self._flush_later()

    def resend_holds(self) -> None:
        """Send again the entry updates the store failed to take (with each touch)."""
        if self._unsent_holds and not self._resending_holds and not self._closing:
            self._resending_holds = True
            self._track(asyncio.get_running_loop().create_task(self._resend_holds()))

    def _track(self, task: asyncio.Future[Any]) -> asyncio.Future[Any]:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _resend_holds(self) -> None:
        """Send the kept entry-update batches again, oldest first, until one fails (once per
        refresh interval: a dead store is not hammered)."""
        try:
            while self._unsent_holds and not self._closing:
                if not await self._update_holds(self._unsent_holds.popleft()):
                    return
        finally:
            self._resending_holds = False

    def update_holds(self, updates: Sequence[HoldUpdate]) -> None:
        """Change this gateway's entries by ``updates`` in the background, with the next flush."""
        pending = self._pending_holds
        for update in updates:  # deltas add up; the latest whole figure and longest ttl win
            slot = (update.key, update.owner, update.grant)
            seen = pending.get(slot)
            if seen is not None:
                delta, ttl_ms = seen.delta + update.delta, max(seen.ttl_ms, update.ttl_ms)
                update = msgspec.structs.replace(update, delta=delta, ttl_ms=ttl_ms)
            pending[slot] = update
        self._flush_later()

    def _flush_later(self) -> None:
        if (self._pending or self._pending_holds) and self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_soon())
            self._track(self._flusher)

    async def _flush_soon(self) -> None:
        try:
            await asyncio.sleep(self._window_s)
        finally:
            self._flusher = None
            await self._flush()

    async def _flush(self) -> None:
        pending, self._pending = self._pending, {}
        holds = []
        if self._pending_holds:
            batch = uuid.uuid4().hex
            fresh = self._pending_holds.values()
            holds.append([msgspec.structs.replace(u, batch=batch) for u in fresh])
            self._pending_holds = {}
        batches = _batches(pending)
        self._sending.update(batches)  # until each lands or is kept, even if cut short unstarted
        await asyncio.gather(
            *(self._settle(batch) for batch in batches),
            *(self._update_holds(updates) for updates in holds),
        )

    async def _update_holds(self, updates: list[HoldUpdate]) -> bool:
        """Send one batch of entry updates; whether it landed (if not, it is kept)."""
        landed = False
        try:
            await self._store.update_holds(updates)
            landed = True
        except StoreUnavailable as exc:
            self._metrics.store_error()
            log.warning("could not update budget allowances (kept for a retry): %s", exc)
        finally:  # failed, or cut short: it may not have run; its batch id makes a resend safe
            if not landed and not self._closing:
                if len(self._unsent_holds) >= UNSETTLED_CAP:
                    self._unsent_holds.popleft()  # its entries expire on their own (ttl_s)
                self._unsent_holds.append(updates)  # (in any order: deltas commute)
        return landed

    async def _settle(self, batch: _Batch) -> None:
        landed = False
        try:
            landed = await self._send(batch)
        finally:  # failed, or cut short (shutdown): its reply never came, so it may not have run
            self._sending.discard(batch)
            if not landed:
                self._keep(batch)

    async def _send(self, batch: _Batch) -> bool:
        """Send one batch (again, if it failed before: under the same id); whether it landed."""
        try:
            await self._store.settle(batch.charges, batch.id)
        except StoreUnavailable as exc:
            self._metrics.store_error()
            log.warning("could not settle reservations (kept for a retry): %s", exc)
            return False
        self._landings += 1
        return True

    def _keep(self, batch: _Batch) -> None:
        if len(self._unsettled) >= UNSETTLED_CAP:
            self._unsettled.popleft()
            self._metrics.settlement_dropped()
            log.error("dropped a settlement: %d batches already wait for the store", UNSETTLED_CAP)
        self._unsettled.append(batch)
        if self._retrier is None and not self._closing:
            self._retrier = asyncio.get_running_loop().create_task(self._retry(), name="settle")

    async def _retry(self) -> None:
        """Send the kept batches again, waiting 0.5 s doubling to 10 s, until the store answers.
        Ends when cancelled (even if a cancellation was swallowed on the way) or at shutdown."""
        delay = SETTLE_RETRY_FIRST_S
        try:
            while self._unsettled and not self._closing:
                await asyncio.sleep(delay)
                landed = await self._resend()
                delay = SETTLE_RETRY_FIRST_S if landed else min(2 * delay, SETTLE_RETRY_MAX_S)
                stopping.raise_if_cancelled()
        finally:
            self._retrier = None

    async def _resend(self, deadline: float = math.inf) -> bool:
        """Send the kept batches oldest first; False at the first that fails again, or once
        ``deadline`` (event-loop time) has passed."""
        loop = asyncio.get_running_loop()
        while self._unsettled and loop.time() < deadline:
            batch = self._unsettled[0]
            if not await self._send(batch):
                return False
            if batch in self._unsettled:  # the cap may have dropped it meanwhile
                self._unsettled.remove(batch)
        return not self._unsettled

    @property
    def landings(self) -> int:
        """How many settlement batches have landed so far (for `landed`'s ``since``)."""
        return self._landings

    async def landed(self, *, since: int, within_s: float) -> bool:
        """Whether a refund may have changed the buckets since `landings` read ``since``: one
        landed since, or one was waiting, which this sends now and waits for (at most
        ``within_s``). A refusal asks this before it answers: a refund still in its window, or
        crossing the refused reservation on the wire, is what the bucket really holds."""
        if not (self._pending or self._sending):
            await asyncio.sleep(0)  # an exchange that just ended may settle in this iteration
        if self._pending or self._sending:
            under_way = {*self._tasks, self._track(asyncio.ensure_future(self._flush()))}
            await asyncio.wait(under_way, timeout=within_s)
            return True
        return self._landings != since

    async def drain(self, *, within_s: float) -> None:
        """At shutdown, before the store's client closes: send every settlement still waiting
        or kept after a failure, and wait for those on their way, for at most ``within_s``.
        What is still unsent then is given up: counted in ``fleet_settlements_dropped_total``
        and logged on one line. Never longer than ``within_s`` (plus `stopping.RECANCEL_S`
        for a send cut short), however dead the store."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        self._closing = True
        if self._retrier is not None:  # it may sleep for 10 s: its batches are sent below
            await stopping.stop([self._retrier], within_s=within_s)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                await self._send_all(deadline)
        # Settlements cut short by the deadline keep their batch (`_settle`), counted below.
        await stopping.stop(self._tasks, within_s=stopping.RECANCEL_S)
        self._give_up()

    async def _send_all(self, deadline: float) -> None:
        # A store call under way may settle more (a cancelled reservation): loop.
        while self._tasks or self._pending or self._pending_holds:
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            else:
                await self._flush()
        await self._resend(deadline)

    def _give_up(self) -> None:
        """Count and log what shutdown could not settle (budget holds expire on their own)."""
        unsent = [*self._unsettled, *self._sending, *_batches(self._pending)]
        self._unsettled.clear()
        self._sending.clear()
        self._pending, self._pending_holds = {}, {}
        self._unsent_holds.clear()  # this gateway's entries expire on their own (ttl_s)
        if not unsent:
            return
        for _ in unsent:
            self._metrics.settlement_dropped()
        tokens = sum(abs(charge.amount) for batch in unsent for charge in batch.charges)
        log.error(
            "shutting down with %d settlement batches (%d tokens of bucket corrections) the "
            "rate-limit store did not confirm in time; the buckets refill on their own",
            len(unsent),
            tokens,
        )


def _batches(pending: Mapping[Bucket, int]) -> list[_Batch]:
    """Summed corrections as settlement batches: one per tenant (its buckets share a hash tag)."""
    by_tenant: dict[str, list[Charge]] = {}
    for bucket, amount in pending.items():
        if amount:
            by_tenant.setdefault(hash_tag(bucket.key), []).append(Charge(bucket, amount))
    return [_Batch(uuid.uuid4().hex, charges) for charges in by_tenant.values()]
