"""The database-mode bench's database: tenants, projects, rates, budget rules and keys
(`seed`), and a ledger of millions of rows rolled up as the ledger writer would have (`fill`)."""

from __future__ import annotations

import contextlib
import hashlib
import time

import psycopg

BIG = 10**12
"""A limit no bench reaches."""
SECRET = "fk_bench-database-mode-key"
"""The key of acme/research, which three budget rules apply to."""
RULELESS_SECRET = "fk_bench-database-mode-ruleless"
"""The key of initech/research: the same limits and rates, no budget rule."""

_SEED = [
    "INSERT INTO tenants (id, name, request_limit, token_limit) VALUES"
    f" ('acme', 'Acme', 100000000, {BIG}), ('initech', 'Initech', 100000000, {BIG})",
    "INSERT INTO projects (id, tenant_id, name, request_limit, token_limit) VALUES"
    f" ('acme/research', 'acme', 'research', 100000000, {BIG}),"
    f" ('initech/research', 'initech', 'research', 100000000, {BIG})",
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


def seed(url: str) -> None:
    """The bench's tenants, projects, rates, three budget rules (on acme) and keys (``SECRET``
    for acme/research, ``RULELESS_SECRET`` for initech/research)."""
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in _SEED:
            conn.execute(statement)
        for key_id, project, secret in (
            ("key_bench", "acme/research", SECRET),
            ("key_ruleless", "initech/research", RULELESS_SECRET),
        ):
            conn.execute(
                "INSERT INTO api_keys (id, project_id, label, prefix, secret_hash)"
                " VALUES (%s, %s, 'bench', %s, %s)",
                (key_id, project, secret[:8], hashlib.sha256(secret.encode()).digest()),
            )


def fill(url: str, rows: int) -> float:
    """Fill and roll up ``rows`` ledger rows, then write the fill's dirty pages out (a
    checkpoint) before anything is measured: otherwise Postgres writes gigabytes back during
    the full-ledger rounds, and those measure the fill's aftermath, not the ledger's size."""
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_FILL, {"rows": rows})
        conn.execute(_ROLLUP)
        conn.execute("VACUUM ANALYZE ledger")
        conn.execute("VACUUM ANALYZE usage_minute")
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            conn.execute("CHECKPOINT")  # a role without pg_checkpoint measures without it
    return time.perf_counter() - started
