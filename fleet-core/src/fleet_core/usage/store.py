"""SQL over ``usage_minute``: never a scan of raw ledger rows, so cost follows the window, not
the ledger's size."""

from __future__ import annotations

from datetime import datetime

from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from fleet_core.usage.wire import GroupBy, UsageRow

__all__ = ["usage"]

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
