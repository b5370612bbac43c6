"""The console's calls at scale: 10 million ledger rows (and their per-minute rollups), timed
over HTTP against a real control plane process, as the console makes them.

The rows are the cost bench's (``costs_bench``: a month, 50 tenants × 3 projects, generated in
SQL); the rollups are built from them with the ledger writer's grouping. Each call is made
``CALLS`` times in a row after one warm-up, and its p50 and p95 reported against the issue's
target (p95 ≤ 200 ms). ``FLEET_BENCH_CONSOLE_ROWS`` sets the row count
(``FLEET_BENCH_ONLY=console`` runs this section).
"""

from __future__ import annotations

import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psycopg

from bench import costs_bench
from bench.ledger_bench import scratch_database
from fleet_core.shared import paging
from fleet_core.shared.storage import migrations
from fleet_testing import processes

__all__ = ["report", "run"]

ROWS = int(os.environ.get("FLEET_BENCH_CONSOLE_ROWS", "10000000"))
CALLS = 20
TARGET_MS = 200.0
REFERENCE = (
    "usage agreement, one day, from raw rows as before migration 0016 (SQL only; for reference)"
)
"""The agreement as it was read before its rollups: the figure they are judged against, not a call
the console makes."""
_ROLLUPS = """
INSERT INTO usage_minute (tenant, project, model, minute, requests, tokens_input, tokens_output,
                          tokens_cached, tokens_fresh, units)
SELECT coalesce(tenant, ''), coalesce(project, ''), model, date_trunc('minute', done_at, 'UTC'),
       count(*), sum(prompt_tokens), sum(completion_tokens), sum(cached_tokens),
       sum(fresh_tokens), 0
FROM ledger WHERE outcome <> 'refused' GROUP BY 1, 2, 3, 4
"""
# The hourly rollups as migration 0015 backfills them: the sums of the minute rows.
_HOURS = """
INSERT INTO usage_hour (tenant, project, model, hour, requests, tokens_input, tokens_output,
                        tokens_cached, tokens_fresh, units)
SELECT tenant, project, model, date_trunc('hour', minute, 'UTC'), sum(requests),
       sum(tokens_input), sum(tokens_output), sum(tokens_cached), sum(tokens_fresh), sum(units)
FROM usage_minute GROUP BY 1, 2, 3, 4
"""
_TENANTS = """
INSERT INTO tenants (id, name) SELECT 'tenant-' || t, 'Tenant ' || t
FROM generate_series(0, %(tenants)s - 1) AS t
"""
_PROJECTS = """
INSERT INTO projects (id, tenant_id, name)
SELECT 'tenant-' || t || '/p' || p, 'tenant-' || t, 'p' || p
FROM generate_series(0, %(tenants)s - 1) AS t, generate_series(0, 2) AS p
"""
# Lists that grow, beyond what the cost bench's month needs: many tenants, projects and keys.
LIST_TENANTS = 10_000
LIST_KEYS = 100_000
_MORE = (
    "INSERT INTO tenants (id, name) SELECT 'list-' || lpad(t::text, 6, '0'), 'List ' || t"
    " FROM generate_series(1, %(tenants)s) AS t",
    "INSERT INTO projects (id, tenant_id, name) SELECT id || '/p', id, 'p' FROM tenants"
    " WHERE id LIKE 'list-%%'",
    "INSERT INTO api_keys (id, project_id, label, prefix, secret_hash, created_at)"
    " SELECT 'key_' || k, 'tenant-' || k %% 50 || '/p' || k %% 3, 'bench', 'fk_bench',"
    " sha256(('bench-' || k)::bytea), timestamptz '2026-09-01' + make_interval(secs => k)"
    " FROM generate_series(1, %(keys)s) AS k",
    "ANALYZE tenants",
    "ANALYZE projects",
    "ANALYZE api_keys",
)
# Where each list's deep page starts: the key of its middle row, as the list orders it.
_MIDDLE = {
    "tenants": "SELECT id FROM tenants ORDER BY id OFFSET (SELECT count(*) / 2 FROM tenants)",
    "projects": "SELECT id FROM projects ORDER BY id OFFSET (SELECT count(*) / 2 FROM projects)",
    "keys": "SELECT created_at, id FROM api_keys ORDER BY created_at, id"
    " OFFSET (SELECT count(*) / 2 FROM api_keys)",
}
MONTH = "from=2026-09-01T00:00:00Z&to=2026-10-01T00:00:00Z"
DAY = "from=2026-09-15T00:00:00Z&to=2026-09-16T00:00:00Z"
CONSOLE_CALLS = (
    ("whoami (sign-in)", "/api/v1/whoami"),
    ("tenants, first page", "/api/v1/tenants"),
    ("projects, first page", "/api/v1/projects"),
    ("keys, first page", "/api/v1/keys"),
    ("budget rules", "/api/v1/budget-rules"),
    ("usage by hour, one day", f"/api/v1/usage?groupBy=hour&{DAY}"),
    ("usage by day, a month", f"/api/v1/usage?groupBy=day&{MONTH}"),
    ("usage by model, a month", f"/api/v1/usage?groupBy=model&{MONTH}"),
    ("usage by project, a month", f"/api/v1/usage?groupBy=project&{MONTH}"),
    ("usage of one tenant, a month", f"/api/v1/usage?groupBy=day&tenantId=tenant-7&{MONTH}"),
    ("usage agreement, one day", f"/api/v1/usage-agreement?{DAY}"),
    ("cost rates", "/api/v1/cost-rates"),
    ("closed months", "/api/v1/cost-periods"),
    ("inventory", "/api/v1/inventory"),
    ("models", "/api/v1/models"),
)


def _agreement_backfill() -> bytes:
    """The usage agreement's rollups as migration 0016 backfills them from the ledger."""
    (text,) = (m.sql for m in migrations.available() if m.version == 16)
    return text[text.index("INSERT INTO agreement_hour") : text.index("-- Lists")].encode()


def _seed(url: str, rows: int) -> float:
    began = time.perf_counter()
    costs_bench._seed(url, rows)  # the ledger, capacity samples, placements and rates
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_TENANTS, {"tenants": costs_bench.TENANTS})
        conn.execute(_PROJECTS, {"tenants": costs_bench.TENANTS})
        conn.execute(_ROLLUPS)
        conn.execute(_HOURS)
        for statement in _MORE:
            conn.execute(statement, {"tenants": LIST_TENANTS, "keys": LIST_KEYS})
        conn.execute(_agreement_backfill())
        conn.execute("VACUUM ANALYZE usage_minute")
        conn.execute("VACUUM ANALYZE usage_hour")
        conn.execute("VACUUM ANALYZE agreement_hour")
        conn.execute("VACUUM ANALYZE agreement_diff_hour")
    return time.perf_counter() - began


# The usage agreement as it was computed before migration 0016: every raw ledger row of the day.
_RAW_AGREEMENT = """
SELECT model, count(*), count(engine_prompt_tokens), avg(p),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY abs(p)), avg(c),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY abs(c)), array_agg(DISTINCT count_method)
FROM (SELECT *, (gw_prompt_tokens - engine_prompt_tokens)::float8
                / greatest(engine_prompt_tokens, 1) AS p,
                (gw_completion_tokens - engine_completion_tokens)::float8
                / greatest(engine_completion_tokens, 1) AS c FROM ledger
      WHERE done_at >= '2026-09-15T00:00:00Z' AND done_at < '2026-09-16T00:00:00Z'
        AND outcome <> 'refused') AS day
GROUP BY model
"""


def _agreement_before_after(base: str, token: str, url: str) -> dict[str, tuple[float, float]]:
    """The agreement from its rollups (HTTP) and from raw rows (SQL only, no HTTP), interleaved
    call by call, so the machine's load weighs on both alike."""
    took: dict[str, list[float]] = {"rollups": [], "raw": []}
    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base, headers=auth) as http, psycopg.connect(url) as conn:
        for _ in range(CALLS + 1):
            began = time.perf_counter()
            assert http.get(f"/api/v1/usage-agreement?{DAY}", timeout=60).status_code == 200
            took["rollups"].append((time.perf_counter() - began) * 1000)
            began = time.perf_counter()
            conn.execute(_RAW_AGREEMENT).fetchall()
            took["raw"].append((time.perf_counter() - began) * 1000)
    return {
        "usage agreement, one day, from rollups (interleaved)": _cuts(took["rollups"][1:]),
        REFERENCE: _cuts(took["raw"][1:]),
    }


def _cuts(took: list[float]) -> tuple[float, float]:
    return statistics.median(took), statistics.quantiles(took, n=20)[18]


def _deep_pages(url: str) -> list[tuple[str, str]]:
    """Each growing list's page from its middle row on (a keyset page costs what the first does)."""
    calls = []
    with psycopg.connect(url) as conn:
        for name, query in _MIDDLE.items():
            row = conn.execute(query).fetchone()
            assert row is not None
            after = paging.cursor(list(row))
            calls.append((f"{name}, a deep page", f"/api/v1/{name}?limit=100&after={after}"))
    return calls


def _time_calls(
    base: str, token: str, calls: list[tuple[str, str]]
) -> dict[str, tuple[float, float]]:
    figures = {}
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}) as http:
        for name, path in calls:
            assert http.get(path, timeout=60).status_code == 200, path  # warm-up
            took = []
            for _ in range(CALLS):
                began = time.perf_counter()
                response = http.get(path, timeout=60)
                took.append((time.perf_counter() - began) * 1000)
                assert response.status_code == 200, (path, response.text)
            figures[name] = _cuts(took)
    return figures


def run(rows: int = ROWS) -> dict[str, object]:
    token = "bench-admin-" + secrets.token_urlsafe(16)
    with scratch_database() as url:
        print(f"bench: console: generating {rows} ledger rows and their rollups", file=sys.stderr)
        seed_s = _seed(url, rows)
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT count(*) FROM usage_minute").fetchone()
        rollups = int(row[0]) if row else 0
        env = {"FLEET_DATABASE_URL": url, "FLEET_ADMIN_TOKEN": token, "FLEET_ACCESS_LOG": "false"}
        with (
            tempfile.TemporaryDirectory(prefix="fleet-bench-console-") as logs,
            processes.processes(Path(logs)) as procs,
        ):
            base = processes.control_plane(procs, env)
            calls = _time_calls(base, token, [*CONSOLE_CALLS, *_deep_pages(url)])
            calls |= _agreement_before_after(base, token, url)
            load = os.getloadavg()[0]
    return {"rows": rows, "rollups": rollups, "seed_s": seed_s, "calls": calls, "load": load}


def report(figures: dict[str, object]) -> list[str]:
    calls = figures["calls"]
    assert isinstance(calls, dict)
    lines = [
        "## Console calls at scale",
        "",
        f"Each call the console makes, {CALLS} times in a row over HTTP against a control plane"
        f" process, on {figures['rows']} ledger rows over a month (50 tenants × 3 projects) and"
        f" their {figures['rollups']} per-minute rollup rows, with their hourly sums and the"
        " usage agreement's hourly rollups; lists with"
        f" {LIST_TENANTS + 50} tenants, {LIST_TENANTS + 150} projects and {LIST_KEYS} keys"
        " (a list's first page, and the 100 rows after its middle row; generated"
        f" in SQL in {float(str(figures['seed_s'])):.0f} s; one run).",
        "",
        "| call | p50 | p95 | target p95 ≤ 200 ms |",
        "|---|---|---|---|",
    ]
    for name, (p50, p95) in calls.items():
        verdict = "—" if name == REFERENCE else "meets" if p95 <= TARGET_MS else "misses"
        lines.append(f"| {name} | {p50:.0f} ms | {p95:.0f} ms | {verdict} |")
    note = (
        "The usage calls read the hourly rollups (usage_hour) for whole hours and the per-minute"
        " rollups only for a window's partial edge hours. The usage agreement reads its own"
        " hourly rollups (counts, sums and an exact histogram of differences, migration 0016)"
        " and raw ledger rows only for partial edge hours. Lists page by keyset on an index,"
        " so a deep page costs what the first does."
    )
    load = f" Load average {float(str(figures['load'])):.1f} on the 2 cores after the timed calls."
    return [*lines, "", note + load, ""]


if __name__ == "__main__":
    print("\n".join(report(run())))
