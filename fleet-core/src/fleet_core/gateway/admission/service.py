"""Admission of one request: authenticate, reserve from every bucket, settle afterwards (P5).

At admission a request reserves 1 request and its token estimate (prompt tokens the gateway
counted + ``max_tokens``, or the policy's default when absent) from every bucket that applies, in
one store call, all or nothing. When the request is over, it is settled to what it really used in
one more call: the unused part refunded, an overrun charged. Budget rules are reserved from this
gateway's allowance in each rule's book (`budgets`), grown in the same store call as the buckets
when it does not cover a request, and updated alongside the settlements.
Settlement runs in the background so it never delays a response (`settling.Settlements`: summed
for `SETTLE_WINDOW_S`, one store call per tenant, kept and sent again when the store fails, and
drained at shutdown by `Admission.drain` for at most `DRAIN_S`).

A reservation whose waiter is cancelled (the client left, or shutdown) while its store call is on
the wire is given back by the store when the answer arrives (`batching_store.BatchingStore`); its
budget reservation is given back here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import msgspec

from fleet_core.gateway.admission.budget_book import Amounts, BudgetBook, BudgetHold
from fleet_core.gateway.admission.directory import BudgetRule, Directory, Rates
from fleet_core.gateway.admission.key_ring import Principal
from fleet_core.gateway.admission.limits import (
    Bucket,
    Charge,
    Decision,
    Hold,
    LimitStore,
    StoreUnavailable,
)
from fleet_core.gateway.admission.settling import SettlementMetrics, Settlements
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
SETTLED_WAIT_S = 0.05
"""The most a refusal waits for this gateway's own settlements on their way (`_reserve`)."""
PLAN_CACHE_SIZE = 10_000
"""Principals whose reservation steps are kept; beyond this the cache starts again."""
DRAIN_S = 2.0
"""How long shutdown spends sending the settlements still waiting or kept after a failure."""


BudgetWait = Callable[[BudgetRule, int], Awaitable[float | None]]
"""Seconds until a refusing rule's window frees enough to shed an excess; None if unknown."""


class BudgetExceeded(RateLimited):
    default_code = "budget_exceeded"


class AdmissionMetrics(SettlementMetrics, Protocol):
    def refused(self, *, tenant: str, project: str, level: str, dimension: str) -> None: ...


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
        self._settlements = Settlements(store, metrics, window_s=SETTLE_WINDOW_S)
        """Bucket corrections and entry updates, sent in the background."""
        self._budget_wait = budget_wait
        self._plans: dict[Principal, _Plan] = {}
        """Each principal's reservation steps, valid while the directory returns the same
        buckets (`_reserve` checks)."""
        store.on_lost(self.store_lost)

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
                self._settlements.update_holds(self._budgets.release(hold))
            raise
        if asks and hold is not None and not self._budgets.placed(hold):
            # The store did not answer and admission fails open: whether this gateway's
            # allowance grew is unknown, so the growth is taken back and the request is unheld.
            self._settlements.update_holds(self._budgets.release(hold))
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
            landings = self._settlements.landings
            decision = await self._store.reserve(charges, holds)
            if not decision.admitted and await self._settlements.landed(
                since=landings, within_s=SETTLED_WAIT_S
            ):
                # Refunds still in their window (a large request that just finished) are what
                # the buckets really hold: refused without them, Retry-After said 41 s for a
                # request that passed 50 ms later. Once they land, the answer is the true one.
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
        """Correct the token buckets and budget allowances to what was used, in the background
        (`Settlements.correct`: corrections close together share one store call per tenant)."""
        if reservation.hold is not None:
            grown = self._budgets.settle(reservation.hold, used, request_id=request_id)
            if grown:  # usually not: only a use past the reservation and the slack together
                self._settlements.update_holds(grown)
        else:
            principal = reservation.principal
            self._budgets.settle_unheld(
                principal.tenant, principal.project, used, request_id=request_id
            )
        delta = used.tokens_input + used.tokens_output - reservation.tokens
        if delta == 0:
            return
        self._settlements.correct(reservation.tpm, delta)

    def budgets_refreshed(self, used: Mapping[str, int], started_at: float) -> None:
        """New rollup figures: take what every gateway now reads in the rollups out of this
        gateway's allowances, and give back slack recent use does not need."""
        self._settlements.update_holds(self._budgets.refreshed(used, started_at=started_at))

    def store_lost(self) -> None:
        """The store lost its state (ADR 0023): its buckets count as emptied at the loss (the
        scripts do that), and this gateway writes every allowance it holds again now, rather
        than at its next touch, so other gateways judge against them again at once."""
        self._settlements.update_holds(self._budgets.touches(everything=True))

    def keep_holds(self) -> None:
        """Write this gateway's allowances again before they expire (`BudgetBook.touches`),
        and send again entry updates the store failed to take."""
        self._settlements.update_holds(self._budgets.touches())
        self._settlements.resend_holds()

    async def drain(self, *, within_s: float = DRAIN_S) -> None:
        """At shutdown, before the store's client closes: every settlement and entry update
        still waiting is sent, or given up after ``within_s`` (`Settlements.drain`)."""
        await self._settlements.drain(within_s=within_s)


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
                f"tpm={bucket.capacity}; it can never be admitted: shorten the prompt (messages, "
                "tools, schemas) or lower max_tokens",
                param="max_tokens",
            )
    raise AssertionError("a plan refused tokens every bucket holds")


def _window(seconds: int) -> str:
    for unit, size in (("mo", 30 * 86400), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
