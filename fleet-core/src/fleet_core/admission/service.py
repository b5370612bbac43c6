"""Admission of one request: authenticate, reserve from every bucket, settle afterwards (P5).

At admission a request reserves 1 request and its token estimate (prompt tokens the gateway
counted + ``max_tokens``, or the policy's default when absent) from every bucket that applies, in
one store call, all or nothing. When the request is over, it is settled to what it really used in
one more call: the unused part refunded, an overrun charged. Settlement runs in the background so
it never delays a response; settlements close together share one store call per tenant, and
shutdown sends the ones still waiting.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from fleet_core.admission.keys import ANONYMOUS, KeyRing, Principal
from fleet_core.admission.limits import (
    Bucket,
    Charge,
    Decision,
    LimitStore,
    StoreUnavailable,
    hash_tag,
)
from fleet_core.admission.policy import RatePolicy
from fleet_core.errors import RateLimited, ReservationTooLarge, Unavailable

__all__ = ["Admission", "AdmissionMetrics", "Reservation"]

log = logging.getLogger("fleet.admission")
OnStoreError = Literal["closed", "open"]
BUCKET_CACHE_SIZE = 10_000
SETTLE_WINDOW_S = 0.002
"""How long a settlement waits for others to share its round trip."""


class AdmissionMetrics(Protocol):
    def refused(self, *, level: str, dimension: str) -> None: ...

    def store_error(self) -> None: ...


@dataclass(frozen=True)
class Reservation:
    principal: Principal
    tokens: int
    """The token estimate reserved; settlement corrects the tpm buckets by (used - tokens)."""
    charges: Sequence[Charge] = ()


class Admission:
    def __init__(
        self,
        *,
        keys: KeyRing | None,
        policy: RatePolicy,
        store: LimitStore,
        metrics: AdmissionMetrics,
        prefix: str = "",
        on_store_error: OnStoreError = "closed",
    ) -> None:
        self._keys = keys
        self._policy = policy
        self._store = store
        self._metrics = metrics
        self._prefix = prefix
        self._on_store_error = on_store_error
        self._buckets: dict[Principal, list[Bucket]] = {}
        self._pending: dict[Bucket, int] = {}
        self._flusher: asyncio.Task[None] | None = None

    @property
    def auth_required(self) -> bool:
        return self._keys is not None

    @property
    def default_max_tokens(self) -> int:
        return self._policy.default_max_tokens

    def authenticate(self, authorization: str | None) -> Principal:
        return ANONYMOUS if self._keys is None else self._keys.authenticate(authorization)

    async def ready(self) -> str | None:
        """Why admission cannot work right now, or None. Failing open never blocks readiness."""
        if self._on_store_error == "open" or await self._store.ping():
            return None
        return "rate limiter store unavailable (FLEET_RATE_ON_STORE_ERROR=closed)"

    def is_valid_key(self, secret: str) -> bool:
        return self._keys is not None and self._keys.lookup(secret) is not None

    async def admit(self, principal: Principal, tokens: int) -> Reservation:
        """Reserve or refuse: 429 naming the level and dimension, 400 if it can never fit."""
        charges = []
        for bucket in self._buckets_of(principal):
            amount = 1 if bucket.dimension == "rpm" else tokens
            if amount > bucket.capacity:
                raise ReservationTooLarge(
                    f"this request reserves {amount} tokens but the {bucket.level} limit is "
                    f"tpm={bucket.capacity}; it can never be admitted: lower max_tokens",
                    param="max_tokens",
                )
            charges.append(Charge(bucket, amount))
        if not charges:
            return Reservation(principal, tokens)
        try:
            decision = await self._store.reserve(charges)
        except StoreUnavailable as exc:
            return self._store_failed(principal, tokens, exc)
        if not decision.admitted:
            raise self._refusal(principal, decision)
        return Reservation(principal, tokens, charges)

    def _buckets_of(self, principal: Principal) -> list[Bucket]:
        """The policy's buckets for a principal, computed once (the policy is immutable)."""
        found = self._buckets.get(principal)
        if found is None:
            if len(self._buckets) >= BUCKET_CACHE_SIZE:
                self._buckets.clear()
            found = self._buckets[principal] = self._policy.buckets(principal, prefix=self._prefix)
        return found

    def _refusal(self, principal: Principal, decision: Decision) -> RateLimited:
        refused = decision.refused_by
        assert refused is not None
        self._metrics.refused(level=refused.level, dimension=refused.dimension)
        name = principal.tenant
        if refused.level == "project":
            name = f"{principal.tenant}/{principal.project}"
        return RateLimited(
            f"Rate limit reached: {refused.level} {name!r} {refused.dimension} limit of "
            f"{refused.capacity} per minute; retry after {decision.retry_after:.1f}s.",
            retry_after=decision.retry_after,
        )

    def _store_failed(self, principal: Principal, tokens: int, exc: Exception) -> Reservation:
        self._metrics.store_error()
        if self._on_store_error == "open":
            log.warning("rate limiter store unavailable, admitting without limits: %s", exc)
            return Reservation(principal, tokens)
        log.error("rate limiter store unavailable, refusing: %s", exc)
        raise Unavailable(
            "The rate limiter is unavailable; retry shortly.", code="rate_limiter_unavailable"
        ) from exc

    def settle(self, reservation: Reservation, used_tokens: int) -> None:
        """Correct the token buckets to ``used_tokens`` (refund or overrun), in the background.

        Corrections that arrive within ``SETTLE_WINDOW_S`` of each other are summed per bucket
        and sent as one store call per tenant (its buckets share one hash tag): under load many
        settlements cost one round trip, never more than one each. Settlement is additive, so
        the sum is the same correction; the only cost is that a refund lands a moment later.
        """
        delta = used_tokens - reservation.tokens
        if delta == 0:
            return
        for charge in reservation.charges:
            if charge.bucket.dimension == "tpm":
                self._pending[charge.bucket] = self._pending.get(charge.bucket, 0) + delta
        if self._pending and self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_soon())

    async def _flush_soon(self) -> None:
        try:
            await asyncio.sleep(SETTLE_WINDOW_S)
        finally:
            self._flusher = None
            await self._flush()

    async def _flush(self) -> None:
        pending, self._pending = self._pending, {}
        by_tenant: dict[str, list[Charge]] = {}
        for bucket, amount in pending.items():
            if amount:
                by_tenant.setdefault(hash_tag(bucket.key), []).append(Charge(bucket, amount))
        await asyncio.gather(*(self._settle(charges) for charges in by_tenant.values()))

    async def _settle(self, fixes: list[Charge]) -> None:
        try:
            await self._store.settle(fixes)
        except StoreUnavailable as exc:
            self._metrics.store_error()
            log.warning("could not settle reservations: %s", exc)

    async def drain(self) -> None:
        """Send every settlement still waiting (at shutdown)."""
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
        await self._flush()
