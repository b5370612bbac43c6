"""The cost-rates and cost-periods API on the wire: money in integer micro-units, always."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import msgspec
from msgspec import Meta

__all__ = [
    "Allocation",
    "ClusterCost",
    "CorrectionLine",
    "CostPeriodSummary",
    "CostRate",
    "CostReport",
    "RateCreate",
    "RateUsed",
    "TenantTotal",
]

Micro = Annotated[int, Meta(ge=0, le=2**53 - 1)]  # exact in a JavaScript client


class RateCreate(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    cluster: Annotated[str, Meta(min_length=1, max_length=253, pattern=r"^[^\x00]+$")]
    gpu_hour_micro: Annotated[Micro, Meta(description="micro-units of currency per GPU-hour")]
    currency: Annotated[str, Meta(pattern=r"^[A-Z]{3}$", description="ISO 4217, e.g. USD")]
    effective_from: Annotated[datetime, Meta(tz=True)] | None = None
    """From when the rate applies; absent: since always (until a later rate for the cluster)."""


class CostRate(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    id: str
    cluster: str
    gpu_hour_micro: int
    currency: str
    effective_from: datetime | None
    created_at: datetime


class RateUsed(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    cluster: str
    gpu_hour_micro: int
    effective_from: datetime | None
    observed_gpu_microseconds: int
    """GPU-time of the period priced at this rate, a MIG slice counting as its part of a card;
    rounded half up to the GPU-µs here, exact in the pool (ADR 0026)."""


class ClusterCost(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    cluster: str
    coverage: float
    """observedSeconds / existedSeconds."""
    observed_seconds: int
    observed_gpu_microseconds: int
    """Observed cards × time: whole GPUs, and MIG slices as their part of a card (rounded half
    up to the GPU-µs here; exact in the pool)."""
    busy_gpu_microseconds: int
    """In-flight time per replica × its GPUs (× the share of a card each is, for MIG slices),
    capped by what was observed."""
    pool: int
    existed_seconds: int = 0
    """The part of the period the cluster existed: from its first report to its decommission,
    or to what its last report vouches for (the whole period if it served and never reported)."""


class Allocation(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    tenant: str
    """'' for requests made without a tenant (an open gateway)."""
    project: str
    used_gpu_microseconds: int
    """This project's share of busy GPU-time (concurrent requests split a replica's time), its
    weight in the split: rounded half up to the GPU-µs here, its part on MIG slices exact in the
    split (ADR 0026)."""
    allocated: int


class CorrectionLine(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    from_period: str
    tenant: str
    project: str
    amount: int
    """Signed: what re-closing ``fromPeriod`` found owed (+) or overcharged (−)."""


class TenantTotal(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    tenant: str
    used_gpu_microseconds: int
    allocated: int
    corrections: int
    due: int
    """allocated + corrections."""


class CostReport(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    period: str
    start: datetime
    end: datetime
    currency: str | None
    pool: int
    busy: int
    idle: int
    allocated: int
    unallocated: int
    """The pool when nobody used the fleet: there is no usage to split it by."""
    coverage: float
    """Share of the period's seconds observed, for the least-observed cluster (0 without any)."""
    min_coverage: float
    forced: bool
    """Closed below the coverage threshold because the client asked (``?minCoverage``)."""
    unplaced_requests: int
    """Ledger requests whose endpoint no inventory report ever listed: not in busy time."""
    rates: list[RateUsed]
    clusters: list[ClusterCost]
    tenants: list[TenantTotal]
    allocations: list[Allocation]
    corrections: list[CorrectionLine]
    """Booked into this period by re-closing the previous one."""
    computed_at: datetime
    closed_at: datetime | None = None
    recomputed_at: datetime | None = None
    recomputes: int = 0
    corrections_booked: list[CorrectionLine] = []
    """Differences found by re-closing this period, booked into the next one."""


class CostPeriodSummary(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    period: str
    currency: str | None
    pool: int
    busy: int
    idle: int
    coverage: float
    forced: bool
    closed_at: datetime
    recomputes: int
    frozen_by: str | None
    """The later period whose closing froze this one, if any."""
