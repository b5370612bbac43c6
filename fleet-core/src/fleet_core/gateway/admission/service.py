"""Admission of one request: authenticate, reserve from every bucket, settle afterwards (P5).

At admission a request reserves 1 request and its token estimate (prompt tokens the gateway
counted + ``max_tokens``, or the policy's default when absent) from every bucket that applies, in
one store call, all or nothing. When the request is over, it is settled to what it really used in
one more call: the unused part refunded, an overrun charged. Budget rules are reserved from this
gateway's allowance in each rule's book (`budgets`), grown in the same store call as the buckets
when it does not cover a request, and updated alongside the settlements.
Settlement runs in the background so it never delays a response; settlements close together
share one store call per tenant.

A settlement batch that meets a dead store (or is cut short) is kept (at most `UNSETTLED_CAP`
batches, the oldest dropped and counted beyond that) and sent again with backoff until the store
answers. Each batch carries an id the store applies once, so a batch whose reply was lost (it
may have run) is never applied twice (`store.RedisStore.settle`, ADR 0003).

Shutdown (`Admission.drain`) sends what is still waiting or kept and waits for what is on its
way, for at most `DRAIN_S` however dead the store; what is left then is counted in
``fleet_settlements_dropped_total`` and logged on one line, never lost silently.

A reservation whose waiter is cancelled (the client left, or shutdown) while its store call is on
the wire is given back by the store when the answer arrives (`batching_store.BatchingStore`); its
budget reservation is given back here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import msgspec

from fleet_core.gateway.admission.budget_book import Amounts, BudgetBook, BudgetHold
from fleet_core.gateway.admission.directory import BudgetRule, Directory, Rates
from fleet_core.gateway.admission.key_ring import Principal
from fleet_core.gateway.admission.limits import (
    Bucket,
    Charge,
    Decision,
    Hold,
    HoldUpdate,
    LimitStore,
    StoreUnavailable,
    hash_tag,
)
from fleet_core.shared import stopping
from fleet_core.shared.errors import RateLimited, ReservationTooLarge, Unavailable

__all__ = ["Admission", "AdmissionMetrics", "BudgetExceeded", "BudgetWait", "Reservation"]

log = logging.getLogger("fleet.admission")
OnStoreError = Literal["closed", "open"]
LEARN_TIMEOUT_S = 5.0
"""How long a request waits for the first figures of a rule it is subject to (a new rule)."""
SETTLE_WINDOW_S = 0.01
"""How long a settlement waits for others to share its round trip. Under load every window
costs at most two store calls (the token refunds and the budget entries' updates), whatever the
number of requests it settles, so a wider window means fewer calls per request; a refund then
lands up to this much later, which can only err on the side of refusing, for a moment, against
per-minute buckets."""
SETTLE_RETRY_FIRST_S = 0.5
"""The wait before a failed settlement batch is first sent again; it doubles on each failure."""
SETTLE_RETRY_MAX_S = 10.0
"""The longest wait between two sends of failed settlement batches."""
UNSETTLED_CAP = 10_000
"""The most failed settlement batches kept for retry; beyond it the oldest is dropped."""
PLAN_CACHE_SIZE = 10_000
"""Principals whose reservation steps are kept; beyond this the cache starts again."""
DRAIN_S = 2.0
"""How long shutdown spends sending the settlements still waiting or kept after a failure."""


BudgetWait = Callable[[BudgetRule, int], Awaitable[float | None]]
"""Seconds until a refusing rule's window frees enough to shed an excess; None if unknown."""


class BudgetExceeded(RateLimited):
    default_code = "budget_exceeded"


class AdmissionMetrics(Protocol):
    def refused(self, *, tenant: str, project: str, level: str, dimension: str) -> None: ...

    def store_error(self) -> None: ...

    def settlement_dropped(self) -> None: ...


@dataclass(frozen=True, eq=False)
class _Batch:
    """One settlement store call: its id (the store applies it once) and its corrections."""

    id: str
    charges: list[Charge]


class Reservation(msgspec.Struct, frozen=True, gc=False):  # in no cycle: see BudgetHold
    principal: Principal
    tokens: int
    """The token estimate reserved; settlement corrects the tpm buckets by (used - tokens)."""
    charges: Sequence[Charge] = ()
    hold: BudgetHold | None = None
    tpm: tuple[Bucket, ...] = ()
    """The tpm buckets ``charges`` took from: what settlement corrects."""


class Admission:
    def __init__(
        self,
        *,
        directory: Directory,
        store: LimitStore,
        metrics: AdmissionMetrics,
        budgets: BudgetBook | None = None,
        budget_wait: BudgetWait | None = None,
        prefix: str = "",
        on_store_error: OnStoreError = "closed",
    ) -> None:
        self._directory = directory
        # The directory's own methods, bound once: every request authenticates and is rated
        # (twice), and a method here that only passed the call on cost a frame each time.
        self.authenticate: Callable[[str | None], Principal] = directory.authenticate
        self.rates: Callable[[str], Rates | None] = directory.rates
        self._store = store
        self._metrics = metrics
        self._budgets = budgets or BudgetBook()
        self._prefix = prefix
        self._on_store_error = on_store_error
        self._pending: dict[Bucket, int] = {}
        self._pending_holds: dict[tuple[str, str, str], HoldUpdate] = {}
        """Entry updates waiting for the next flush, summed per (book, owner, grant)."""
        self._unsent_holds: deque[list[HoldUpdate]] = deque()
        """Entry-update batches the store failed to take (each under its batch id), oldest
        first: sent again by the next touch (`keep_holds`), applied once however often sent."""
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
        self._budget_wait = budget_wait
        self._plans: dict[Principal, _Plan] = {}
        """Each principal's reservation steps, valid while the directory returns the same
        buckets (`_reserve` checks)."""

    @property
    def auth_required(self) -> bool:
        return self._directory.auth_required

    @property
    def default_max_tokens(self) -> int:
        return self._directory.default_max_tokens

    @property
    def budgets(self) -> BudgetBook:
        return self._budgets

    async def ready(self) -> str | None:
        """Why admission cannot work right now, or None. Failing open never blocks readiness."""
        if self._needs_usage():
            return "budget rules' usage not loaded from the ledger yet"
        if self._on_store_error == "open" or await self._store.ping():
            return None
        return "rate limiter store unavailable (FLEET_RATE_ON_STORE_ERROR=closed)"

    def _needs_usage(self) -> bool:
        return not self._budgets.loaded and self._directory.has_rules

    def is_valid_key(self, secret: str) -> bool:
        return self._directory.lookup(secret) is not None

    async def admit(self, principal: Principal, demand: Amounts) -> Reservation:
        """Reserve or refuse: 403 inactive, 429 naming the limit or budget rule, 400 never fits.

        A request whose budget rules this gateway's slack covers takes it here; otherwise its
        allowance grows and the token buckets are taken in one store call, all or nothing, so
        concurrent requests on any gateway cannot all pass one check. A reservation that does
        not complete (refused, store down, caller cancelled) is given back.
        """
        self._directory.check_active(principal)
        tokens = demand.tokens_input + demand.tokens_output
        rules = self._directory.rules(principal)
        hold: BudgetHold | None = None
        asks: list[Hold] = []
        if rules:
            admitted = self._budgets.admit(rules, demand)  # 400 if it can never fit
            if admitted is None:  # a rule the last refresh did not cover
                if not await self._budgets.learn(rules, timeout_s=LEARN_TIMEOUT_S):
                    raise Unavailable(
                        "A budget rule's usage could not be read from the ledger yet; "
                        "retry shortly.",
                        code="budget_usage_unknown",
                    )
                admitted = self._budgets.hold(rules, demand)
            hold, asks = admitted
        try:
            charges, tpm = await self._reserve(principal, tokens, hold, asks)
        except BaseException:
            if hold is not None:
                self._queue_holds(self._budgets.release(hold))
            raise
        if asks and hold is not None and not self._budgets.placed(hold):
            # The store did not answer and admission fails open: whether this gateway's
            # allowance grew is unknown, so the growth is taken back and the request is unheld.
            self._queue_holds(self._budgets.release(hold))
            hold = None
        return Reservation(principal, tokens, charges, hold, tpm)

    async def _reserve(
        self, principal: Principal, tokens: int, hold: BudgetHold | None, holds: Sequence[Hold]
    ) -> tuple[list[Charge], tuple[Bucket, ...]]:
        """The charges taken and their tpm buckets (none when the store failed open)."""
        buckets = self._directory.buckets(principal, prefix=self._prefix)
        plan = self._plans.get(principal)
        if plan is None or plan.buckets is not buckets:
            plan = self._plan(principal, buckets)
        if tokens > plan.most_tokens:
            raise _too_large(plan, tokens)
        charges = [
            charge if charge is not None else Charge(bucket, tokens)
            for bucket, charge in plan.steps
        ]
        if not charges and not holds:
            return charges, ()
        try:
            decision = await self._store.reserve(charges, holds)
        except StoreUnavailable as exc:
            self._store_failed(exc)
            return [], ()
        if decision.refused_hold is not None and hold is not None:
            rule = hold.rules[decision.refused_hold]
            raise await self._budget_refusal(principal, rule, decision.excess)
        if not decision.admitted:
            raise self._refusal(principal, decision)
        return charges, plan.tpm

    def _plan(self, principal: Principal, buckets: Sequence[Bucket]) -> _Plan:
        """What a principal's reservations charge, worked out once per directory answer."""
        if len(self._plans) >= PLAN_CACHE_SIZE:
            self._plans.clear()
        plan = self._plans[principal] = _Plan.of(buckets)
        return plan

    def _track(self, task: asyncio.Future[Any]) -> asyncio.Future[Any]:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _budget_refusal(
        self, principal: Principal, rule: BudgetRule, excess: int
    ) -> BudgetExceeded:
        self._metrics.refused(
            tenant=principal.tenant,
            project=principal.project,
            level=rule.scope_kind,
            dimension=rule.dimension,
        )
        wait = None if self._budget_wait is None else await self._budget_wait(rule, excess)
        when = (
            f"the window frees enough in {wait:.0f}s"
            if wait is not None
            else "requests still in flight hold the rest; retry shortly"
        )
        return BudgetExceeded(
            f"Budget exceeded: rule {rule.id} limits {rule.scope_kind} {rule.scope_id!r} to "
            f"{rule.limit} {rule.dimension} per {_window(rule.window_s)}; this request would "
            f"exceed it by {excess}; {when}.",
            retry_after=wait if wait is not None else 1.0,
        )

    def _refusal(self, principal: Principal, decision: Decision) -> RateLimited:
        refused = decision.refused_by
        assert refused is not None
        self._metrics.refused(
            tenant=principal.tenant,
            project=principal.project,
            level=refused.level,
            dimension=refused.dimension,
        )
        name = principal.tenant
        if refused.level == "project":
            name = f"{principal.tenant}/{principal.project}"
        return RateLimited(
            f"Rate limit reached: {refused.level} {name!r} {refused.dimension} limit of "
            f"{refused.capacity} per minute; retry after {decision.retry_after:.1f}s.",
            retry_after=decision.retry_after,
        )

    def _store_failed(self, exc: Exception) -> None:
        self._metrics.store_error()
        if self._on_store_error == "open":
            log.warning("rate limiter store unavailable, admitting without limits: %s", exc)
            return
        log.error("rate limiter store unavailable, refusing: %s", exc)
        raise Unavailable(
            "The rate limiter is unavailable; retry shortly.", code="rate_limiter_unavailable"
        ) from exc

    def settle(self, reservation: Reservation, used: Amounts, *, request_id: str) -> None:
        """Correct the token buckets and budget allowances to what was used, in the background.

        Corrections that arrive within ``SETTLE_WINDOW_S`` of each other are summed per bucket
        and sent as one store call per tenant (its buckets share one hash tag): under load many
        settlements cost one round trip, never more than one each. Settlement is additive, so
        the sum is the same correction; the only cost is that a refund lands a moment later.
        """
        if reservation.hold is not None:
            grown = self._budgets.settle(reservation.hold, used, request_id=request_id)
            if grown:  # usually not: only a use past the reservation and the slack together
                self._queue_holds(grown)
        else:
            principal = reservation.principal
            self._budgets.settle_unheld(
                principal.tenant, principal.project, used, request_id=request_id
            )
        delta = used.tokens_input + used.tokens_output - reservation.tokens
        if delta == 0:
            return
        pending = self._pending
        for bucket in reservation.tpm:
            pending[bucket] = pending.get(bucket, 0) + delta
        if self._flusher is None:  # else the flush under way takes this one too
            self._flush_later()

    def budgets_refreshed(self, used: Mapping[str, int], started_at: float) -> None:
        """New rollup figures: take what every gateway now reads in the rollups out of this
        gateway's allowances, and give back slack recent use does not need."""
        self._queue_holds(self._budgets.refreshed(used, started_at=started_at))

    def keep_holds(self) -> None:
        """Write this gateway's allowances again before they expire (`BudgetBook.touches`),
        and send again entry updates the store failed to take."""
        self._queue_holds(self._budgets.touches())
        if self._unsent_holds and not self._resending_holds and not self._closing:
            self._resending_holds = True
            self._track(asyncio.get_running_loop().create_task(self._resend_holds()))

    async def _resend_holds(self) -> None:
        """Send the kept entry-update batches again, oldest first, until one fails (once per
        refresh interval: a dead store is not hammered)."""
        try:
            while self._unsent_holds and not self._closing:
                if not await self._update_holds(self._unsent_holds.popleft()):
                    return
        finally:
            self._resending_holds = False

    def _queue_holds(self, updates: Sequence[HoldUpdate]) -> None:
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
            await asyncio.sleep(SETTLE_WINDOW_S)
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

    async def drain(self, *, within_s: float = DRAIN_S) -> None:
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


@dataclass(frozen=True, slots=True)
class _Plan:
    """A principal's buckets as reservation steps: rpm charges made once (always 1), tpm
    buckets charged the request's tokens; ``most_tokens`` is the smallest tpm capacity."""

    buckets: Sequence[Bucket]
    steps: tuple[tuple[Bucket, Charge | None], ...]
    most_tokens: float
    tpm: tuple[Bucket, ...]

    @classmethod
    def of(cls, buckets: Sequence[Bucket]) -> _Plan:
        steps = tuple((b, Charge(b, 1) if b.dimension == "rpm" else None) for b in buckets)
        tpm = [b.capacity for b in buckets if b.dimension == "tpm"]
        # An rpm bucket below 1 refuses every request as too large, whatever its tokens.
        never = any(b.capacity < 1 for b in buckets if b.dimension == "rpm")
        most = -math.inf if never else min(tpm, default=math.inf)
        return cls(buckets, steps, most, tuple(b for b in buckets if b.dimension == "tpm"))


def _too_large(plan: _Plan, tokens: int) -> ReservationTooLarge:
    for bucket, charge in plan.steps:
        amount = 1 if charge is not None else tokens
        if amount > bucket.capacity:
            return ReservationTooLarge(
                f"this request reserves {amount} tokens but the {bucket.level} limit is "
                f"tpm={bucket.capacity}; it can never be admitted: lower max_tokens",
                param="max_tokens",
            )
    raise AssertionError("a plan refused tokens every bucket holds")


def _batches(pending: Mapping[Bucket, int]) -> list[_Batch]:
    """Summed corrections as settlement batches: one per tenant (its buckets share a hash tag)."""
    by_tenant: dict[str, list[Charge]] = {}
    for bucket, amount in pending.items():
        if amount:
            by_tenant.setdefault(hash_tag(bucket.key), []).append(Charge(bucket, amount))
    return [_Batch(uuid.uuid4().hex, charges) for charges in by_tenant.values()]


def _window(seconds: int) -> str:
    for unit, size in (("mo", 30 * 86400), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
