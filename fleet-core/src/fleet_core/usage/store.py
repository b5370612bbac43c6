"""SQL over ``usage_minute``: never a scan of raw ledger rows, so cost follows the window, not
the ledger's size."""

from __future__ import annotations

from datetime import datetime

from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from fleet_core.usage.wire import Agreement, CountAgreement, GroupBy, UsageRow

__all__ = ["agreement", "usage"]

_KEYS = {
    "hour": sql.SQL(
        "to_char(date_trunc('hour', minute AT TIME ZONE 'UTC'), 'YYYY-MM-DD\"T\"HH24:00:00\"Z\"')"
    ),
    "day": sql.SQL("to_char(date_trunc('day', minute AT TIME ZONE 'UTC'), 'YYYY-MM-DD')"),
    "model": sql.SQL("model"),
    "project": sql.SQL("tenant || '/' || project"),
}


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
    where: list[sql.Composable] = [sql.SQL("minute >= %(start)s"), sql.SQL("minute < %(end)s")]
    params: dict[str, object] = {"start": start, "end": end}
    for column, value in (("tenant", tenant), ("project", project), ("model", model)):
        if value is not None:
            where.append(sql.SQL("{} = %({})s").format(sql.Identifier(column), sql.SQL(column)))
            params[column] = value
    query = sql.SQL(
        "SELECT {key} AS key, sum(requests), sum(tokens_input), sum(tokens_output),"
        " sum(tokens_cached), sum(tokens_fresh), sum(units)"
        " FROM usage_minute WHERE {where} GROUP BY 1 ORDER BY 1"
    ).format(key=_KEYS[group_by], where=sql.SQL(" AND ").join(where))
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
