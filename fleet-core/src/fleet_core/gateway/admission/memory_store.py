"""Token buckets and budget books in process memory: one gateway process, development, tests.

`MemoryStore` decides with the same arithmetic as the Redis scripts (`buckets`, which they
mirror), and applies budget-book growths and updates as ``lib_holds.lua`` does, so one
behavioural suite runs against both stores. Each call runs without awaiting, so asyncio makes it
atomic; nothing here can lose a reply, so batch ids only guard the mirror.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fleet_core.gateway.admission import buckets
from fleet_core.gateway.admission.limits import (
    ADMITTED,
    Charge,
    Decision,
    Hold,
    HoldUpdate,
    merged_charges,
)

__all__ = ["MemoryStore"]

SWEEP_INTERVAL_S = 60.0
"""How often `MemoryStore` forgets expired buckets (a scan of all of them)."""
SLACK_SHARE = 16
"""A growth's slack is at most this share of the rule's room after its need (lib_holds.lua)."""
GRANT_TTL_S = 600.0
"""How long a growth's marker lives, for its undo (lib_holds.lua's MARK_TTL_MS)."""
UNDONE = -1
"""A grant marker's value once its growth was taken back (or given up before it came)."""


@dataclass
class _Book:
    """One budget rule's book in process memory: per gateway, its entry and expiry (clock)."""

    holds: dict[str, tuple[int, float]]

    def live(self, now: float) -> int:
        self.holds = {i: h for i, h in self.holds.items() if h[1] > now}
        return sum(amount for amount, _ in self.holds.values())

    def change(self, owner: str, delta: int, again: int, expires: float) -> None:
        """lib_holds.lua's ``change``: by ``delta`` (never below 0), or made again at
        ``again`` when gone (if ``again`` >= 0)."""
        old = self.holds.get(owner)
        if old is not None:
            self.holds[owner] = (max(0, old[0] + delta), expires)
        elif again >= 0:
            self.holds[owner] = (again, expires)


@dataclass(frozen=True, slots=True)
class _State:
    level: float
    stamp: float
    """Clock reading when ``level`` was last written."""
    expires: float


class MemoryStore:
    """Buckets in process memory. Each call runs without awaiting, so asyncio makes it atomic."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._states: dict[str, _State] = {}
        self._books: dict[str, _Book] = {}
        self._grants: dict[tuple[str, str], tuple[int, float]] = {}
        """(book, grant id) -> (what the growth made, or UNDONE; when the marker expires)."""
        self._batches: set[str] = set()
        """Hold-update batches applied (the process never loses a reply; kept for the mirror)."""
        self._next_sweep = clock() + SWEEP_INTERVAL_S

    def __len__(self) -> int:
        """Buckets held: those touched within their time to live (and not yet swept)."""
        return len(self._states)

    async def reserve(self, charges: Sequence[Charge], holds: Sequence[Hold] = ()) -> Decision:
        now = self._now()
        decision = self._judge(charges, holds, now)
        for hold in holds:
            hold.granted = 0
        if not decision.admitted:
            return decision
        for charge, level in zip(*self._levels(charges, now), strict=True):
            self._write(charge, level, now)
        for hold in holds:
            book = self._book(hold.key)
            room = hold.limit - hold.base - book.live(now) - hold.need
            grown = hold.need + max(0, min(hold.extra, room // SLACK_SHARE))
            if grown > 0:
                book.change(hold.owner, grown, hold.keep + grown, now + hold.ttl_ms / 1000)
                self._grants[(hold.key, hold.grant)] = (grown, now + GRANT_TTL_S)
            hold.granted = grown
        return ADMITTED

    def _judge(self, charges: Sequence[Charge], holds: Sequence[Hold], now: float) -> Decision:
        if holds and self._grants.get((holds[0].key, holds[0].grant), (0,))[0] == UNDONE:
            return Decision(False, refused_hold=0, excess=0)  # its gateway gave it up
        for index, hold in enumerate(holds):
            excess = hold.base + self._book(hold.key).live(now) + hold.need - hold.limit
            if hold.need > 0 and excess > 0:
                return Decision(False, refused_hold=index, excess=excess)
        merged, levels = self._levels(charges, now)
        refusal = buckets.admit(
            levels, [charge.amount for charge in merged], [c.bucket.capacity for c in merged]
        )
        if refusal is not None:
            return Decision(False, merged[refusal.index].bucket, refusal.retry_after)
        return ADMITTED

    def _levels(self, charges: Sequence[Charge], now: float) -> tuple[list[Charge], list[float]]:
        merged = merged_charges(charges)
        return merged, [self._level(charge, now) for charge in merged]

    async def update_holds(self, updates: Sequence[HoldUpdate]) -> None:
        """As holds.lua: each batch once (a batch id seen before is skipped)."""
        now = self._now()
        batches = {update.batch for update in updates if update.batch}
        if batches & self._batches:
            return
        self._batches |= batches
        for update in updates:
            delta = update.delta
            if update.grant:
                grown, _ = self._grants.get((update.key, update.grant), (0, 0.0))
                delta -= max(0, grown)
                self._grants[(update.key, update.grant)] = (UNDONE, now + GRANT_TTL_S)
            expires = now + update.ttl_ms / 1000
            self._book(update.key).change(update.owner, delta, update.keep, expires)

    def held(self, key: str) -> int:
        """The live sum of a rule's entries (for tests and checks)."""
        return self._book(key).live(self._now())

    def _book(self, key: str) -> _Book:
        return self._books.setdefault(key, _Book({}))

    async def settle(self, charges: Sequence[Charge], batch_id: str | None = None) -> None:
        """Apply ``charges``; ``batch_id`` is ignored: a call here never loses its reply."""
        now = self._now()
        for charge in merged_charges(charges):
            self._write(charge, self._level(charge, now), now)

    def on_lost(self, callback: Callable[[], None]) -> None:
        """This store lives and dies with the process: it never loses state on its own."""

    async def ping(self) -> bool:
        return True

    async def aclose(self) -> None:
        self._states.clear()
        self._books.clear()
        self._grants.clear()

    def _now(self) -> float:
        now = self._clock()
        if now >= self._next_sweep:
            self._states = {key: s for key, s in self._states.items() if s.expires > now}
            for book in self._books.values():
                book.live(now)
            self._books = {key: book for key, book in self._books.items() if book.holds}
            self._grants = {key: g for key, g in self._grants.items() if g[1] > now}
            self._batches.clear()  # a batch is sent again within seconds, never a sweep later
            self._next_sweep = now + SWEEP_INTERVAL_S
        return now

    def _level(self, charge: Charge, now: float) -> float:
        state, capacity = self._states.get(charge.bucket.key), charge.bucket.capacity
        if state is None:
            return float(capacity)
        return buckets.refill(state.level, now - state.stamp, capacity)

    def _write(self, charge: Charge, level: float, now: float) -> None:
        capacity = charge.bucket.capacity
        new = buckets.apply(level, charge.amount, capacity)
        self._states[charge.bucket.key] = _State(new, now, now + buckets.ttl(new, capacity))
