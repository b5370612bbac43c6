"""Leased token buckets: each gateway process admits most requests from its own slice of a bucket.

With every bucket in Redis, each admission waits for a batched script call
(`batching_store.BatchingStore`) and each settlement rides in another: little Redis time, but
Python on every request (a future, its task wake-up, the script's arguments). `LeasedStore` sits in
front of that store and leases a slice of each bucket it uses: a reservation of the slice through
the same admit script, so Redis counts it like any request's charge. A request then takes its
charges from the slices this process holds, all or nothing over its buckets, without awaiting
anything; settlement corrections (refunds, overruns) go to the slices too. ADR 0016 has the
decision, its bounds and figures.

- Topping up: a slice is topped up in the background once it falls below half of its last size,
  by what this process's requests charged the bucket in the last `AHEAD_S` (at least
  `MIN_REQUESTS` requests' worth), those that fell short of the slice included, never past
  `LEASE_SHARE` of the bucket's capacity (the lease cap). So across N gateways at most N lease
  caps of a bucket sit unused in slices (a little early refusal elsewhere, never an admission
  Redis did not grant), and a crashed gateway loses at most one cap per bucket, which the bucket
  refills in ``60 * LEASE_SHARE`` seconds.
- Giving back: a slice unused for `IDLE_S`, and every slice at ``aclose``, goes back to Redis
  through the exactly-once ``settle`` (a batch id, sent again until it lands).
- Staying exact: a bucket whose lease cap is under two of a request's charges is never leased
  (rpm=5 admits exactly 5 across every gateway); a request that does not fit its slices, and every
  request with budget holds (they are judged in Redis, with the whole reservation, in one call),
  takes the exact path: its full charges through the wrapped store, refused there with the real
  Retry-After.
- Settlements are applied once per batch id even when the wrapped store fails: the part kept
  locally is applied at first sight, and a batch sent again sends only the part for Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from fleet_core.gateway.admission.limits import (
    ADMITTED,
    Bucket,
    Charge,
    Decision,
    Hold,
    HoldUpdate,
    LimitStore,
    StoreUnavailable,
)

__all__ = ["LeasedStore"]

log = logging.getLogger("fleet.admission")

LEASE_SHARE = 0.01
"""The lease cap: the most of a bucket's capacity one process holds in its slice."""
AHEAD_S = 0.5
"""A top-up is sized to this much of the process's recent demand on the bucket. Half of it (the
slice left when a top-up starts) must outlast the top-up's round trip, which on a saturated event
loop is several iterations of tens of milliseconds each (ADR 0016, "Keeping up")."""
MIN_REQUESTS = 4
"""A top-up is at least this many of the last request's charges (within the cap)."""
IDLE_S = 1.0
"""A slice unused this long goes back to Redis."""
SWEEP_S = 0.25
"""How often idle slices are looked for, and failed give-backs sent again."""
REFUSED_WAIT_S = 1.0
"""The longest a refused or failed top-up waits before the next is tried."""
OWED_CAP = 10_000
"""The most give-backs and settlement parts kept for a retry after Redis failed."""


class _Lease:
    """This process's slice of one bucket."""

    __slots__ = (
        "allowance",
        "asking",
        "bucket",
        "cap",
        "last",
        "most",
        "rate",
        "refused_until",
        "seen",
        "seen_at",
        "sized_at",
        "top_up_below",
        "used",
        "used_at_size",
    )

    def __init__(self, bucket: Bucket, cap: int) -> None:
        self.bucket = bucket
        self.cap = cap
        self.most = cap // 2
        """The largest charge taken from the slice (two must fit its cap)."""
        self.allowance = 0
        """Units this process may still take (below zero after an overrun: a debt)."""
        self.top_up_below = 0
        """A local take leaving less than this starts a top-up."""
        self.asking = False
        self.refused_until = 0.0
        self.used = 0
        """Units this process's requests charged the bucket so far, from the slice or (when it
        fell short) the exact way: the demand that sizes top-ups, and the idle check."""
        self.last = 1
        """The charge of the request that last started a top-up here (the smallest useful
        top-up is a few of them)."""
        self.rate = 0.0
        """Recent consumption, units per second."""
        self.used_at_size = 0
        self.sized_at = 0.0
        self.seen = -1
        """``used`` at the last sweep that found the slice in use, and when."""
        self.seen_at = 0.0


def lease_cap(bucket: Bucket) -> int:
    """The most of ``bucket`` one process leases (0: never leased)."""
    return int(bucket.capacity * LEASE_SHARE)


class LeasedStore:
    """A `LimitStore` admitting from per-process slices of the wrapped store's buckets.

    ``reserve`` returns without suspending whenever every charge fits its slice; otherwise it is
    the wrapped store's ``reserve``, unchanged. The wrapped store should be Redis's
    (`batching_store.BatchingStore`): slices of process-local buckets would only add work.
    """

    def __init__(self, store: LimitStore, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._clock = clock
        self._leases: dict[str, _Lease] = {}
        self._owed: dict[str, list[Charge]] = {}
        """Give-backs Redis did not confirm, by batch id, sent again by the sweep."""
        self._remote_of: dict[str, list[Charge]] = {}
        """Settlement batches whose local part is applied and whose Redis part has not landed."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False

    def held(self, key: str) -> int:
        """What this process's slice of bucket ``key`` still allows (for tests and checks)."""
        lease = self._leases.get(key)
        return 0 if lease is None else lease.allowance

    async def reserve(self, charges: Sequence[Charge], holds: Sequence[Hold] = ()) -> Decision:
        if not holds:
            if charges and self._take(charges):
                return ADMITTED
            if not self._closed:  # a request with holds never takes from a slice: none for it
                self._lease_for(charges)
        return await self._store.reserve(charges, holds)

    def _take(self, charges: Sequence[Charge]) -> bool:
        """Take every charge from its slice, or none (a bucket named twice is taken twice).
        A slice left low starts its top-up at once, even if a later charge does not fit and
        this one is given back: it was low, and a top-up asks only for what it misses. Written
        for few operations: every request of a limited tenant passes here."""
        leases = self._leases
        taken = 0
        for charge in charges:
            bucket = charge.bucket
            lease = leases.get(bucket.key)
            amount = charge.amount
            if (
                lease is None
                or amount > lease.allowance
                or amount > lease.most
                or (lease.bucket is not bucket and lease.bucket != bucket)
            ):
                break
            lease.allowance -= amount
            lease.used += amount
            if lease.allowance < lease.top_up_below and not lease.asking:
                self._top_up(lease, amount)
            taken += 1
        else:
            return True
        for charge in charges[:taken]:  # roll back: all or nothing
            lease = leases[charge.bucket.key]
            lease.allowance += charge.amount
            lease.used -= charge.amount
        return False

    def _lease_for(self, charges: Sequence[Charge]) -> None:
        """Start (or top up) the slices of the buckets this request could be admitted from."""
        for charge in charges:
            bucket = charge.bucket
            lease = self._leases.get(bucket.key)
            if lease is not None and lease.bucket != bucket:  # its limit changed
                self._retire(lease)
                lease = None
            if lease is not None:
                lease.used += charge.amount  # demand the slice missed still sizes the next one
            else:
                cap = lease_cap(bucket)
                if cap < 2 * max(charge.amount, 1):
                    continue  # a small bucket stays exact
                lease = self._leases[bucket.key] = _Lease(bucket, cap)
                lease.sized_at = self._clock()
            if not lease.asking and 2 * charge.amount <= lease.cap:
                self._top_up(lease, max(charge.amount, 1))

    def _top_up(self, lease: _Lease, last: int) -> None:
        """Ask for more of the slice; ``last``: the charge of the request that found it low
        (the smallest useful top-up is a few of them)."""
        lease.last = last
        now = self._clock()
        if now < lease.refused_until or self._closed:
            return
        size = self._size(lease, now) - lease.allowance
        if size <= 0:
            return
        lease.asking = True
        self._spawn(self._ask(lease, size))
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def _size(self, lease: _Lease, now: float) -> int:
        """What the slice should hold: ``AHEAD_S`` of recent consumption, within its bounds."""
        elapsed = now - lease.sized_at
        if elapsed > 0.01:
            recent = (lease.used - lease.used_at_size) / elapsed
            lease.rate = recent if lease.rate == 0.0 else (lease.rate + recent) / 2
            lease.used_at_size, lease.sized_at = lease.used, now
        target = max(int(lease.rate * AHEAD_S), MIN_REQUESTS * lease.last)
        target = min(target, lease.cap)
        lease.top_up_below = target // 2
        return target

    async def _ask(self, lease: _Lease, size: int) -> None:
        try:
            decision = await self._store.reserve([Charge(lease.bucket, size)])
        except StoreUnavailable as exc:
            lease.refused_until = self._clock() + REFUSED_WAIT_S
            log.debug("could not top up a rate-limit lease: %s", exc)
            return
        finally:
            lease.asking = False
        if not decision.admitted:
            lease.refused_until = self._clock() + min(decision.retry_after, REFUSED_WAIT_S)
            return
        keep = 0
        if self._leases.get(lease.bucket.key) is lease and not self._closed:
            keep = max(0, min(size, lease.cap - lease.allowance))  # refunds may have come in
            lease.allowance += keep
        if size > keep:  # retired (idle, limit changed, closing) while asking, or over the cap
            await self._give_back(lease.bucket, size - keep)

    async def settle(self, charges: Sequence[Charge], batch_id: str | None = None) -> None:
        """Apply corrections of leased buckets to their slices, the rest in Redis, once per id.

        A slice never grows past its cap: a refund beyond it goes to Redis (which caps it)."""
        remote = self._remote_of.get(batch_id) if batch_id is not None else None
        if remote is None:
            remote = self._settle_locally(charges)
            if batch_id is not None and remote:
                self._remember(self._remote_of, batch_id, remote)
        if remote:
            await self._store.settle(remote, batch_id)
        if batch_id is not None:
            self._remote_of.pop(batch_id, None)

    def _settle_locally(self, charges: Sequence[Charge]) -> list[Charge]:
        remote = []
        for charge in charges:
            lease = self._leases.get(charge.bucket.key)
            if lease is None or lease.bucket != charge.bucket or self._closed:
                remote.append(charge)
                continue
            allowance = lease.allowance - charge.amount
            if allowance > lease.cap:
                remote.append(Charge(charge.bucket, lease.cap - allowance))
                allowance = lease.cap
            lease.allowance = allowance
        return remote

    async def update_holds(self, updates: Sequence[HoldUpdate]) -> None:
        await self._store.update_holds(updates)

    def on_lost(self, callback: Callable[[], None]) -> None:
        self._store.on_lost(callback)

    async def ping(self) -> bool:
        return await self._store.ping()

    async def aclose(self) -> None:
        """Give every slice back (its top-ups still on the wire are given back by the wrapped
        store), then close the wrapped store. What Redis does not take is logged: the buckets
        refill it on their own within ``60 * LEASE_SHARE`` seconds."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for lease in list(self._leases.values()):
            self._retire(lease)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._send_owed()
        if self._owed:
            log.warning(
                "closing with %d rate-limit lease give-backs Redis did not take; the buckets "
                "refill them on their own",
                len(self._owed),
            )
        await self._store.aclose()

    def _retire(self, lease: _Lease) -> None:
        """End a slice: it leaves the table at once, what it holds goes back to Redis."""
        if self._leases.get(lease.bucket.key) is lease:
            del self._leases[lease.bucket.key]
        amount, lease.allowance = lease.allowance, 0
        if amount:
            self._spawn(self._give_back(lease.bucket, amount))

    async def _give_back(self, bucket: Bucket, amount: int) -> None:
        batch_id, charges = uuid.uuid4().hex, [Charge(bucket, -amount)]
        try:
            await self._store.settle(charges, batch_id)
        except StoreUnavailable:
            self._remember(self._owed, batch_id, charges)

    async def _sweep(self) -> None:
        """Give back slices unused for ``IDLE_S``; send failed give-backs again."""
        with contextlib.suppress(asyncio.CancelledError):
            while not self._closed:
                await asyncio.sleep(SWEEP_S)
                now = self._clock()
                for lease in list(self._leases.values()):
                    if lease.used != lease.seen:
                        lease.seen, lease.seen_at = lease.used, now
                    elif not lease.asking and now - lease.seen_at >= IDLE_S:
                        self._retire(lease)
                await self._send_owed()

    async def _send_owed(self) -> None:
        for batch_id, charges in list(self._owed.items()):
            try:
                await self._store.settle(charges, batch_id)
            except StoreUnavailable:
                return
            self._owed.pop(batch_id, None)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    def _remember(kept: dict[str, list[Charge]], batch_id: str, charges: list[Charge]) -> None:
        if len(kept) >= OWED_CAP:
            del kept[next(iter(kept))]  # the oldest: its capacity comes back as buckets refill
        kept[batch_id] = charges
