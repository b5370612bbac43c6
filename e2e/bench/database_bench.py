"""Database mode (issue 5): the gateway with keys, limits, budget rules and rates from Postgres
versus the same limits from the environment, and budget admission with an empty ledger versus
one of millions of rows.

Targets: database-mode throughput at c=64 >= 85% of environment mode (same Redis buckets; the
database mode adds budget rules, rates and a ledger row per request); budget-rule admission
latency with ``FLEET_BENCH_BUDGET_ROWS`` (default 5 million) ledger rows within 20% of an empty
ledger — admission reads rollup sums kept in memory, so only the background refresh touches the
rows' rollups, and its query time is shown too.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg

from bench import generator, stub
from bench.admission_bench import redis_url
from bench.gateway_bench import (
    ROUNDS,
    Cell,
    free_port,
    load,
    load_average,
    median,
    process,
    summary,
)
from bench.ledger_bench import scratch_database
from fleet_core.admission import catalog

__all__ = ["report", "run"]

ROWS = int(os.environ.get("FLEET_BENCH_BUDGET_ROWS", "5000000"))
SECRET = "fk_bench-database-mode-key"
ENV_KEY = "acme/research/bench"
BIG = 10**12
ENV_LIMITS = {
    "FLEET_AUTH_REQUIRED": "true",
    "FLEET_API_KEYS": ENV_KEY,
    "FLEET_RATE_TENANTS": f"acme|rpm=100000000,tpm={BIG}",
    "FLEET_RATE_PROJECTS": f"acme/research|rpm=100000000,tpm={BIG}",
}
CELLS = ("sequential", "plain c=64")
OFF = "no auth, limits or ledger"

_SEED = [
    "INSERT INTO tenants (id, name, request_limit, token_limit) VALUES"
    f" ('acme', 'Acme', 100000000, {BIG})",
    "INSERT INTO projects (id, tenant_id, name, request_limit, token_limit) VALUES"
    f" ('acme/research', 'acme', 'research', 100000000, {BIG})",
    "INSERT INTO model_rates (model, input_fresh_micro_per_1k, input_cached_micro_per_1k,"
    " output_micro_per_1k) VALUES ('bench', 100000, 10000, 400000)",
    'INSERT INTO budget_rules (id, scope_kind, scope_id, dimension, "limit", window_s) VALUES'
    f" ('rule_tenant', 'tenant', 'acme', 'tokens_total', {BIG}, 2592000),"
    f" ('rule_project', 'project', 'acme/research', 'units', {BIG}, 604800),"
    f" ('rule_day', 'project', 'acme/research', 'tokens_output', {BIG}, 86400)",
]

# Rows spread over the last 30 days across 20 tenants' projects (acme's among them), then
# rolled up per minute exactly as the ledger writer would have.
_FILL = """
INSERT INTO ledger (request_id, received_at, first_byte_at, done_at, tenant, project, key_id,
    model, served_model, endpoint, kind, status, outcome, stream, engine_prompt_tokens,
    engine_completion_tokens, engine_cached_tokens, gw_prompt_tokens, gw_completion_tokens,
    count_method, prompt_tokens, completion_tokens, cached_tokens, fresh_tokens, units)
SELECT 'fill-' || g, t, t, t, CASE WHEN g %% 20 = 0 THEN 'acme' ELSE 't' || (g %% 20) END,
    'research', 'key_fill', 'bench', 'bench', 'http://10.0.0.1:8000', 'chat', 200, 'ok', false,
    100, 20, 0, 100, 20, 'chars/4', 100, 20, 0, 100, 18000
FROM generate_series(1, %(rows)s) AS g,
     LATERAL (SELECT now() - (g %% 2592000) * interval '1 second') AS s(t)
"""
_ROLLUP = """
INSERT INTO usage_minute (tenant, project, model, minute, requests, tokens_input, tokens_output,
    tokens_cached, tokens_fresh, units)
SELECT tenant, project, model, date_trunc('minute', done_at, 'UTC'), count(*), sum(prompt_tokens),
    sum(completion_tokens), sum(cached_tokens), sum(fresh_tokens), sum(units)
FROM ledger WHERE request_id LIKE 'fill-%' GROUP BY 1, 2, 3, 4
ON CONFLICT (tenant, project, model, minute) DO UPDATE SET
    requests = usage_minute.requests + excluded.requests,
    tokens_input = usage_minute.tokens_input + excluded.tokens_input,
    tokens_output = usage_minute.tokens_output + excluded.tokens_output,
    tokens_cached = usage_minute.tokens_cached + excluded.tokens_cached,
    tokens_fresh = usage_minute.tokens_fresh + excluded.tokens_fresh,
    units = usage_minute.units + excluded.units
"""


def _seed(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in _SEED:
            conn.execute(statement)
        conn.execute(
            "INSERT INTO api_keys (id, project_id, label, prefix, secret_hash)"
            " VALUES ('key_bench', 'acme/research', 'bench', %s, %s)",
            (SECRET[:8], hashlib.sha256(SECRET.encode()).digest()),
        )


def _fill(url: str, rows: int) -> float:
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_FILL, {"rows": rows})
        conn.execute(_ROLLUP)
        conn.execute("VACUUM ANALYZE ledger")
        conn.execute("VACUUM ANALYZE usage_minute")
    return time.perf_counter() - started


async def _refresh_ms(url: str, repeats: int = 20) -> float:
    """Median time of the budget refresh query (the part that reads the rollups)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            await catalog.rule_usage(conn)
            times.append((time.perf_counter() - started) * 1000)
    return median(times)


@contextlib.contextmanager
def gateways(database_url: str, redis: str) -> Iterator[tuple[str, str, str]]:
    """(environment mode URL, database mode URL, no-auth URL), all on the same engine; the first
    two on the same Redis, the last without auth, limits or ledger (issue 21's baseline)."""
    engine, env_port, db_port, off_port = free_port(), free_port(), free_port(), free_port()
    direct = f"http://127.0.0.1:{engine}"
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        config = tmp / "fleet.yaml"
        config.write_text(f"upstreams:\n  - id: bench\n    model: bench\n    base_url: {direct}\n")
        stack.enter_context(process(stub.command(engine, "bench"), direct + "/health"))
        base = [sys.executable, "-m", "bench.serve", "hypercorn", "gateway"]
        shared = {"FLEET_REDIS_URL": redis, "FLEET_ACCESS_LOG": "false"}
        env_url, db_url = f"http://127.0.0.1:{env_port}", f"http://127.0.0.1:{db_port}"
        env_mode = {**shared, **ENV_LIMITS, "FLEET_REDIS_PREFIX": "bench-env:"}
        stack.enter_context(
            process([*base, str(env_port), str(config)], env_url + "/healthz", env_mode)
        )
        db_mode = {
            **shared,
            "FLEET_REDIS_PREFIX": "bench-db:",
            "FLEET_DATABASE_URL": database_url,
            "FLEET_LEDGER_SPOOL": str(tmp / "spool.jsonl"),
        }
        stack.enter_context(
            process([*base, str(db_port), str(config)], db_url + "/healthz", db_mode)
        )
        off_url = f"http://127.0.0.1:{off_port}"
        stack.enter_context(
            process(
                [*base, str(off_port), str(config)],
                off_url + "/healthz",
                {"FLEET_ACCESS_LOG": "false"},
            )
        )
        yield env_url, db_url, off_url


def run(rows: int = ROWS) -> dict[str, object]:
    samples: dict[str, dict[str, list[Cell]]] = {}
    loads = [load_average()]
    with redis_url() as redis, scratch_database() as database:
        _seed(database)
        with gateways(database, redis) as (env_url, db_url, off_url):
            targets = (
                ("environment mode", env_url, ENV_KEY),
                ("database mode", db_url, SECRET),
                (OFF, off_url, None),
            )
            for round_ in range(ROUNDS):
                for cell in CELLS:
                    for name, url, key in targets:
                        samples.setdefault(name, {}).setdefault(cell, []).append(
                            load(url, cell, key)
                        )
                loads.append(load_average())
                print(f"bench: database mode round {round_ + 1} of {ROUNDS}", file=sys.stderr)
            empty = [load(db_url, "sequential", SECRET) for _ in range(ROUNDS)]
            refresh_empty = asyncio.run(_refresh_ms(database))
            print(f"bench: filling the ledger with {rows} rows", file=sys.stderr)
            fill_s = _fill(database, rows)
            time.sleep(2)  # a few budget refreshes on the full rollups
            full = [load(db_url, "sequential", SECRET) for _ in range(ROUNDS)]
            refresh_full = asyncio.run(_refresh_ms(database))
    return {
        "samples": samples,
        "empty": empty,
        "full": full,
        "refresh_empty_ms": refresh_empty,
        "refresh_full_ms": refresh_full,
        "rows": rows,
        "fill_s": fill_s,
        "loads": loads,
    }


def report(result: dict[str, object]) -> list[str]:
    samples, loads = result["samples"], result["loads"]
    empty, full = result["empty"], result["full"]
    assert isinstance(loads, list)
    assert isinstance(samples, dict)
    assert isinstance(empty, list)
    assert isinstance(full, list)
    pairs = zip(
        samples["database mode"]["plain c=64"],
        samples["environment mode"]["plain c=64"],
        strict=True,
    )
    ratio = median([db["rps"] / env["rps"] for db, env in pairs])
    bare = zip(samples["database mode"]["plain c=64"], samples[OFF]["plain c=64"], strict=True)
    over_off = median([db["rps"] / off["rps"] for db, off in bare])
    p50_empty = median([c["p50_ms"] for c in empty])
    p50_full = median([c["p50_ms"] for c in full])
    growth = p50_full / p50_empty - 1
    lines = [
        "## Database mode (issue 5)",
        "",
        "The gateway on hypercorn against the stub engine, tenant + project limits in Redis in",
        "both modes; database mode adds the catalog from Postgres, three budget rules, unit",
        "rates and one ledger row per request (batched COPY). Medians of interleaved rounds.",
        generator.describe(),
        stub.describe(),
        f"Machine load before and after each round: {'; '.join(loads)}.",
        "",
        "| gateway | sequential req/s / p50 / p99 | plain c=64 req/s / p50 / p99 |",
        "|---|---|---|",
    ]
    for name, cells in samples.items():
        medians = {cell: summary(runs) for cell, runs in cells.items()}
        row = " | ".join(
            f"{medians[c]['rps']:.0f} / {medians[c]['p50_ms']:.2f} / {medians[c]['p99_ms']:.2f}"
            for c in CELLS
        )
        lines.append(f"| {name} | {row} |")
    lines += [
        "",
        f"Budget admission with an empty ledger, then with {result['rows']:,} ledger rows over",
        f"30 days (filled and rolled up in {result['fill_s']:.0f} s), database mode, sequential:",
        "",
        "| ledger | p50 ms | budget refresh query ms (background, every second) |",
        "|---|---|---|",
        f"| empty | {p50_empty:.2f} | {result['refresh_empty_ms']:.2f} |",
        f"| {result['rows']:,} rows | {p50_full:.2f} | {result['refresh_full_ms']:.2f} |",
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        f"| database-mode throughput >= 85% of environment mode, c=64 | {ratio:.0%} | "
        f"{'met' if ratio >= 0.85 else 'NOT met'} |",
        f"| database mode (auth + Redis limits + ledger) >= 85% of the gateway without them, "
        f"c=64 (issue 21) | {over_off:.0%} | {'met' if over_off >= 0.85 else 'NOT met'} |",
        f"| budget admission p50 with the full ledger within 20% of empty | {growth:+.0%} | "
        f"{'met' if growth <= 0.20 else 'NOT met'} |",
        "",
    ]
    return lines
