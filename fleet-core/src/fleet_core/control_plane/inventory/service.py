"""What inventory reports add up to, recomputed from the node list (a report carries no totals).

Pure functions over contract types: a cluster's summary, the ready endpoints per served model the
gateway discovers (``GET /api/v1/endpoints``), and that document's ETag.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from datetime import datetime

import msgspec

from fleet_contract import Endpoint, Engine, InventoryReport
from fleet_core.shared import endpoints
from fleet_core.shared.errors import InvalidRequest

__all__ = [
    "MAX_COUNT",
    "ClusterSummary",
    "Decommission",
    "check_bounds",
    "endpoints_document",
    "etag",
    "require_interval",
    "summarize",
    "total_gpus",
]

MAX_COUNT = 2**31 - 1
"""The largest count a report may carry: the columns that keep counts are Postgres ``integer``
(a larger one would fail there, as a 500, instead of here as a 400)."""


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
    """400 naming the first count (or the GPU total) past ``MAX_COUNT``."""
    for path, value in _counts(report):
        if value > MAX_COUNT:
            raise InvalidRequest(
                f"{path} is {value}; counts in an inventory report are at most {MAX_COUNT}",
                param=path,
                code="out_of_range",
            )


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
        deployments=len(report.deployments),
        deployments_by_phase=dict(Counter(d.phase for d in report.deployments)),
    )


def endpoints_document(reports: Iterable[InventoryReport]) -> endpoints.EndpointsDocument:
    """Ready pod endpoints per served model, merged across clusters, in a stable order."""
    merged: dict[str, tuple[Engine, dict[str, bool]]] = {}
    for report in sorted(reports, key=lambda r: r.cluster_id):
        for deployment in report.deployments:
            _, urls = merged.setdefault(deployment.served_model_name, (deployment.engine, {}))
            for endpoint in deployment.endpoints:
                if endpoint.ready:
                    urls[endpoint.url] = True
    models = tuple(
        endpoints.DiscoveredEndpoints(
            served_model_name=name,
            engine=engine,
            endpoints=tuple(Endpoint(url=u, ready=True) for u in sorted(urls)),
        )
        for name, (engine, urls) in sorted(merged.items())
    )
    return endpoints.EndpointsDocument(models=models)


def etag(body: bytes) -> str:
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
