"""SQL over the ledger's rollups: raw ledger rows only for a window's partial edge hours, so
cost follows the window, not the ledger's size.

A window reads ``usage_hour`` for the whole hours inside it and ``usage_minute`` only for the
partial hours at its edges, so a month costs hours × pairs rows rather than minutes × pairs. An
hour row is the exact sum of its minute rows (the ledger writer keeps both from the same insert),
so the answer is the same integers the minute rollups (and the ledger) give. The usage
agreement reads its own hourly rollups the same way (ADR 0014, migration 0016). Each answer
reads one snapshot (`_SNAPSHOT`), so a batch the ledger writer commits meanwhile is in every
part of it or in none.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import UTC, datetime, timedelta

from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from fleet_core.control_plane.usage.wire import Agreement, CountAgreement, GroupBy, UsageRow

__all__ = ["agreement", "percentile_cont", "split", "usage"]

_HOUR = timedelta(hours=1)
_SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
"""Every usage answer is one snapshot: its hour rollups, minute rollups and raw edge rows all
as of one instant, however many statements read them, while the ledger writer commits batches
(each batch's rows and rollups in one transaction) beside it."""
_KEYS = {
    "hour": sql.SQL(
        "to_char(date_trunc('hour', at AT TIME ZONE 'UTC'), 'YYYY-MM-DD\"T\"HH24:00:00\"Z\"')"
    ),
    "day": sql.SQL("to_char(date_trunc('day', at AT TIME ZONE 'UTC'), 'YYYY-MM-DD')"),
    "model": sql.SQL("model"),
    "project": sql.SQL("tenant || '/' || project"),
}
_COLUMNS = sql.SQL(
    "tenant, project, model, requests, tokens_input, tokens_output,"
    " tokens_cached, tokens_fresh, units"
)
# Whole hours from usage_hour; the edges [start, first) and [last, end) from usage_minute.
_PARTS = sql.SQL(
    "SELECT hour AS at, {cols} FROM usage_hour WHERE hour >= %(first)s AND hour < %(last)s{f}"
    " UNION ALL SELECT minute, {cols} FROM usage_minute"
    " WHERE minute >= %(start)s AND minute < %(first)s{f}"
    " UNION ALL SELECT minute, {cols} FROM usage_minute"
    " WHERE minute >= %(last)s AND minute < %(end)s{f}"
)


def split(start: datetime, end: datetime) -> tuple[datetime, datetime]:
    """``(first, last)``: the whole UTC hours ``[first, last)`` inside ``[start, end)``; when
    none fits, ``(end, end)``, so the minute edge ``[start, end)`` covers the whole window."""
    first = _floor_hour(start)
    if first < start:
        first += _HOUR
    last = _floor_hour(end)
    if last <= first:
        return end, end
    return first, last


def _floor_hour(when: datetime) -> datetime:
    when = when.astimezone(UTC)  # a +05:30 offset must not move the hour boundaries
    return when - timedelta(minutes=when.minute, seconds=when.second, microseconds=when.microsecond)


async def usage(
    pool: AsyncConnectionPool,
    *,
    group_by: GroupBy,
    start: datetime,
    end: datetime,
    tenant: str | None = None,
    project: str | None = None,
    model: str | None = None,
) -> list[UsageRow]:
    first, last = split(start, end)
    params: dict[str, object] = {"start": start, "end": end, "first": first, "last": last}
    filters: list[sql.Composable] = []
    for column, value in (("tenant", tenant), ("project", project), ("model", model)):
        if value is not None:
            filters.append(
                sql.SQL(" AND {} = %({})s").format(sql.Identifier(column), sql.SQL(column))
            )
            params[column] = value
    parts = _PARTS.format(cols=_COLUMNS, f=sql.Composed(filters))
    query = sql.SQL(
        "SELECT {key} AS key, sum(requests), sum(tokens_input), sum(tokens_output),"
        " sum(tokens_cached), sum(tokens_fresh), sum(units)"
        " FROM ({parts}) AS rolled GROUP BY 1 ORDER BY 1"
    ).format(key=_KEYS[group_by], parts=parts)
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(_SNAPSHOT)
        cursor = await conn.execute(query, params)
        rows = await cursor.fetchall()
    return [
        UsageRow(
            key=str(r[0]),
            requests=int(r[1]),
            tokens_input=int(r[2]),
            tokens_output=int(r[3]),
            tokens_cached=int(r[4]),
            tokens_fresh=int(r[5]),
            units=int(r[6]),
        )
        for r in rows
    ]


def _diff(direction: str) -> str:
    """A request's relative difference, bit for bit as the ledger writer rolls it up."""
    engine, gateway = f"engine_{direction}_tokens", f"gw_{direction}_tokens"
    return f"(({gateway} - {engine})::float8 / greatest({engine}, 1))"


# A billed row the engine reported a figure out of bounds for (billed at the bound instead):
# as the ledger writer rolls it up (gateway/ledger/store.py ``OUT_OF_BOUNDS``).
_OUT_OF_BOUNDS = """(engine_prompt_tokens IS NOT NULL AND endpoint IS NOT NULL
    AND outcome <> 'refused' AND NOT (outcome = 'upstream_error' AND first_byte_at IS NULL)
    AND (engine_prompt_tokens, engine_completion_tokens, engine_cached_tokens)
        IS DISTINCT FROM (prompt_tokens, completion_tokens, cached_tokens))"""
_MODEL = "(%(model)s::text IS NULL OR model = %(model)s)"
# The raw ledger rows of the window's partial edge hours (the ledger_done index).
_EDGES = f"""
WITH edge AS (
    SELECT * FROM ledger WHERE done_at >= %(start)s AND done_at < %(first)s
    UNION ALL
    SELECT * FROM ledger WHERE done_at >= %(last)s AND done_at < %(end)s
), served AS (SELECT * FROM edge WHERE outcome <> 'refused' AND {_MODEL})
"""
_COUNTS = f"""{_EDGES}
SELECT model, count_method, sum(requests), sum(prompt_compared), sum(completion_compared),
       sum(prompt_diff_sum), sum(completion_diff_sum), sum(out_of_bounds)
FROM (
    SELECT model, count_method, requests, prompt_compared, completion_compared,
           prompt_diff_sum, completion_diff_sum, out_of_bounds
    FROM agreement_hour WHERE hour >= %(first)s AND hour < %(last)s AND {_MODEL}
    UNION ALL
    SELECT model, count_method, count(*), count(engine_prompt_tokens),
           count(engine_completion_tokens), coalesce(sum({_diff("prompt")}), 0),
           coalesce(sum({_diff("completion")}), 0), count(*) FILTER (WHERE {_OUT_OF_BOUNDS})
    FROM served GROUP BY 1, 2
) AS parts GROUP BY 1, 2 ORDER BY 1, 2
"""
_HISTOGRAM = f"""{_EDGES}
SELECT model, direction, abs_diff, sum(requests)
FROM (
    SELECT model, direction, abs_diff, requests
    FROM agreement_diff_hour WHERE hour >= %(first)s AND hour < %(last)s AND {_MODEL}
    UNION ALL
    SELECT model, 'prompt', abs({_diff("prompt")}), 1
    FROM served WHERE engine_prompt_tokens IS NOT NULL
    UNION ALL
    SELECT model, 'completion', abs({_diff("completion")}), 1
    FROM served WHERE engine_completion_tokens IS NOT NULL
) AS parts GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
"""


class _Sums:
    """One model's counts and sums of signed differences, over its count methods."""

    def __init__(self) -> None:
        self.requests = self.prompt_n = self.completion_n = self.out_of_bounds = 0
        self.prompt_sum = self.completion_sum = 0.0
        self.methods: list[str] = []


def percentile_cont(histogram: list[tuple[float, int]], fraction: float) -> float | None:
    """Postgres's ``percentile_cont(fraction)`` over the multiset that ``histogram`` (ascending
    ``(value, how many)``) describes: the same positions and the same interpolation, so the same
    float as over the rows themselves."""
    total = sum(n for _, n in histogram)
    if total == 0:
        return None
    position = fraction * (total - 1)
    low, high = math.floor(position), math.ceil(position)
    first, second = _nth(histogram, low), _nth(histogram, high)
    return first + (second - first) * (position - low)


def _nth(histogram: list[tuple[float, int]], index: int) -> float:
    seen = 0
    for value, n in histogram:
        seen += n
        if index < seen:
            return value
    raise IndexError(index)


async def agreement(
    pool: AsyncConnectionPool, *, start: datetime, end: datetime, model: str | None = None
) -> list[Agreement]:
    """Engine-reported against gateway-counted tokens per model, over a window.

    Whole hours come from the agreement rollups (``agreement_hour``, ``agreement_diff_hour``),
    the partial hours at the edges from raw ledger rows: the counts and p95s are those of the
    raw rows exactly, the means equal to float rounding (sums added in another order).
    """
    first, last = split(start, end)
    params = {"start": start, "end": end, "first": first, "last": last, "model": model}
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(_SNAPSHOT)  # both statements see the same rollups and ledger rows
        counts = await (await conn.execute(_COUNTS, params)).fetchall()
        histogram = await (await conn.execute(_HISTOGRAM, params)).fetchall()
    sums: dict[str, _Sums] = {}
    for name, method, requests, prompt_n, completion_n, prompt_sum, completion_sum, oob in counts:
        one = sums.setdefault(name, _Sums())
        one.out_of_bounds += int(oob)
        one.requests += int(requests)
        one.prompt_n += int(prompt_n)
        one.completion_n += int(completion_n)
        one.prompt_sum += float(prompt_sum)
        one.completion_sum += float(completion_sum)
        one.methods.append(method)
    values: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    for name, direction, value, n in histogram:
        values[(name, direction)].append((float(value), int(n)))
    return [_agreement(name, one, values) for name, one in sorted(sums.items())]


def _agreement(
    name: str, one: _Sums, values: dict[tuple[str, str], list[tuple[float, int]]]
) -> Agreement:
    def side(n: int, total: float, direction: str) -> CountAgreement:
        return CountAgreement(
            mean_relative_diff=total / n if n else None,
            p95_abs_relative_diff=percentile_cont(values.get((name, direction), []), 0.95),
        )

    return Agreement(
        model=name,
        requests=one.requests,
        compared=one.prompt_n,
        without_engine_usage=one.requests - one.prompt_n,
        prompt=side(one.prompt_n, one.prompt_sum, "prompt"),
        completion=side(one.completion_n, one.completion_sum, "completion"),
        count_methods=sorted(one.methods),
        out_of_bounds=one.out_of_bounds,
    )
