"""Closing a month: 10 million ledger rows and 30-second heartbeats from 3 clusters.

The rows are generated in Postgres (``generate_series``) in a scratch database; the close is the
real service call (``CostService.close``, one pooled connection) on that month, timed from the
call to the stored report. Memory: this Python process's peak RSS over the close, and the peak
RSS (``VmHWM``) of the Postgres backend that ran it when /proc shows it (Postgres on this
machine); the bytes Postgres spilled to temporary files are reported too.
``FLEET_BENCH_COST_ROWS`` sets the row count (``FLEET_BENCH_ONLY=costs`` runs this section).
"""

from __future__ import annotations

import asyncio
import os
import resource
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from psycopg_pool import AsyncConnectionPool

from bench.ledger_bench import scratch_database
from fleet_core.control_plane.costs.service import CostService, CostSettings

__all__ = ["report", "run"]

ROWS = int(os.environ.get("FLEET_BENCH_COST_ROWS", "10000000"))
CLUSTERS = 3
GPUS_PER_CLUSTER = 8
REPLICAS_PER_CLUSTER = 4  # two GPUs each
TENANTS = 50
PERIOD = "2026-09"
START = "2026-09-01T00:00:00Z"
END = "2026-10-01T00:00:00Z"
TARGET_S = 60.0
TARGET_BYTES = 1 << 30

_SAMPLES = """
INSERT INTO capacity_samples (cluster_id, observed_at, gpus)
SELECT 'cluster-' || c, t, %(gpus)s
FROM generate_series(1, %(clusters)s) AS c,
     generate_series(%(start)s::timestamptz, %(end)s::timestamptz - interval '30 seconds',
                     interval '30 seconds') AS t
"""
_PLACEMENTS = """
INSERT INTO endpoint_placements (endpoint, cluster_id, gpus_per_replica, first_seen, last_seen)
SELECT 'http://10.' || c || '.0.' || r || ':8000', 'cluster-' || c, 2, %(start)s, %(end)s
FROM generate_series(1, %(clusters)s) AS c, generate_series(1, %(replicas)s) AS r
"""
_RATES = """
INSERT INTO cost_rates (id, cluster_id, gpu_hour_micro, currency)
SELECT 'rate_bench' || c, 'cluster-' || c, 1000000 * c + 200000, 'USD'
FROM generate_series(1, %(clusters)s) AS c
"""
# Request i lands on one of the 12 replicas, spread evenly over the month, lasting 1–20 s, so
# replicas run several requests at once (≈ 10M × 10.5 s / 12 replicas / 30 days ≈ 3.4 in flight).
_LEDGER = """
INSERT INTO ledger (request_id, received_at, done_at, tenant, project, model, served_model,
                    endpoint, kind, status, outcome, stream, gw_prompt_tokens,
                    gw_completion_tokens, count_method, prompt_tokens, completion_tokens,
                    cached_tokens, fresh_tokens)
SELECT 'bench-' || i, t, t + make_interval(secs => 1 + (i * 7919) %% 20 + (i %% 1000) / 1000.0),
       'tenant-' || (i * 31) %% %(tenants)s, 'p' || i %% 3, 'm', 'm',
       'http://10.' || 1 + i %% %(clusters)s || '.0.' || 1 + (i / %(clusters)s) %% %(replicas)s
       || ':8000', 'chat', 200, 'ok', false, 100, 20, 'engine', 100, 20, 0, 100
FROM generate_series(0::bigint, %(rows)s - 1) AS i,
     LATERAL (SELECT %(start)s::timestamptz
                     + make_interval(secs => i * (2592000.0 - 30) / %(rows)s) AS t) AS at
"""


def _seed(url: str, rows: int) -> float:
    params = {
        "rows": rows,
        "clusters": CLUSTERS,
        "replicas": REPLICAS_PER_CLUSTER,
        "tenants": TENANTS,
        "gpus": GPUS_PER_CLUSTER,
        "start": START,
        "end": END,
    }
    began = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in (_SAMPLES, _PLACEMENTS, _RATES, _LEDGER):
            conn.execute(statement, params)
        conn.execute("VACUUM ANALYZE ledger")
        conn.execute("ANALYZE capacity_samples")
    return time.perf_counter() - began


def _peak_rss(pid: int) -> int | None:
    """A process's peak resident set (VmHWM), when /proc shows it."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None


async def _close(url: str) -> dict[str, float]:
    async with AsyncConnectionPool(
        url, min_size=1, max_size=1, open=False, kwargs={"autocommit": True}
    ) as pool:
        await pool.wait()
        async with pool.connection() as conn:
            row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
            temp = await (
                await conn.execute(
                    "SELECT temp_bytes FROM pg_stat_database WHERE datname = current_database()"
                )
            ).fetchone()
        assert row is not None
        assert temp is not None
        service = CostService.on_pool(pool, CostSettings())
        began = time.perf_counter()
        report = await service.close(PERIOD, now=datetime(2026, 11, 1, tzinfo=UTC))
        elapsed = time.perf_counter() - began
        async with pool.connection() as conn:
            after = await (
                await conn.execute(
                    "SELECT temp_bytes FROM pg_stat_database WHERE datname = current_database()"
                )
            ).fetchone()
        backend = _peak_rss(row[0])
    assert report.allocated == report.pool
    assert report.busy + report.idle == report.pool
    return {
        "close_s": elapsed,
        "pool": float(report.pool),
        "busy": float(report.busy),
        "coverage": report.coverage,
        "allocations": float(len(report.allocations)),
        "backend_peak_bytes": float(backend) if backend is not None else -1.0,
        "temp_bytes": float((after[0] if after else 0) - temp[0]),
    }


def run(rows: int = ROWS) -> dict[str, float]:
    with scratch_database() as url:
        print(f"bench: costs: generating {rows} ledger rows", file=sys.stderr)
        seed_s = _seed(url, rows)
        print(f"bench: costs: generated in {seed_s:.0f} s; closing", file=sys.stderr)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        figures = asyncio.run(_close(url))
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        **figures,
        "rows": float(rows),
        "seed_s": seed_s,
        "python_peak_bytes": float(after),
        "python_peak_before_bytes": float(before),
    }


def _mib(value: float) -> str:
    return "not measurable here" if value < 0 else f"{value / (1 << 20):.0f} MiB"


def report(figures: dict[str, float]) -> list[str]:
    ok_time = "meets" if figures["close_s"] < TARGET_S else "misses"
    peak = max(figures["python_peak_bytes"], figures["backend_peak_bytes"])
    ok_memory = "meets" if peak < TARGET_BYTES else "misses"
    return [
        "## Closing a month (cost pool)",
        "",
        f"`PUT /api/v1/cost-periods/{PERIOD}`'s service call on {figures['rows']:.0f} ledger rows"
        f" over {CLUSTERS} clusters × {REPLICAS_PER_CLUSTER} two-GPU replicas, with a month of"
        " 30-second capacity samples per cluster (rows generated in SQL; one run).",
        "",
        "| measure | figure | target |",
        "|---|---|---|",
        f"| close, wall time | {figures['close_s']:.1f} s | < {TARGET_S:.0f} s ({ok_time}) |",
        f"| peak RSS, Python process | {_mib(figures['python_peak_bytes'])} | < 1 GiB |",
        f"| peak RSS, Postgres leader backend | {_mib(figures['backend_peak_bytes'])} | < 1 GiB"
        f" ({ok_memory}) |",
        f"| Postgres temporary files | {_mib(figures['temp_bytes'])} | — |",
        "",
        f"The report: pool {figures['pool']:.0f}, busy {figures['busy']:.0f} micro-USD,"
        f" {figures['allocations']:.0f} allocation lines, coverage {figures['coverage']:.4f}."
        f" Generating the rows took {figures['seed_s']:.0f} s (not part of the close). The"
        " close runs its scan and sort in up to two parallel workers (work_mem 128 MB each),"
        " whose memory the leader's figure does not include.",
        "",
    ]


if __name__ == "__main__":
    print("\n".join(report(run())))
