"""Cost rates and closing months: one transaction per close, serialized by an advisory lock.

Closing measures the month in SQL (``store``), composes the report (``closing``, pure) and keeps
it. Closing again recomputes: identical figures change nothing (so two simultaneous PUTs leave
one report), different ones are booked as corrections into the next month, never rewritten into
the report already issued. Once the next month is closed the earlier one is frozen (409).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from fractions import Fraction

import msgspec
from psycopg_pool import AsyncConnectionPool

from fleet_core.costs import closing
from fleet_core.costs.periods import Period, parse_period
from fleet_core.costs.store import CostStore
from fleet_core.costs.wire import CostPeriodSummary, CostRate, CostReport, RateCreate
from fleet_core.errors import ConfigError, Conflict, InvalidRequest, NotFound

__all__ = ["CostService", "CostSettings", "parse_min_coverage"]

_SHARE = re.compile(r"[01](\.[0-9]{1,9})?|\.[0-9]{1,9}")


@dataclass(frozen=True)
class CostSettings:
    min_coverage: float = 0.95
    """Share of a month's seconds the inventory must have observed, in every cluster, before it
    closes; ``?minCoverage=`` lowers it for one close, and the report says it was forced."""
    max_sample_gap_s: int = 90
    """How long one inventory report vouches for a cluster's GPUs: three 30-second heartbeats.
    The rest of a longer gap is unobserved."""


def cost_settings(env: Mapping[str, str]) -> CostSettings:
    """FLEET_COST_MIN_COVERAGE (0..1) and FLEET_COST_MAX_SAMPLE_GAP_S; ConfigError when invalid."""
    coverage = env.get("FLEET_COST_MIN_COVERAGE", "").strip()
    gap = env.get("FLEET_COST_MAX_SAMPLE_GAP_S", "").strip()
    settings = CostSettings()
    if coverage:
        if not _SHARE.fullmatch(coverage) or not 0 <= Decimal(coverage) <= 1:
            raise ConfigError(
                f"FLEET_COST_MIN_COVERAGE={coverage!r} is not a share between 0 and 1, e.g. 0.95"
            )
        settings = replace(settings, min_coverage=float(coverage))
    if gap:
        if not gap.isdigit() or int(gap) < 1:
            raise ConfigError(
                f"FLEET_COST_MAX_SAMPLE_GAP_S={gap!r} is not a positive number of seconds, e.g. 90"
            )
        settings = replace(settings, max_sample_gap_s=int(gap))
    return settings


def parse_min_coverage(text: str) -> Fraction:
    """A share between 0 and 1 (``0.9``); InvalidRequest naming ``minCoverage`` otherwise."""
    value = Decimal(text) if _SHARE.fullmatch(text) else Decimal("NaN")
    if not value.is_finite() or not 0 <= value <= 1:
        raise InvalidRequest(
            f"minCoverage must be a number from 0 to 1, not {text[:40]!r}", param="minCoverage"
        )
    return Fraction(value)


class CostService:
    def __init__(self, store: CostStore, *, settings: CostSettings) -> None:
        self.store = store
        self.settings = settings
        self.min_coverage = parse_min_coverage(str(settings.min_coverage))

    @classmethod
    def on_pool(cls, pool: AsyncConnectionPool, settings: CostSettings) -> CostService:
        return cls(CostStore(pool), settings=settings)

    async def create_rate(self, new: RateCreate) -> CostRate:
        rate = await self.store.insert_rate("rate_" + secrets.token_hex(6), new)
        if rate is None:
            raise Conflict(
                f"cluster {new.cluster!r} already has a rate from that instant",
                param="effectiveFrom",
                code="already_exists",
            )
        return rate

    async def list_rates(self, cluster: str | None) -> list[CostRate]:
        return await self.store.list_rates(cluster)

    async def get(self, name: str) -> CostReport:
        period = _period(name)
        async with self.store.connection() as conn:
            report = await self.store.get(conn, period)
        if report is None:
            raise NotFound(f"{period.name} has not been closed: PUT it to close it")
        return report

    async def list_periods(self) -> list[CostPeriodSummary]:
        return [
            _summary(_REPORT.decode(body), closed_at, recomputes, frozen_by)
            for _, body, closed_at, recomputes, frozen_by in await self.store.list_periods()
        ]

    async def close(
        self, name: str, *, min_coverage: str | None = None, now: datetime | None = None
    ) -> CostReport:
        period = _period(name)
        asked = self._closing(min_coverage)
        now = now or datetime.now(UTC)
        if period.end > now:
            raise InvalidRequest(
                f"{period.name} is not over until {period.end.isoformat()}; a month closes after"
                " its last second",
                code="period_not_over",
            )
        async with self.store.connection() as conn, conn.transaction():
            await self.store.lock(conn)
            if await self.store.is_closed(conn, period.following()):
                raise Conflict(
                    f"{period.name} is frozen: {period.following().name} has been closed, so"
                    " there is no open month left for a correction to land in",
                    code="period_frozen",
                )
            found = await self.store.measure(conn, period, max_gap_s=self.settings.max_sample_gap_s)
            booked = await self.store.corrections(conn, into=period.name)
            report, allocated = closing.compose(
                period, found, closing=asked, corrections=booked, computed_at=now
            )
            _check_pool(report)  # raising here rolls the transaction back: nothing is stored
            if not await self.store.is_closed(conn, period):
                await self.store.save(conn, report, allocated)
            else:
                before = await self.store.allocations(conn, period)
                changed = closing.differences(before, allocated)
                if changed:
                    await self.store.book(conn, period, allocated, changed, at=now)
            stored = await self.store.get(conn, period)
        assert stored is not None, "saved in this transaction"
        return stored

    def _closing(self, min_coverage: str | None) -> closing.Closing:
        asked = self.min_coverage if min_coverage is None else parse_min_coverage(min_coverage)
        return closing.Closing(min_coverage=asked, threshold=self.min_coverage)


_REPORT = msgspec.json.Decoder(CostReport)


def _period(name: str) -> Period:
    period = parse_period(name)
    if period is None:
        raise NotFound(f"no cost period {name[:40]!r}: periods are calendar months, YYYY-MM")
    return period


def _summary(
    report: CostReport, closed_at: datetime, recomputes: int, frozen_by: str | None
) -> CostPeriodSummary:
    return CostPeriodSummary(
        period=report.period,
        currency=report.currency,
        pool=report.pool,
        busy=report.busy,
        idle=report.idle,
        coverage=report.coverage,
        forced=report.forced,
        closed_at=closed_at,
        recomputes=recomputes,
        frozen_by=frozen_by,
    )


MAX_POOL = 2**53 - 1
"""The largest pool a report may carry: what a JavaScript client reads exactly."""


def _check_pool(report: CostReport) -> None:
    """400 for a month whose pool (the largest figure of a report) clients could not read."""
    if report.pool > MAX_POOL:
        raise InvalidRequest(
            f"the pool of {report.period} would be {report.pool} micro-units, past {MAX_POOL}, "
            "the most a client reads exactly: check the cost rates (GET /api/v1/cost-rates)",
            code="pool_out_of_range",
        )
