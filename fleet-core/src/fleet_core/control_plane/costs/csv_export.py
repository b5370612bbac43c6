"""A closed month as CSV, for finance: one line per figure, amounts in integer micro-units."""

from __future__ import annotations

import csv
import io

from fleet_core.control_plane.costs.wire import CostReport

__all__ = ["HEADER", "render_csv"]

HEADER = (
    "period",
    "line",
    "tenant",
    "project",
    "fromPeriod",
    "usedGpuMicroseconds",
    "amountMicro",
    "currency",
)


def render_csv(report: CostReport) -> str:
    """pool, busy, idle, then each allocation, unallocated remainder and correction line."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(HEADER)
    cur = report.currency or ""
    for line, amount in (("pool", report.pool), ("busy", report.busy), ("idle", report.idle)):
        writer.writerow((report.period, line, "", "", "", "", amount, cur))
    for a in report.allocations:
        row = (report.period, "allocation", a.tenant, a.project, "", a.used_gpu_microseconds)
        writer.writerow((*(_safe(v) for v in row), a.allocated, cur))
    if report.unallocated:
        writer.writerow((report.period, "unallocated", "", "", "", "", report.unallocated, cur))
    for c in report.corrections:
        fields = (report.period, "correction", c.tenant, c.project, c.from_period, "")
        writer.writerow((*(_safe(v) for v in fields), c.amount, cur))
    return out.getvalue()


def _safe(value: object) -> object:
    """Names a spreadsheet would run as a formula are quoted as text (CSV injection)."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value
