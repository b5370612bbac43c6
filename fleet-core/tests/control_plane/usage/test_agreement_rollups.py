"""The usage agreement read from its hourly rollups (plus raw rows at a window's edges) equals
the agreement computed from the raw ledger rows, as the pre-rollup query computed it.

Property: for random records (models, count methods, outcomes, engine usage or none, token
counts that differ between engine and gateway, times over six hours across a UTC midnight, some
batches replayed) and a random window and model filter, ``usage.store.agreement`` returns the
raw query's counts, count methods and p95s exactly and its means to float rounding.
"""

from __future__ import annotations

import asyncio
import math
from datetime import datetime, timedelta

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg_pool import AsyncConnectionPool

from fleet_core.control_plane.usage import store as usage
from fleet_core.control_plane.usage.wire import Agreement
from fleet_core.gateway.ledger import store as ledger
from fleet_core.gateway.metering.records import EngineUsage, GatewayCount, UsageRecord
from fleet_core.shared.storage import migrations
from fleet_core.shared.storage.migrations import apply_migrations

from .test_hour_rollups import SPAN_S, T0, drawn_record, windows

# The agreement as it was computed before the rollups: every raw row of the window.
_RAW = """
SELECT model, count(*), count(engine_prompt_tokens),
       avg(P), percentile_cont(0.95) WITHIN GROUP (ORDER BY abs(P)),
       avg(C), percentile_cont(0.95) WITHIN GROUP (ORDER BY abs(C)),
       array_agg(DISTINCT count_method ORDER BY count_method)
FROM (SELECT *, (gw_prompt_tokens - engine_prompt_tokens)::float8
                / greatest(engine_prompt_tokens, 1) AS P,
                (gw_completion_tokens - engine_completion_tokens)::float8
                / greatest(engine_completion_tokens, 1) AS C FROM ledger) AS rows
WHERE done_at >= %(start)s AND done_at < %(end)s AND outcome <> 'refused'
  AND (%(model)s::text IS NULL OR model = %(model)s)
GROUP BY model ORDER BY model
"""
_TABLES = "ledger, usage_minute, usage_hour, agreement_hour, agreement_diff_hour"


@st.composite
def records(draw: st.DrawFn) -> list[UsageRecord]:
    made = []
    small = st.integers(0, 40)  # small counts repeat, so the histogram's rows hold several
    for n in range(draw(st.integers(0, 60))):
        engine = draw(st.none() | st.tuples(small, small).map(lambda t: EngineUsage(*t)))
        method = st.sampled_from(["tokenizer:m", "estimate"])
        gateway = GatewayCount(draw(small), draw(small), draw(method))
        made.append(drawn_record(draw, n, engine=engine, gateway=gateway, tenant="a", project="x"))
    return made


async def _raw(url: str, start: datetime, end: datetime, model: str | None) -> list[tuple]:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cursor = await conn.execute(_RAW, {"start": start, "end": end, "model": model})
        return await cursor.fetchall()


def _same(got: list[Agreement], raw: list[tuple]) -> None:
    assert [a.model for a in got] == [r[0] for r in raw]
    for a, r in zip(got, raw, strict=True):
        assert (a.requests, a.compared, a.without_engine_usage) == (r[1], r[2], r[1] - r[2])
        assert a.count_methods == list(r[7])
        assert a.prompt.p95_abs_relative_diff == r[4]  # exact: the same floats, interpolated
        assert a.completion.p95_abs_relative_diff == r[6]
        for mean, expected in ((a.prompt.mean_relative_diff, r[3]),
                               (a.completion.mean_relative_diff, r[5])):  # fmt: skip
            assert (mean is None) == (expected is None)
            if mean is not None:
                assert math.isclose(mean, expected, rel_tol=1e-9, abs_tol=1e-12)


async def _check(
    url: str, items: list[UsageRecord], window: tuple[datetime, datetime], model: str | None
) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(f"TRUNCATE {_TABLES}")
        half = len(items) // 2
        await ledger.insert_batch(conn, items[:half])
        await ledger.insert_batch(conn, items)  # the first half again: a replay adds nothing
    async with AsyncConnectionPool(url, min_size=1, max_size=1, open=False) as pool:
        got = await usage.agreement(pool, start=window[0], end=window[1], model=model)
    _same(got, await _raw(url, *window, model))


def test_agreement_from_rollups_equals_the_raw_rows(postgres_url: str) -> None:
    asyncio.run(_migrate(postgres_url))

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(items=records(), window=windows(), model=st.sampled_from([None, "m1"]))
    def check(
        items: list[UsageRecord], window: tuple[datetime, datetime], model: str | None
    ) -> None:
        asyncio.run(_check(postgres_url, items, window, model))

    check()


def test_migration_backfills_the_agreement_from_the_ledger(postgres_url: str) -> None:
    """Rows written before migration 0016 (the rollups emptied here) are rolled up by its
    backfill: re-running its statements over the ledger gives the same agreement."""

    async def run() -> None:
        await _migrate(postgres_url)
        items = _fixed()
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
            await conn.execute(f"TRUNCATE {_TABLES}")
            await ledger.insert_batch(conn, items)
            await conn.execute("TRUNCATE agreement_hour, agreement_diff_hour")
            await conn.execute(_backfill())
        window = (T0, T0 + timedelta(seconds=SPAN_S))
        async with AsyncConnectionPool(postgres_url, min_size=1, max_size=1, open=False) as pool:
            got = await usage.agreement(pool, start=window[0], end=window[1])
        assert len(got) == 1
        assert got[0].compared == 2
        _same(got, await _raw(postgres_url, *window, None))

    asyncio.run(run())


def _fixed() -> list[UsageRecord]:
    def one(n: int, engine: EngineUsage | None, seconds: int) -> UsageRecord:
        return UsageRecord(
            request_id=f"f{n}", kind="chat", model="m1", served_model="m",
            endpoint="http://e:1", status=200, outcome="ok", stream=False,
            received_at=T0.timestamp() + seconds - 1, first_byte_at=None,
            done_at=T0.timestamp() + seconds, engine=engine,
            gateway=GatewayCount(11, 5, "tokenizer:m"), tenant="a", project="x",
        )  # fmt: skip

    return [one(0, EngineUsage(10, 5), 60), one(1, EngineUsage(12, 4), 4000), one(2, None, 90)]


def _backfill() -> bytes:
    (text,) = (m.sql for m in migrations.available() if m.version == 16)
    return text[text.index("INSERT INTO agreement_hour") : text.index("-- Lists")].encode()


@pytest.mark.parametrize(
    ("histogram", "expected"),
    [([], None), ([(0.5, 1)], 0.5), ([(0.0, 19), (1.0, 1)], 0.05), ([(0.0, 18), (1.0, 2)], 1.0)],
)
def test_percentile_cont_interpolates_as_postgres(
    histogram: list[tuple[float, int]], expected: float | None
) -> None:
    got = usage.percentile_cont(histogram, 0.95)
    assert got == expected if expected is None else math.isclose(got or 0.0, expected)


async def _migrate(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await apply_migrations(conn)
