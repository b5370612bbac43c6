"""Cost rates and closing months: one transaction per close, on one snapshot, one at a time.

Closing measures the month in SQL (``store``), composes the report (``closing``, pure) and keeps
it. Months close in order, after a grace period; the first close of a month first re-measures
the month before, so its late rows are booked into this one. Closing again recomputes: identical
figures change nothing (so two simultaneous PUTs leave one report), different ones are booked as
corrections into the next month, never rewritten into the report already issued. Once the next
month is closed, re-closing is frozen (409). docs/architecture.md §6 lists the rules.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any

import msgspec
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from fleet_core.control_plane.costs import closing
from fleet_core.control_plane.costs.periods import Period, parse_period
from fleet_core.control_plane.costs.store import CostStore
from fleet_core.control_plane.costs.wire import CostPeriodSummary, CostRate, CostReport, RateCreate
from fleet_core.shared import paging
from fleet_core.shared.errors import ConfigError, Conflict, InvalidRequest, NotFound

__all__ = ["CostService", "CostSettings", "parse_min_coverage"]

_SHARE = re.compile(r"[01](\.[0-9]{1,9})?|\.[0-9]{1,9}")
_GRACE = re.compile(r"([0-9]{1,7})(s|m|h|d)?")
_GRACE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_MAX_GRACE_S = 28 * 86400  # less than the shortest month: the next one must still be open


@dataclass(frozen=True)
class CostSettings:
    min_coverage: float = 0.95
    """Share of a month's seconds the inventory must have observed, in every cluster, before it
    closes; ``?minCoverage=`` lowers it for one close, and the report says it was forced."""
    max_sample_gap_s: int = 90
    """How long one inventory report vouches for a cluster's GPUs: three 30-second heartbeats.
    The rest of a longer gap is unobserved. An operator reporting less often than this is
    refused (400 ``report_interval_too_long``): coverage would be capped without a word."""
    close_grace_s: int = 3600
    """How long after a month's last second it may be closed: requests in flight at midnight
    and spools replayed after a short outage land in the ledger first."""


def cost_settings(env: Mapping[str, str]) -> CostSettings:
    """FLEET_COST_MIN_COVERAGE (0..1), FLEET_COST_MAX_SAMPLE_GAP_S and FLEET_COST_CLOSE_GRACE
    (``0``, ``90s``, ``30m``, ``1h``, ``2d``); ConfigError when invalid."""
    coverage = env.get("FLEET_COST_MIN_COVERAGE", "").strip()
    gap = env.get("FLEET_COST_MAX_SAMPLE_GAP_S", "").strip()
    grace = env.get("FLEET_COST_CLOSE_GRACE", "").strip()
    settings = CostSettings()
    if grace:
        settings = replace(settings, close_grace_s=_grace_seconds(grace))
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


def _grace_seconds(text: str) -> int:
    match = _GRACE.fullmatch(text)
    seconds = int(match[1]) * _GRACE_UNITS[match[2] or "s"] if match else -1
    if not 0 <= seconds <= _MAX_GRACE_S:
        raise ConfigError(
            f"FLEET_COST_CLOSE_GRACE={text!r} is not a duration up to 28d such as 0, 90s, 30m or 1h"
        )
    return seconds


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

    async def list_rates(self, cluster: str | None, page: paging.Page) -> paging.Listing[CostRate]:
        rows = await self.store.list_rates(cluster, page)
        return paging.listing(rows, page, lambda r: (r.cluster, r.effective_from or "-infinity"))

    async def get(self, name: str) -> CostReport:
        period = _period(name)
        async with self.store.connection() as conn:
            report = await self.store.get(conn, period)
        if report is None:
            raise NotFound(f"{period.name} has not been closed: PUT it to close it")
        return report

    async def list_periods(self, page: paging.Page) -> paging.Listing[CostPeriodSummary]:
        rows = [
            (name, _summary(_REPORT.decode(body), closed_at, recomputes, frozen_by))
            for name, body, closed_at, recomputes, frozen_by in await self.store.list_periods(page)
        ]
        listed = paging.listing(rows, page, lambda row: (row[0],))
        return paging.Listing(object="list", data=[s for _, s in listed.data], next=listed.next)

    async def close(
        self, name: str, *, min_coverage: str | None = None, now: datetime | None = None
    ) -> CostReport:
        period = _period(name)
        asked = self._closing(min_coverage)
        now = now or datetime.now(UTC)
        self._require_over(period, now)
        async with self.store.connection() as conn, conn.transaction():
            await self.store.begin_close(conn)
            closed = await self.store.closed(conn)
            if period.name in closed:
                if period.following().name in closed:
                    raise Conflict(
                        f"{period.name} is frozen: {period.following().name} has been closed, so"
                        " there is no open month left for a correction to land in",
                        code="period_frozen",
                    )
                await self._recompute(conn, period, asked, now=now)
            else:
                await self._require_in_order(conn, period, closed)
                if period.previous().name in closed:
                    # late rows of the month before: found now, booked into this one
                    await self._recompute(conn, period.previous(), self._catch_up, now=now)
                await self._issue(conn, period, asked, now=now)
            stored = await self.store.get(conn, period)
        assert stored is not None, "saved in this transaction"
        return stored

    def _require_over(self, period: Period, now: datetime) -> None:
        closable = period.end + timedelta(seconds=self.settings.close_grace_s)
        if closable > now:
            raise InvalidRequest(
                f"{period.name} can be closed from {closable.isoformat()}: a month closes after"
                f" its last second and the {self.settings.close_grace_s} s grace"
                " (FLEET_COST_CLOSE_GRACE) for requests still in flight",
                code="period_not_over",
            )

    async def _require_in_order(
        self, conn: AsyncConnection[Any], period: Period, closed: set[str]
    ) -> None:
        """A first close needs the month before closed, unless the fleet had nothing before."""
        if period.previous().name in closed:
            return
        since = await self.store.data_before(conn, period)
        if since is None:
            return
        first = Period(since.year, since.month)
        while first.name in closed:
            first = first.following()
        raise Conflict(
            f"{period.previous().name} has not been closed and the fleet has usage or capacity"
            f" from {since.date().isoformat()} on: months close in order, so close"
            f" {first.name} first",
            code="previous_period_open",
        )

    async def _issue(
        self, conn: AsyncConnection[Any], period: Period, asked: closing.Closing, *, now: datetime
    ) -> None:
        found = await self.store.measure(conn, period, max_gap_s=self.settings.max_sample_gap_s)
        booked = await self.store.corrections(conn, into=period.name)
        report, allocated = closing.compose(
            period, found, closing=asked, corrections=booked, computed_at=now
        )
        await self.store.save(conn, report, allocated)

    async def _recompute(
        self, conn: AsyncConnection[Any], period: Period, asked: closing.Closing, *, now: datetime
    ) -> None:
        """Measure a closed month again; what changed per project goes to the month after."""
        found = await self.store.measure(conn, period, max_gap_s=self.settings.max_sample_gap_s)
        _, allocated = closing.compose(
            period, found, closing=asked, corrections=[], computed_at=now
        )
        changed = closing.differences(await self.store.allocations(conn, period), allocated)
        if changed:
            await self.store.book(conn, period, allocated, changed, at=now)

    @property
    def _catch_up(self) -> closing.Closing:
        """The month before was issued already: its re-measure refuses nothing on coverage."""
        return closing.Closing(min_coverage=Fraction(0), threshold=self.min_coverage)

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
