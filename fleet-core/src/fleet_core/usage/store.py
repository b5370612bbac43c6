"""SQL over the ledger's rollups: never a scan of raw ledger rows, so cost follows the window,
not the ledger's size.

A window reads ``usage_hour`` for the whole hours inside it and ``usage_minute`` only for the
partial hours at its edges, so a month costs hours × pairs rows rather than minutes × pairs. An
hour row is the exact sum of its minute rows (the ledger writer keeps both from the same insert),
so the answer is the same integers the minute rollups (and the ledger) give.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from fleet_core.usage.wire import Agreement, CountAgreement, GroupBy, UsageRow

__all__ = ["agreement", "split", "usage"]

_HOUR = timedelta(hours=1)
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
    async with pool.connection() as conn:
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


def _diff(engine: str, gateway: str) -> str:
    return f"(({gateway} - {engine})::float8 / greatest({engine}, 1))"


_PROMPT = _diff("engine_prompt_tokens", "gw_prompt_tokens")
_COMPLETION = _diff("engine_completion_tokens", "gw_completion_tokens")
_AGREEMENT = f"""
SELECT model,
       count(*),
       count(engine_prompt_tokens),
       count(*) - count(engine_prompt_tokens),
       avg({_PROMPT}),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY abs({_PROMPT})),
       avg({_COMPLETION}),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY abs({_COMPLETION})),
       array_agg(DISTINCT count_method ORDER BY count_method)
FROM ledger
WHERE done_at >= %(start)s AND done_at < %(end)s AND outcome <> 'refused'
  AND (%(model)s::text IS NULL OR model = %(model)s)
GROUP BY model ORDER BY model
"""


async def agreement(
    pool: AsyncConnectionPool, *, start: datetime, end: datetime, model: str | None = None
) -> list[Agreement]:
    """Engine-reported against gateway-counted tokens per model, over ledger rows in a window.

    This one reads raw rows (the rollups keep only the billed figures); ``ledger_done`` keeps it
    to the window's rows.
    """
    async with pool.connection() as conn:
        cursor = await conn.execute(_AGREEMENT, {"start": start, "end": end, "model": model})
        rows = await cursor.fetchall()
    return [
        Agreement(
            model=r[0],
            requests=int(r[1]),
            compared=int(r[2]),
            without_engine_usage=int(r[3]),
            prompt=CountAgreement(mean_relative_diff=r[4], p95_abs_relative_diff=r[5]),
            completion=CountAgreement(mean_relative_diff=r[6], p95_abs_relative_diff=r[7]),
            count_methods=list(r[8]),
        )
        for r in rows
    ]
