"""A month's report from its measurements: the refusals and the figures, as pure functions.

``compose`` decides everything a close decides — whether the month was watched enough, whether
every cluster with GPUs has a rate, the pool, busy, idle and each project's share — from integers
the store measured, so the rules can be tested without a database.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction

from fleet_core.control_plane.costs import allocation
from fleet_core.control_plane.costs.measuring import Measurements
from fleet_core.control_plane.costs.periods import Period
from fleet_core.control_plane.costs.wire import (
    Allocation,
    ClusterCost,
    CorrectionLine,
    CostReport,
    RateUsed,
    TenantTotal,
)
from fleet_core.shared.errors import InvalidRequest

__all__ = ["MAX_POOL", "Closing", "compose", "coverage_by_cluster", "differences", "existed_us"]

_US = 1_000_000


@dataclass(frozen=True)
class Closing:
    """How a close was asked for."""

    min_coverage: Fraction
    """The threshold applied to this close (``?minCoverage``, else the configured one)."""
    threshold: Fraction
    """The configured threshold: a month closed below it was forced."""


MAX_POOL = 2**53 - 1
"""The largest pool a close issues: what a JavaScript client reads exactly, and far inside the
64-bit columns (a tenant's due adds at most a month of corrections to an allocation)."""


def existed_us(period: Period, found: Measurements, cluster: str) -> int:
    """The part of the month the cluster existed; the whole month for one that served requests
    but never reported (it was there, unwatched)."""
    return found.existed_us.get(cluster) or period.seconds * _US


def coverage_by_cluster(period: Period, found: Measurements) -> dict[str, Fraction]:
    """Every cluster that existed or served in the month, and the share of its lifetime in the
    month that was observed."""
    clusters = (
        {c for c, us in found.existed_us.items() if us}
        | set(found.observed_us)
        | {c for c, us in found.busy_gpu_us.items() if us}
    )
    return {
        c: min(Fraction(found.observed_us.get(c, 0), existed_us(period, found, c)), Fraction(1))
        for c in sorted(clusters)
    }


def compose(
    period: Period,
    found: Measurements,
    *,
    closing: Closing,
    corrections: list[CorrectionLine],
    computed_at: datetime,
) -> tuple[CostReport, dict[tuple[str, str], int]]:
    """The report and the allocation per (tenant, project); InvalidRequest for a refusal."""
    coverage = _require_coverage(period, found, closing)
    currency = _require_rates(found)
    usages = [
        allocation.ClusterUsage(
            cluster=c,
            capacity=[(s.gpu_us, s.gpu_hour_micro) for s in found.slices if s.cluster == c],
            busy_gpu_us=found.busy_gpu_us.get(c, Fraction(0)),
        )
        for c in coverage
    ]
    figures = allocation.price(usages)
    _require_bounded(period, figures)
    used = {k: v for k, v in found.used_gpu_us.items() if v > 0}
    allocated = allocation.allocate(figures.pool, used)
    report = CostReport(
        period=period.name,
        start=period.start,
        end=period.end,
        currency=currency,
        pool=figures.pool,
        busy=figures.busy,
        idle=figures.idle,
        allocated=sum(allocated.values()),
        unallocated=figures.pool - sum(allocated.values()),
        coverage=float(min(coverage.values(), default=Fraction(0))),
        min_coverage=float(closing.min_coverage),
        forced=min(coverage.values(), default=Fraction(0)) < closing.threshold,
        unplaced_requests=found.unplaced,
        rates=_rates(found),
        clusters=[_cluster(period, u, coverage[u.cluster], found, figures) for u in usages],
        tenants=_tenants(used, allocated, corrections),
        allocations=[
            Allocation(
                tenant=t,
                project=p,
                used_gpu_microseconds=allocation.round_half_up(used[(t, p)]),
                allocated=a,
            )
            for (t, p), a in sorted(allocated.items())
        ],
        corrections=corrections,
        computed_at=computed_at,
    )
    return report, allocated


def differences(
    before: dict[tuple[str, str], int], after: dict[tuple[str, str], int]
) -> dict[tuple[str, str], int]:
    """What a re-close changed per (tenant, project); zeros left out."""
    keys = set(before) | set(after)
    changed = {k: after.get(k, 0) - before.get(k, 0) for k in keys}
    return {k: v for k, v in changed.items() if v}


def _require_coverage(period: Period, found: Measurements, closing: Closing) -> dict[str, Fraction]:
    coverage = coverage_by_cluster(period, found)
    weakest = min(coverage.values(), default=Fraction(0))
    if weakest < closing.min_coverage:
        detail = ", ".join(f"{c} {_percent(v)}" for c, v in coverage.items()) or "no cluster"
        raise InvalidRequest(
            f"{period.name} was observed {_percent(weakest)} ({detail}); closing needs "
            f"{_percent(closing.min_coverage)}. Fleet does not close a month it did not watch: "
            "?minCoverage=0 forces it, and the report will say so",
            param="minCoverage",
            code="insufficient_coverage",
        )
    return coverage


def _require_bounded(period: Period, figures: allocation.Figures) -> None:
    if figures.pool > MAX_POOL:
        raise InvalidRequest(
            f"the pool of {period.name} would be {figures.pool} micro-units, past {MAX_POOL}, the"
            " most a client reads exactly: check the cost rates (GET /api/v1/cost-rates) and the"
            " clusters' GPU counts",
            code="pool_out_of_range",
        )


def _require_rates(found: Measurements) -> str | None:
    priced: dict[str, Fraction] = defaultdict(Fraction)
    for s in found.slices:
        priced[s.cluster] += s.gpu_us
    for cluster, gpu_us in sorted(found.capacity_gpu_us.items()):
        if gpu_us > priced.get(cluster, 0):
            raise InvalidRequest(
                f"cluster {cluster!r} had GPUs in this period but no cost rate covers all of it:"
                " POST /api/v1/cost-rates with what one GPU-hour costs there",
                param="cluster",
                code="cost_rate_missing",
            )
    currencies = sorted({s.currency for s in found.slices if s.gpu_us})
    if len(currencies) > 1:
        raise InvalidRequest(
            f"the rates in this period are in several currencies ({', '.join(currencies)});"
            " one pool needs one currency",
            param="currency",
            code="mixed_currencies",
        )
    return currencies[0] if currencies else None


def _percent(value: Fraction) -> str:
    return f"{float(value) * 100:.2f}%"


def _rates(found: Measurements) -> list[RateUsed]:
    return [
        RateUsed(
            cluster=s.cluster,
            gpu_hour_micro=s.gpu_hour_micro,
            effective_from=s.effective_from,
            observed_gpu_microseconds=allocation.round_half_up(s.gpu_us),
        )
        for s in found.slices
        if s.gpu_us
    ]


def _cluster(
    period: Period,
    usage: allocation.ClusterUsage,
    coverage: Fraction,
    found: Measurements,
    figures: allocation.Figures,
) -> ClusterCost:
    return ClusterCost(
        cluster=usage.cluster,
        coverage=float(coverage),
        observed_seconds=found.observed_us.get(usage.cluster, 0) // _US,
        existed_seconds=existed_us(period, found, usage.cluster) // _US,
        observed_gpu_microseconds=allocation.round_half_up(
            found.capacity_gpu_us.get(usage.cluster, Fraction(0))
        ),
        busy_gpu_microseconds=allocation.round_half_up(
            min(Fraction(usage.busy_gpu_us), usage.capacity_gpu_us)
        ),
        pool=figures.by_cluster.get(usage.cluster, 0),
    )


def _tenants(
    used: dict[tuple[str, str], Fraction],
    allocated: dict[tuple[str, str], int],
    corrections: list[CorrectionLine],
) -> list[TenantTotal]:
    busy: dict[str, Fraction] = defaultdict(Fraction)
    rows: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for (tenant, _), gpu_us in used.items():
        busy[tenant] += gpu_us
    for (tenant, _), amount in allocated.items():
        rows[tenant][0] += amount
    for line in corrections:
        rows[line.tenant][1] += line.amount
    return [
        TenantTotal(
            tenant=t,
            used_gpu_microseconds=allocation.round_half_up(busy[t]),
            allocated=a,
            corrections=c,
            due=a + c,
        )
        for t, (a, c) in sorted(rows.items())
    ]
