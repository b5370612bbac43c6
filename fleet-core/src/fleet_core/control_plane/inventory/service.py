"""What inventory reports add up to, recomputed from the node list (a report carries no totals).

Pure functions over contract types: a cluster's summary, the ready endpoints per served model the
gateway discovers (``GET /api/v1/endpoints``), and that document's ETag.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

import msgspec

from fleet_contract import Endpoint, Engine, InventoryReport
from fleet_core.control_plane.inventory import bindings, cards
from fleet_core.shared import endpoints
from fleet_core.shared.errors import InvalidRequest

__all__ = [
    "LATE_WINDOW",
    "MAX_COUNT",
    "MAX_SKEW",
    "ClusterSummary",
    "Decommission",
    "check_bounds",
    "check_time",
    "endpoints_document",
    "etag",
    "require_interval",
    "summarize",
    "total_gpus",
]

MAX_COUNT = 2**31 - 1
"""The largest count a report may carry: the columns that keep counts are Postgres ``integer``
(a larger one would fail there, as a 500, instead of here as a 400)."""


MAX_SKEW = timedelta(minutes=2)
"""How far ahead of the control plane's clock a report may be dated (clocks drift a little)."""
LATE_WINDOW = timedelta(minutes=15)
"""How far behind the cluster's newest stored report a report may be dated: a retried or queued
heartbeat arrives late, a month-old one is not a heartbeat."""


class ClusterSummary(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    cluster_id: str
    observed_at: str
    reporter_version: str
    nodes: int
    ready_nodes: int
    schedulable_nodes: int
    gpus: int
    gpus_on_ready_nodes: int
    gpus_by_product: dict[str, int]
    mig_slices: dict[str, int]
    cards: str = "0"
    """What the cost pool prices at this instant: whole GPUs plus MIG slices as their share of a
    card, an exact fraction (``"2"``, ``"15/7"``); slices without a share are not in it."""
    deployments: int
    deployments_by_phase: dict[str, int]


class Decommission(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    cluster_id: str
    decommissioned_at: datetime


def total_gpus(report: InventoryReport) -> int:
    """Whole GPUs present in the cluster, counted from its nodes."""
    return sum(gpu.count for node in report.nodes for gpu in node.gpus)


def _counts(report: InventoryReport) -> Iterable[tuple[str, int]]:
    for n, node in enumerate(report.nodes):
        for g, gpu in enumerate(node.gpus):
            yield f"nodes[{n}].gpus[{g}].count", gpu.count
            yield f"nodes[{n}].gpus[{g}].memoryMib", gpu.memory_mib
            for m, mig in enumerate(gpu.mig_slices):
                yield f"nodes[{n}].gpus[{g}].migSlices[{m}].count", mig.count
    for d, deployment in enumerate(report.deployments):
        yield f"deployments[{d}].gpusPerReplica", deployment.gpus_per_replica
        yield f"deployments[{d}].desiredReplicas", deployment.desired_replicas
        yield f"deployments[{d}].readyReplicas", deployment.ready_replicas
    yield "nodes", total_gpus(report)


def check_bounds(report: InventoryReport) -> None:
    """400 naming the first count (or the GPU total) past ``MAX_COUNT``, or the first card
    share out of bounds (`cards.check_shares`: slices count against the same ceiling)."""
    for path, value in _counts(report):
        if value > MAX_COUNT:
            raise InvalidRequest(
                f"{path} is {value}; counts in an inventory report are at most {MAX_COUNT}",
                param=path,
                code="out_of_range",
            )
    cards.check_shares(report, max_cards=MAX_COUNT)


def require_interval(report: InventoryReport, *, max_interval_s: int) -> None:
    """400 when the reporter's heartbeat is slower than one report vouches for capacity."""
    interval = report.report_interval_seconds
    if interval is not None and interval > max_interval_s:
        raise InvalidRequest(
            f"the operator reports every {interval:g} s but one report vouches for capacity for"
            f" {max_interval_s} s: set the operator's --report-interval to at most"
            f" {max_interval_s}s, or raise FLEET_COST_MAX_SAMPLE_GAP_S on the control plane",
            param="reportIntervalSeconds",
            code="report_interval_too_long",
        )


def check_time(
    report: InventoryReport, *, now: datetime, newest: datetime | None,
    closed_until: datetime | None,
) -> None:  # fmt: skip
    """400 naming ``observedAt`` unless it is at most ``MAX_SKEW`` ahead of ``now``, at most
    ``LATE_WINDOW`` behind the cluster's newest stored report, and after the last closed cost
    period (``closed_until``, its end): the time of a report is the cost pool's clock, not the
    operator's to choose."""
    at = report.observed_at
    if at > now + MAX_SKEW:
        _refuse_time(f"is ahead of the control plane's clock ({now.isoformat()}) by more than"
                     f" {MAX_SKEW.total_seconds():g} s: check the cluster's clock")  # fmt: skip
    if newest is not None and at < newest - LATE_WINDOW:
        _refuse_time(f"is more than {LATE_WINDOW.total_seconds():g} s before the cluster's newest"
                     f" report ({newest.isoformat()})")  # fmt: skip
    if closed_until is not None and at < closed_until:
        _refuse_time(f"falls in a closed cost period (closed until {closed_until.isoformat()})")


def _refuse_time(why: str) -> None:
    raise InvalidRequest(
        f"observedAt {why}; a report is dated when it is observed",
        param="observedAt",
        code="observed_at_out_of_range",
    )


def summarize(report: InventoryReport) -> ClusterSummary:
    by_product: Counter[str] = Counter()
    slices: Counter[str] = Counter()
    for node in report.nodes:
        for gpu in node.gpus:
            by_product[gpu.product] += gpu.count
            for mig in gpu.mig_slices:
                slices[mig.profile] += mig.count
    ready = [n for n in report.nodes if n.ready]
    return ClusterSummary(
        cluster_id=report.cluster_id,
        observed_at=report.observed_at.isoformat(),
        reporter_version=report.reporter_version,
        nodes=len(report.nodes),
        ready_nodes=len(ready),
        schedulable_nodes=sum(1 for n in report.nodes if n.schedulable),
        gpus=total_gpus(report),
        gpus_on_ready_nodes=sum(g.count for n in ready for g in n.gpus),
        gpus_by_product=dict(by_product),
        mig_slices=dict(slices),
        cards=str(cards.capacity(report)),
        deployments=len(report.deployments),
        deployments_by_phase=dict(Counter(d.phase for d in report.deployments)),
    )


def endpoints_document(
    reports: Iterable[InventoryReport], bound: Mapping[str, bindings.Binding]
) -> endpoints.EndpointsDocument:
    """Ready pod endpoints per served model and cluster, in a stable order: only what each
    cluster's binding allows *now* (a report accepted under a wider binding loses what the admin
    has since taken away; a cluster without a binding contributes nothing). Deployments of one
    name in one cluster share an entry when they serve the same adapters (ADR 0028)."""
    merged: dict[_EntryKey, tuple[Engine, dict[str, bool]]] = {}
    for report in reports:
        binding = bound.get(report.cluster_id)
        if binding is None:
            continue
        patterns = bindings.parse_patterns(binding.endpoints)
        for deployment in report.deployments:
            if deployment.served_model_name not in binding.served_models:
                continue
            key = (deployment.served_model_name, report.cluster_id,
                   _adapters(deployment.adapters, binding))  # fmt: skip
            _, urls = merged.setdefault(key, (deployment.engine, {}))
            for endpoint in deployment.endpoints:
                if endpoint.ready and bindings.allows_endpoint(patterns, endpoint.url):
                    urls[endpoint.url] = True
    models = tuple(
        endpoints.DiscoveredEndpoints(
            served_model_name=name,
            engine=engine,
            endpoints=tuple(Endpoint(url=u, ready=True) for u in sorted(urls)),
            cluster_id=cluster,
            adapters=tuple(endpoints.DiscoveredAdapter(name=n, index=i) for n, i in adapters),
        )
        for (name, cluster, adapters), (engine, urls) in sorted(merged.items())
    )
    return endpoints.EndpointsDocument(models=models)


_EntryKey = tuple[str, str, tuple[tuple[str, int], ...]]
"""(served model name, cluster, its adapters as (name, index))"""


def _adapters(names: Iterable[str], binding: bindings.Binding) -> tuple[tuple[str, int], ...]:
    """The adapters the binding admits, each with its position in the report (its engine id)."""
    return tuple((n, i) for i, n in enumerate(names) if n in binding.served_models)


def etag(body: bytes) -> str:
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
