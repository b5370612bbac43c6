"""The closing queries agree with the Python definitions on random ledgers and capacity series.

Hypothesis draws requests on replicas of two clusters (some crossing the month's edges, some
starting together; some replicas on MIG slices) and heartbeats with gaps and slices; the store's
streaming SQL must find the busy time, each project's share, the observed time and the observed
GPU-time (in all and per rate) that ``measuring`` computes exactly.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from fractions import Fraction

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet_core.control_plane.costs.measuring import (
    Cards,
    Measurements,
    observed_intervals,
    replica_usage,
)
from fleet_core.control_plane.costs.periods import Period
from fleet_core.control_plane.costs.store import CostStore
from fleet_core.shared.storage.migrations import apply_migrations

PERIOD = Period(2026, 9)
START_US = int(PERIOD.start.timestamp()) * 1_000_000
END_US = int(PERIOD.end.timestamp()) * 1_000_000
REPLICAS = {  # endpoint: cluster, GPUs per replica, each GPU's share of a card
    "http://a1": ("a", 1, Fraction(1)),
    "http://a2": ("a", 1, Fraction(1, 7)),
    "http://b1": ("b", 2, Fraction(3, 7)),
    "http://b2": ("b", 2, Fraction(1)),
}
RATES = [("a", None), ("b", None), ("b", 1_000_000_000_000)]  # b's changes 11.6 days in
GAP_S = 90

offsets = st.one_of(  # near the month's start, or near its end
    st.integers(min_value=-200_000_000, max_value=600_000_000),
    st.integers(min_value=-400_000_000, max_value=200_000_000).map(
        lambda us: END_US - START_US + us
    ),
)
requests = st.lists(
    st.tuples(
        offsets,
        st.sampled_from([0, 1, 30_000_000, 45_500_001, 120_000_000, 333_333_333]),
        st.sampled_from(list(REPLICAS)),
        st.sampled_from([("acme", "chat"), ("acme", "batch"), ("globex", "")]),
    ),
    max_size=30,
)
slices = st.sampled_from([Fraction(0), Fraction(1, 7), Fraction(9, 4), Fraction(5, 63)])
samples = st.lists(
    st.tuples(st.sampled_from(["a", "b"]), offsets, st.integers(min_value=0, max_value=8), slices),
    max_size=30,
    unique_by=lambda s: (s[0], s[1]),
)


Drawn = list[tuple[int, int, str, tuple[str, str]]]
Beats = list[tuple[str, int, int, Fraction]]


def at(offset_us: int) -> datetime:
    return PERIOD.start + timedelta(microseconds=offset_us)


async def measure(url: str, drawn: Drawn, heartbeats: Beats) -> Measurements:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        await conn.execute("TRUNCATE ledger, capacity_samples, endpoint_placements, cost_rates")
        async with conn.cursor() as cursor:
            await cursor.executemany(
                "INSERT INTO endpoint_placements (endpoint, cluster_id, gpus_per_replica,"
                " share_num, share_den, first_seen, last_seen)"
                " VALUES (%s, %s, %s, %s, %s, now(), now())",
                [(e, c, g, s.numerator, s.denominator) for e, (c, g, s) in REPLICAS.items()],
            )
            await cursor.executemany(
                "INSERT INTO capacity_samples VALUES (%s, %s, %s, %s, %s)",
                [(c, at(t), g, s.numerator, s.denominator) for c, t, g, s in heartbeats],
            )
            await cursor.executemany(
                "INSERT INTO cost_rates (id, cluster_id, gpu_hour_micro, currency, effective_from)"
                " VALUES (%s, %s, 1, 'USD', coalesce(%s, '-infinity'::timestamptz))",
                [(f"r{i}", c, at(t) if t else None) for i, (c, t) in enumerate(RATES)],
            )
            await cursor.executemany(
                "INSERT INTO ledger (request_id, received_at, done_at, tenant, project, model,"
                " served_model, endpoint, kind, status, outcome, stream, gw_prompt_tokens,"
                " gw_completion_tokens, count_method, prompt_tokens, completion_tokens,"
                " cached_tokens, fresh_tokens) VALUES (%s, %s, %s, %s, nullif(%s, ''), 'm',"
                " 'm', %s, 'chat', 200, 'ok', false, 1, 1, 'engine', 1, 1, 0, 1)",
                [
                    (f"r{i}", at(t), at(t + d), tenant, project, e)
                    for i, (t, d, e, (tenant, project)) in enumerate(drawn)
                ],
            )
        store = CostStore(None)  # type: ignore[arg-type]  # measuring needs no pool, only conn
        found = await store.measure(conn, PERIOD, max_gap_s=GAP_S)
        await conn.commit()
        return found


def expected(
    drawn: Drawn, heartbeats: Beats
) -> tuple[dict[str, Cards], dict[tuple[str, str], Fraction], dict[str, int], dict[str, Cards]]:
    busy: dict[str, Cards] = {}
    used: dict[tuple[str, str], Fraction] = {}
    for endpoint, (cluster, gpus, share) in REPLICAS.items():
        mine = [
            (max(t, 0), min(t + d, END_US - START_US), key)
            for t, d, e, key in drawn
            if e == endpoint and d > 0
        ]
        replica_busy, shares = replica_usage(mine, gpus=gpus * share)
        busy[cluster] = busy.get(cluster, 0) + replica_busy
        for key, share in shares.items():
            used[key] = used.get(key, Fraction(0)) + share
    observed: dict[str, int] = {}
    capacity: dict[str, Cards] = {}
    for cluster in ("a", "b"):
        series = sorted((t, g + s) for c, t, g, s in heartbeats if c == cluster)
        spans = observed_intervals(
            series, start=0, end=END_US - START_US, max_gap_us=GAP_S * 1_000_000
        )
        if spans:
            observed[cluster] = sum(b - a for a, b, _ in spans)
            capacity[cluster] = sum((b - a) * cards for a, b, cards in spans)
    return busy, used, observed, capacity


def test_the_sql_measures_what_the_definitions_say(postgres_url: str) -> None:
    async def migrate() -> None:
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
            await apply_migrations(conn)

    asyncio.run(migrate())

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(requests, samples)
    def check(drawn: Drawn, heartbeats: Beats) -> None:
        found = asyncio.run(measure(postgres_url, drawn, heartbeats))
        busy, used, observed, capacity = expected(drawn, heartbeats)
        assert {c: us for c, us in found.busy_gpu_us.items() if us} == {
            c: us for c, us in busy.items() if us
        }
        got = {k: v for k, v in found.used_gpu_us.items() if v}
        assert {k for k, v in used.items() if v > 1} <= set(got)
        for key, value in used.items():
            assert abs(got.get(key, 0) - value) <= 1  # numeric division, rounded per cluster
        assert found.observed_us == observed
        assert found.capacity_gpu_us == capacity  # exact, slices and all
        for cluster, cards in capacity.items():  # every observed GPU-µs priced, at one rate
            assert sum(r.gpu_us for r in found.slices if r.cluster == cluster) == cards

    check()
