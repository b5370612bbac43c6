"""The ledger's SQL: the idempotent batch insert with its per-minute rollup, and read helpers.

A batch is COPYed into a session-local staging table, then moved into ``ledger`` with
``ON CONFLICT (request_id) DO NOTHING`` (``request_id`` is minted by the gateway per request, so
only a replay of the same record can conflict; the client's own id is ``client_request_id``, not
unique); the rollups are summed from that insert's ``RETURNING``, so a row replayed after an
outage (already in the ledger) adds nothing to ``usage_minute`` (nor to ``usage_hour``, the hourly
level summed from the same rows, nor to the usage agreement's ``agreement_hour`` and
``agreement_diff_hour``) a second time. It all runs in one transaction: the rows and
their sums commit together or not at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
import psycopg
from psycopg.rows import class_row

from fleet_core.gateway.metering.records import UsageRecord

__all__ = [
    "COLUMNS",
    "OUT_OF_BOUNDS",
    "LedgerRow",
    "MinuteRow",
    "Totals",
    "count_rows",
    "get_row",
    "hour_totals",
    "insert_batch",
    "ledger_totals",
    "minutes_for_tenant",
    "rollup_totals",
    "row_values",
    "rows_for_tenant",
]

Connection = psycopg.AsyncConnection[Any]

# What the writer sends, in COPY order; ``recorded_at`` is the database's own clock.
COLUMNS = (
    "request_id",
    "received_at",
    "first_byte_at",
    "done_at",
    "tenant",
    "project",
    "key_id",
    "model",
    "served_model",
    "endpoint",
    "kind",
    "status",
    "outcome",
    "stream",
    "engine_prompt_tokens",
    "engine_completion_tokens",
    "engine_cached_tokens",
    "gw_prompt_tokens",
    "gw_completion_tokens",
    "count_method",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "fresh_tokens",
    "units",
    "client_request_id",
)
_COLS = ", ".join(COLUMNS)

# Requests refused at admission are not written (the gateway's metrics count them); rows of
# refusals from before that stay out of the rollups: what was served, what budgets count.
# Temporary, so per session and invisible to others; emptied at each commit.
_STAGING = (
    "CREATE TEMP TABLE IF NOT EXISTS ledger_staging ON COMMIT DELETE ROWS"
    f" AS SELECT {_COLS} FROM ledger WITH NO DATA"
)
# Binary COPY: psycopg formats a row of these types in C at ~3.5 us, against ~9 us for the text
# format's per-value conversions (one row per request in database mode).
_COPY = f"COPY ledger_staging ({_COLS}) FROM STDIN (FORMAT BINARY)"
_TYPES = tuple(
    {
        "received_at": "timestamptz",
        "first_byte_at": "timestamptz",
        "done_at": "timestamptz",
        "status": "int4",
        "stream": "bool",
    }.get(column, "int8" if column.endswith(("_tokens", "units")) else "text")
    for column in COLUMNS
)
_SUMS = (
    "count(*), sum(prompt_tokens), sum(completion_tokens), sum(cached_tokens),"
    " sum(fresh_tokens), coalesce(sum(units), 0)"
)
_ADD = """ON CONFLICT (tenant, project, model, {at}) DO UPDATE SET
        requests = u.requests + excluded.requests,
        tokens_input = u.tokens_input + excluded.tokens_input,
        tokens_output = u.tokens_output + excluded.tokens_output,
        tokens_cached = u.tokens_cached + excluded.tokens_cached,
        tokens_fresh = u.tokens_fresh + excluded.tokens_fresh,
        units = u.units + excluded.units"""
_ROLLUP_COLS = "requests, tokens_input, tokens_output, tokens_cached, tokens_fresh, units"


def _rollup(table: str, at: str) -> str:
    """One rollup level (``usage_minute`` by minute, ``usage_hour`` by hour), summed from the
    same ``inserted`` rows, so an hour row is always the sum of its minute rows."""
    return f"""
    INSERT INTO {table} AS u (tenant, project, model, {at}, {_ROLLUP_COLS})
    SELECT coalesce(tenant, ''), coalesce(project, ''), model,
           date_trunc('{at}', done_at, 'UTC'), {_SUMS}
    FROM inserted WHERE outcome <> 'refused' GROUP BY 1, 2, 3, 4
    {_ADD.format(at=at)}"""


def _diff(direction: str) -> str:
    """A request's relative difference, as migration 0016 and ``usage.store`` compute it."""
    engine, gateway = f"engine_{direction}_tokens", f"gw_{direction}_tokens"
    return f"(({gateway} - {engine})::float8 / greatest({engine}, 1))"


# A billed row whose engine figures are not what it billed: the engine reported a figure out of
# bounds (metering/bounds.py), billed at its bound. As ``usage.store`` computes it too.
OUT_OF_BOUNDS = """(engine_prompt_tokens IS NOT NULL AND endpoint IS NOT NULL
    AND outcome <> 'refused' AND NOT (outcome = 'upstream_error' AND first_byte_at IS NULL)
    AND (engine_prompt_tokens, engine_completion_tokens, engine_cached_tokens)
        IS DISTINCT FROM (prompt_tokens, completion_tokens, cached_tokens))"""

# The usage agreement's hourly rollups (ADR 0014): counts and sums of signed differences per
# model, hour and count method, and how many had figures out of bounds; how many requests had
# each exact absolute difference.
_AGREEMENT = f"""
    INSERT INTO agreement_hour AS a (model, hour, count_method, requests, prompt_compared,
                                     completion_compared, prompt_diff_sum, completion_diff_sum,
                                     out_of_bounds)
    SELECT model, date_trunc('hour', done_at, 'UTC'), count_method, count(*),
           count(engine_prompt_tokens), count(engine_completion_tokens),
           coalesce(sum({_diff("prompt")}), 0), coalesce(sum({_diff("completion")}), 0),
           count(*) FILTER (WHERE {OUT_OF_BOUNDS})
    FROM inserted WHERE outcome <> 'refused' GROUP BY 1, 2, 3
    ON CONFLICT (model, hour, count_method) DO UPDATE SET
        out_of_bounds = a.out_of_bounds + excluded.out_of_bounds,
        requests = a.requests + excluded.requests,
        prompt_compared = a.prompt_compared + excluded.prompt_compared,
        completion_compared = a.completion_compared + excluded.completion_compared,
        prompt_diff_sum = a.prompt_diff_sum + excluded.prompt_diff_sum,
        completion_diff_sum = a.completion_diff_sum + excluded.completion_diff_sum"""


def _histogram(direction: str) -> str:
    return f"""
    SELECT model, date_trunc('hour', done_at, 'UTC'), '{direction}', abs({_diff(direction)}),
           count(*)
    FROM inserted WHERE outcome <> 'refused' AND engine_{direction}_tokens IS NOT NULL
    GROUP BY 1, 2, 4"""


_DIFFS = f"""
    INSERT INTO agreement_diff_hour AS d (model, hour, direction, abs_diff, requests)
    {_histogram("prompt")} UNION ALL {_histogram("completion")}
    ON CONFLICT (model, hour, direction, abs_diff) DO UPDATE SET
        requests = d.requests + excluded.requests"""

_MOVE = f"""
WITH inserted AS (
    INSERT INTO ledger ({_COLS}) SELECT {_COLS} FROM ledger_staging
    ON CONFLICT (request_id) DO NOTHING
    RETURNING tenant, project, model, done_at, outcome, endpoint, first_byte_at,
              prompt_tokens, completion_tokens, cached_tokens, fresh_tokens, units,
              count_method, engine_prompt_tokens, engine_completion_tokens, engine_cached_tokens,
              gw_prompt_tokens, gw_completion_tokens
), minutes AS ({_rollup("usage_minute", "minute")}
), hours AS ({_rollup("usage_hour", "hour")}
), agreement AS ({_AGREEMENT}
), diffs AS ({_DIFFS}
)
SELECT count(*) FROM inserted
"""


class LedgerRow(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    received_at: datetime
    first_byte_at: datetime | None
    done_at: datetime
    tenant: str | None
    project: str | None
    key_id: str | None
    model: str
    served_model: str
    endpoint: str | None
    kind: str
    status: int
    outcome: str
    stream: bool
    engine_prompt_tokens: int | None
    engine_completion_tokens: int | None
    engine_cached_tokens: int | None
    gw_prompt_tokens: int
    gw_completion_tokens: int
    count_method: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    fresh_tokens: int
    units: int | None
    recorded_at: datetime
    client_request_id: str | None


class MinuteRow(msgspec.Struct, frozen=True, kw_only=True):
    tenant: str
    project: str
    model: str
    minute: datetime
    requests: int
    tokens_input: int
    tokens_output: int
    tokens_cached: int
    tokens_fresh: int
    units: int


class Totals(msgspec.Struct, frozen=True, kw_only=True):
    """Sums over a whole table: the ledger's and the rollup's must agree."""

    requests: int
    tokens_input: int
    tokens_output: int
    tokens_cached: int
    tokens_fresh: int
    units: int


_fromtimestamp = datetime.fromtimestamp
INT8_MIN, INT8_MAX = -(2**63), 2**63 - 1


def _int8(value: int) -> int:
    """An engine's figure as the ledger can hold it: its claim, saturated to ``int8`` (what it
    billed is bounded far below; a claim past ``int8`` is out of bounds either way)."""
    return value if INT8_MIN <= value <= INT8_MAX else max(INT8_MIN, min(INT8_MAX, value))


def row_values(record: UsageRecord) -> tuple[object, ...]:
    """One record as the ledger's columns, in `COLUMNS` order; billed figures per records.py.

    Built once per request in database mode, so written for few operations: the billed figures
    read once, times converted by ``datetime.fromtimestamp`` itself (exact to the microsecond,
    UTC), no helper calls."""
    engine, gateway, first_byte_at = record.engine, record.gateway, record.first_byte_at
    prompt, completion, cached = record.billed_tokens()
    return (
        record.request_id,
        _fromtimestamp(record.received_at, UTC),
        None if first_byte_at is None else _fromtimestamp(first_byte_at, UTC),
        _fromtimestamp(record.done_at, UTC),
        record.tenant,
        record.project,
        record.key_id,
        record.model,
        record.served_model,
        record.endpoint,
        record.kind,
        record.status,
        record.outcome,
        record.stream,
        None if engine is None else _int8(engine.prompt_tokens),
        None if engine is None else _int8(engine.completion_tokens),
        None if engine is None else _int8(engine.cached_tokens),
        gateway.prompt_tokens,
        gateway.completion_tokens,
        gateway.method,
        prompt,
        completion,
        cached,
        prompt - cached,
        record.units,
        record.client_request_id,
    )


async def insert_batch(conn: Connection, records: Sequence[UsageRecord]) -> int:
    """Insert what is new among ``records`` and roll it up, in one transaction; returns how many
    rows were new (the rest were already in the ledger)."""
    async with conn.transaction(), conn.cursor() as cursor:
        await cursor.execute(_STAGING)
        async with cursor.copy(_COPY) as copy:
            copy.set_types(_TYPES)
            # The formatter `write_row` runs itself, without a coroutine and an await per row:
            # it fills psycopg's buffer in C and hands it over only when full (32 KiB).
            write_row = copy.formatter.write_row
            for record in records:
                if data := write_row(row_values(record)):
                    await copy.write(data)
        await cursor.execute(_MOVE)
        row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


async def count_rows(conn: Connection) -> int:
    cursor = await conn.execute("SELECT count(*) FROM ledger")
    row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


async def get_row(conn: Connection, request_id: str) -> LedgerRow | None:
    async with conn.cursor(row_factory=class_row(LedgerRow)) as cursor:
        await cursor.execute("SELECT * FROM ledger WHERE request_id = %s", (request_id,))
        return await cursor.fetchone()


async def rows_for_tenant(
    conn: Connection, tenant: str, *, since: datetime | None = None, limit: int = 1000
) -> list[LedgerRow]:
    """A tenant's rows, oldest first, done at or after ``since`` (the (tenant, done_at) index)."""
    floor = since or datetime.fromtimestamp(0, UTC)
    async with conn.cursor(row_factory=class_row(LedgerRow)) as cursor:
        await cursor.execute(
            "SELECT * FROM ledger WHERE tenant = %s AND done_at >= %s"
            " ORDER BY done_at, request_id LIMIT %s",
            (tenant, floor, limit),
        )
        return await cursor.fetchall()


async def minutes_for_tenant(conn: Connection, tenant: str) -> list[MinuteRow]:
    async with conn.cursor(row_factory=class_row(MinuteRow)) as cursor:
        await cursor.execute(
            "SELECT * FROM usage_minute WHERE tenant = %s ORDER BY minute, project, model",
            (tenant,),
        )
        return await cursor.fetchall()


async def ledger_totals(conn: Connection) -> Totals:
    return await _totals(
        conn,
        "SELECT count(*), sum(prompt_tokens), sum(completion_tokens), sum(cached_tokens),"
        " sum(fresh_tokens), sum(units) FROM ledger",
    )


async def rollup_totals(conn: Connection) -> Totals:
    return await _totals(
        conn,
        "SELECT sum(requests), sum(tokens_input), sum(tokens_output), sum(tokens_cached),"
        " sum(tokens_fresh), sum(units) FROM usage_minute",
    )


async def hour_totals(conn: Connection) -> Totals:
    """The hourly rollup's sums: equal to `rollup_totals` (both are summed from the same rows)."""
    return await _totals(
        conn,
        "SELECT sum(requests), sum(tokens_input), sum(tokens_output), sum(tokens_cached),"
        " sum(tokens_fresh), sum(units) FROM usage_hour",
    )


async def _totals(conn: Connection, query: str) -> Totals:
    cursor = await conn.execute(query)
    row = await cursor.fetchone()
    assert row is not None
    requests, tokens_in, tokens_out, cached, fresh, units = (int(v or 0) for v in row)
    return Totals(
        requests=requests,
        tokens_input=tokens_in,
        tokens_output=tokens_out,
        tokens_cached=cached,
        tokens_fresh=fresh,
        units=units,
    )
