"""Usage read from hourly rollups (plus minute rows at a window's edges) equals the ledger's sums.

Property: for random records (tenants, projects, models, outcomes, times over six hours across a
UTC midnight, some batches replayed) and a random window, grouping and filter,
``usage.store.usage`` returns exactly the sums of the ledger rows it covers (served rows whose
minute lies in ``[from, to)``), and the hourly rollup's totals equal the minute rollup's.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from datetime import UTC, datetime, timedelta, timezone

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg_pool import AsyncConnectionPool

from fleet_core.control_plane.usage import store as usage
from fleet_core.control_plane.usage.wire import GroupBy, UsageRow
from fleet_core.gateway.ledger import store as ledger
from fleet_core.gateway.metering.records import EngineUsage, GatewayCount, UsageRecord
from fleet_core.shared.storage.migrations import apply_migrations

T0 = datetime(2026, 9, 1, 21, tzinfo=UTC)
SPAN_S = 6 * 3600  # crosses a UTC midnight; dense enough that partial hours hold rows


def drawn_record(draw: st.DrawFn, n: int, **fields: object) -> UsageRecord:
    """Request ``r{n}``: a chat done at a drawn moment of the span, of a drawn model and outcome;
    ``fields`` give the rest (engine, gateway, tenant, ...)."""
    done = T0.timestamp() + draw(st.floats(0, SPAN_S - 1, allow_nan=False))
    return UsageRecord(
        request_id=f"r{n}",
        kind="chat",
        model=draw(st.sampled_from(["m1", "m2"])),
        served_model="m",
        endpoint="http://e:1",
        status=200,
        outcome=draw(st.sampled_from(["ok", "ok", "upstream_error", "refused"])),
        stream=False,
        received_at=done - 1,
        first_byte_at=None,
        done_at=done,
        **fields,  # type: ignore[arg-type]
    )


@st.composite
def records(draw: st.DrawFn) -> list[UsageRecord]:
    made = []
    for n in range(draw(st.integers(0, 60))):
        tokens = draw(st.tuples(*(st.integers(0, 10**6) for _ in range(3))))
        made.append(
            drawn_record(
                draw,
                n,
                engine=EngineUsage(tokens[0], tokens[1], min(tokens[2], tokens[0])),
                gateway=GatewayCount(tokens[0], tokens[1], "estimate:chars/4"),
                tenant=draw(st.sampled_from(["a", "b", None])),
                project=draw(st.sampled_from(["x", "y", None])),
                units=draw(st.none() | st.integers(0, 10**9)),
            )
        )
    return made


@st.composite
def windows(draw: st.DrawFn) -> tuple[datetime, datetime]:
    """Windows on and off hour boundaries, some inside one hour, some with an odd UTC offset."""
    edge = st.one_of(
        st.integers(0, 6).map(lambda h: timedelta(hours=h)),
        st.integers(0, SPAN_S).map(lambda s: timedelta(seconds=s)),
    )
    start, end = sorted([draw(edge), draw(edge)])
    if start == end:
        end += timedelta(seconds=draw(st.integers(1, 7200)))
    zone = draw(st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30))]))
    return (T0 + start).astimezone(zone), (T0 + end).astimezone(zone)


def _key(record: UsageRecord, group_by: GroupBy, minute: datetime) -> str:
    if group_by == "hour":
        return minute.strftime("%Y-%m-%dT%H:00:00Z")
    if group_by == "day":
        return minute.strftime("%Y-%m-%d")
    if group_by == "model":
        return record.model
    return f"{record.tenant or ''}/{record.project or ''}"


def expected(
    items: list[UsageRecord], group_by: GroupBy, start: datetime, end: datetime, tenant: str | None
) -> list[UsageRow]:
    """The ledger rows' sums, grouped as the API groups, by each row's minute (as rolled up)."""
    sums: dict[str, list[int]] = defaultdict(lambda: [0] * 6)
    for r in items:
        minute = datetime.fromtimestamp(r.done_at, UTC).replace(second=0, microsecond=0)
        if r.outcome == "refused" or not start <= minute < end:
            continue
        if tenant is not None and r.tenant != tenant:
            continue
        figures = (1, r.prompt_tokens, r.completion_tokens, r.cached_tokens, r.fresh_tokens)
        row = sums[_key(r, group_by, minute)]
        for i, value in enumerate((*figures, r.units or 0)):
            row[i] += value
    return [
        UsageRow(
            key=k,
            requests=v[0],
            tokens_input=v[1],
            tokens_output=v[2],
            tokens_cached=v[3],
            tokens_fresh=v[4],
            units=v[5],
        )
        for k, v in sorted(sums.items())
    ]


async def _check(
    url: str,
    items: list[UsageRecord],
    window: tuple[datetime, datetime],
    group_by: GroupBy,
    tenant: str | None,
) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("TRUNCATE ledger, usage_minute, usage_hour")
        half = len(items) // 2
        await ledger.insert_batch(conn, items[:half])
        await ledger.insert_batch(conn, items)  # the first half again: a replay adds nothing
        assert await ledger.hour_totals(conn) == await ledger.rollup_totals(conn)
    async with AsyncConnectionPool(url, min_size=1, max_size=1, open=False) as pool:
        got = await usage.usage(
            pool, group_by=group_by, start=window[0], end=window[1], tenant=tenant
        )
    assert got == expected(items, group_by, *window, tenant)


def test_usage_from_hours_equals_the_ledger_sums(postgres_url: str) -> None:
    asyncio.run(_migrate(postgres_url))

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        items=records(),
        window=windows(),
        group_by=st.sampled_from(["hour", "day", "model", "project"]),
        tenant=st.sampled_from([None, "a", "b"]),
    )
    def check(
        items: list[UsageRecord],
        window: tuple[datetime, datetime],
        group_by: GroupBy,
        tenant: str | None,
    ) -> None:
        asyncio.run(_check(postgres_url, items, window, group_by, tenant))

    check()


def test_split_keeps_whole_utc_hours_inside_the_window() -> None:
    on = T0 + timedelta(hours=2)
    assert usage.split(on, on + timedelta(hours=3)) == (on, on + timedelta(hours=3))
    inside = (on + timedelta(minutes=5), on + timedelta(minutes=50))
    assert usage.split(*inside) == (inside[1], inside[1])
    odd = (on + timedelta(minutes=30), on + timedelta(hours=2, minutes=30))
    assert usage.split(*odd) == (on + timedelta(hours=1), on + timedelta(hours=2))


async def _migrate(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await apply_migrations(conn)
