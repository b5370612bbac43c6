"""The period rules as a state machine over four months, on a real Postgres.

Hypothesis interleaves ledger rows arriving on time and late, redeployments that move a pod IP to
a replica of another size, capacity reported late, rate changes, and closes of any month in any
order (first closes, re-closes, refused ones). After every step:

- each issued report adds up: ``Σ allocated = pool`` (or the pool is unallocated), busy + idle;
- the books balance: a month's latest allocation is what it issued plus every correction it
  booked, and every correction appears in exactly one period (the one after), never after that
  period was issued;
- every ledger row is billed exactly once: a closed month with nothing new since it was last
  measured measures, afresh, exactly its latest allocation, to the micro-unit;
- a re-close with nothing new books no correction at all;
- a frozen month never changes (its report, its corrections and its allocations);
- a close is refused exactly when the rules say (month before open, or month frozen).
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any

import psycopg
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)
from psycopg_pool import AsyncConnectionPool

from fleet_core.control_plane.costs import closing
from fleet_core.control_plane.costs.periods import Period
from fleet_core.control_plane.costs.service import CostService, CostSettings
from fleet_core.control_plane.costs.store import CostStore
from fleet_core.shared.errors import Conflict
from fleet_core.shared.storage.migrations import apply_migrations

MONTHS = [Period(2026, m) for m in range(1, 5)]
ENDPOINTS = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
KEYS = [("acme", "chat"), ("acme", "batch"), ("globex", "main")]
SETTINGS = CostSettings(max_sample_gap_s=32 * 86_400, close_grace_s=3600)
NOW = datetime(2027, 1, 1, tzinfo=UTC)
ANY = closing.Closing(min_coverage=Fraction(0), threshold=Fraction(0))
_TABLES = (
    "cost_corrections, cost_allocations, cost_periods, cost_rates, ledger, capacity_samples,"
    " endpoint_placements, inventory_reports, cluster_decommissions"
)


def report_json(placement: dict[str, int]) -> str:
    """What the placement trigger reads of an inventory report."""
    return json.dumps(
        {
            "deployments": [
                {"gpusPerReplica": gpus, "endpoints": [{"url": url, "ready": True}]}
                for url, gpus in placement.items()
            ]
        }
    )


class Months(RuleBasedStateMachine):
    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.loop = asyncio.new_event_loop()
        self.pool = AsyncConnectionPool(url, min_size=1, max_size=1, open=False)
        self.loop.run_until_complete(self.pool.open(wait=True))
        self.service = CostService(CostStore(self.pool), settings=SETTINGS)
        self.step = 0
        self.closed: set[int] = set()
        self.dirty: set[int] = set()
        self.frozen: dict[int, Any] = {}
        self.last_report = MONTHS[0].start
        self.requests = 0
        self.rates: set[datetime] = set()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"TRUNCATE {_TABLES}")
            for period in [*MONTHS, MONTHS[-1].following()]:  # a sample at every month start
                conn.execute("INSERT INTO capacity_samples VALUES ('a', %s, 8)", (period.start,))
            conn.execute(
                "INSERT INTO cost_rates (id, cluster_id, gpu_hour_micro, currency)"
                " VALUES ('r0', 'a', 2000000, 'USD')"
            )
        self._report(MONTHS[0].start, {ENDPOINTS[0]: 1, ENDPOINTS[1]: 2})

    def teardown(self) -> None:
        self.loop.run_until_complete(self.pool.close())
        self.loop.close()

    # -- what the rules may touch: a month whose books are not frozen, and every later one

    def _open_from(self, month: int) -> bool:
        return all(not self._is_frozen(m) for m in range(month, len(MONTHS)))

    def _is_frozen(self, month: int) -> bool:
        return month in self.closed and month + 1 in self.closed

    def _report(self, at: datetime, placement: dict[str, int]) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO inventory_reports (cluster_id, observed_at, report)"
                " VALUES ('a', %s, %s::jsonb) ON CONFLICT (cluster_id) DO UPDATE"
                " SET observed_at = excluded.observed_at, report = excluded.report",
                (at, report_json(placement)),
            )
        self.last_report = at

    # -- rules

    @rule(
        month=st.integers(0, len(MONTHS) - 1),
        hour=st.integers(0, 27 * 24),
        minutes=st.integers(1, 180),
        endpoint=st.sampled_from(ENDPOINTS),
        key=st.sampled_from(KEYS),
    )
    def request(self, month: int, hour: int, minutes: int, endpoint: str, key: Any) -> None:
        """A served request, on time or late (after its month closed, before it froze)."""
        if self._is_frozen(month):
            return
        start = MONTHS[month].start + timedelta(hours=hour)
        self.requests += 1
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO ledger (request_id, received_at, done_at, tenant, project, model,"
                " served_model, endpoint, kind, status, outcome, stream, gw_prompt_tokens,"
                " gw_completion_tokens, count_method, prompt_tokens, completion_tokens,"
                " cached_tokens, fresh_tokens) VALUES (%s, %s, %s, %s, %s, 'm', 'm', %s,"
                " 'chat', 200, 'ok', false, 1, 1, 'engine', 1, 1, 0, 1)",
                (f"r{self.requests}", start, start + timedelta(minutes=minutes), *key, endpoint),
            )
        self.dirty.add(month)

    @rule(hours=st.integers(1, 40 * 24), gpus=st.sampled_from([1, 2, 4, 8]))
    def redeploy(self, hours: int, gpus: int) -> None:
        """The first pod IP now serves a replica of another size (the IP is recycled)."""
        at = self.last_report + timedelta(hours=hours)
        month = next((i for i, p in enumerate(MONTHS) if p.start <= at < p.end), None)
        if month is None or not self._open_from(month):
            return
        self._report(at, {ENDPOINTS[0]: gpus, ENDPOINTS[1]: 2})
        self.dirty.update(range(month, len(MONTHS)))

    @rule(month=st.integers(0, len(MONTHS) - 1), gpus=st.sampled_from([0, 4, 12]))
    def late_capacity(self, month: int, gpus: int) -> None:
        """A report from mid-month arrives late: the second half had other GPUs."""
        if self._is_frozen(month):
            return
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO capacity_samples VALUES ('a', %s, %s) ON CONFLICT DO NOTHING",
                (MONTHS[month].start + timedelta(days=15), gpus),
            )
        self.dirty.add(month)

    @rule(month=st.integers(1, len(MONTHS) - 1), price=st.integers(1, 10_000_000))
    def new_rate(self, month: int, price: int) -> None:
        """A new price from the start of a month on."""
        start = MONTHS[month].start
        if start in self.rates or not self._open_from(month):
            return
        self.rates.add(start)
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO cost_rates (id, cluster_id, gpu_hour_micro, currency,"
                " effective_from) VALUES (%s, 'a', %s, 'USD', %s)",
                (f"r{month}", price, start),
            )
        self.dirty.update(range(month, len(MONTHS)))

    @rule(month=st.integers(0, len(MONTHS) - 1))
    def close(self, month: int) -> None:
        period = MONTHS[month]
        before = self._corrections()
        expected = self._expected_refusal(month)
        refused = self._close(period)
        assert refused == expected, (period, refused, expected)
        if refused is not None:
            event(f"refused: {refused}")
            return
        after = self._corrections()
        event("booked corrections" if after != before else "booked none")
        if month in self.closed:  # a re-close: with nothing new, not one correction
            if month not in self.dirty:
                assert after == before
            self.dirty.discard(month)
        else:
            if month - 1 in self.closed:  # the month before was measured again, into this one
                if month - 1 not in self.dirty:
                    assert after == before
                self.dirty.discard(month - 1)
            self.closed.add(month)
            self.dirty.discard(month)
        event(f"months closed: {len(self.closed)}")
        for m in list(self.closed):
            if self._is_frozen(m) and m not in self.frozen:
                self.frozen[m] = self._books(m)

    @rule()
    def close_the_next(self) -> None:
        """What finance does most: close the first month not closed yet."""
        pending = [m for m in range(len(MONTHS)) if m not in self.closed]
        if pending:
            self.close(pending[0])

    def _close(self, period: Period) -> str | None:
        """The code a close was refused with, or None when it closed."""
        try:
            self.loop.run_until_complete(self.service.close(period.name, now=NOW))
        except Conflict as refused:
            return str(refused.code)
        return None

    def _expected_refusal(self, month: int) -> str | None:
        if month in self.closed:
            return "period_frozen" if month + 1 in self.closed else None
        return "previous_period_open" if month > 0 and month - 1 not in self.closed else None

    # -- reading the books

    def _corrections(self) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url) as conn:
            return conn.execute(
                "SELECT period, from_period, tenant, project, amount FROM cost_corrections"
                " ORDER BY id"
            ).fetchall()

    def _books(self, month: int) -> tuple[Any, ...]:
        name = MONTHS[month].name
        with psycopg.connect(self.url) as conn:
            report = conn.execute(
                "SELECT report, recomputes FROM cost_periods WHERE period = %s", (name,)
            ).fetchone()
            allocations = conn.execute(
                "SELECT tenant, project, allocated FROM cost_allocations WHERE period = %s"
                " ORDER BY 1, 2",
                (name,),
            ).fetchall()
            booked = conn.execute(
                "SELECT period, tenant, project, amount FROM cost_corrections"
                " WHERE from_period = %s ORDER BY id",
                (name,),
            ).fetchall()
        return (json.dumps(report, sort_keys=True, default=str), allocations, booked)

    async def _fresh(self, period: Period) -> dict[tuple[str, str], int]:
        store = self.service.store
        async with self.pool.connection() as conn, conn.transaction():
            found = await store.measure(conn, period, max_gap_s=SETTINGS.max_sample_gap_s)
        report, allocated = closing.compose(
            period, found, closing=ANY, corrections=[], computed_at=NOW
        )
        assert sum(allocated.values()) == (report.pool if allocated else 0)
        return allocated

    # -- invariants

    @invariant()
    def issued_reports_add_up(self) -> None:
        with psycopg.connect(self.url) as conn:
            for (body,) in conn.execute("SELECT report FROM cost_periods").fetchall():
                lines = sum(a["allocated"] for a in body["allocations"])
                assert lines == body["allocated"]
                assert body["allocated"] + body["unallocated"] == body["pool"]
                assert body["busy"] + body["idle"] == body["pool"]
                assert body["unallocated"] == (0 if body["allocations"] else body["pool"])

    @invariant()
    def the_books_balance(self) -> None:
        with psycopg.connect(self.url) as conn:
            for month in self.closed:
                name = MONTHS[month].name
                body = conn.execute(
                    "SELECT report FROM cost_periods WHERE period = %s", (name,)
                ).fetchone()[0]
                issued = {(a["tenant"], a["project"]): a["allocated"] for a in body["allocations"]}
                booked: dict[tuple[str, str], int] = defaultdict(int)
                for tenant, project, amount in conn.execute(
                    "SELECT tenant, project, amount FROM cost_corrections WHERE from_period = %s",
                    (name,),
                ).fetchall():
                    booked[(tenant, project)] += amount
                latest = dict(
                    ((t, p), a)
                    for t, p, a in conn.execute(
                        "SELECT tenant, project, allocated FROM cost_allocations WHERE period = %s",
                        (name,),
                    ).fetchall()
                )
                keys = set(issued) | set(booked) | set(latest)
                for key in keys:
                    assert issued.get(key, 0) + booked.get(key, 0) == latest.get(key, 0), key
                # what an issued report lists as corrections is all that was ever booked into it
                into = conn.execute(
                    "SELECT from_period, tenant, project, sum(amount)::bigint"
                    " FROM cost_corrections WHERE period = %s GROUP BY 1, 2, 3"
                    " HAVING sum(amount) <> 0",
                    (name,),
                ).fetchall()
                listed = {
                    (c["fromPeriod"], c["tenant"], c["project"], c["amount"])
                    for c in body["corrections"]
                }
                assert set(into) == listed

    @invariant()
    def every_row_is_billed_exactly_once(self) -> None:
        with psycopg.connect(self.url) as conn:
            stored = conn.execute(
                "SELECT period, tenant, project, allocated FROM cost_allocations"
            ).fetchall()
        latest: dict[str, dict[tuple[str, str], int]] = defaultdict(dict)
        for period, tenant, project, amount in stored:
            if amount:
                latest[period][(tenant, project)] = amount
        for month in sorted(self.closed - self.dirty):
            fresh = self.loop.run_until_complete(self._fresh(MONTHS[month]))
            assert {k: v for k, v in fresh.items() if v} == latest[MONTHS[month].name]

    @invariant()
    def frozen_months_never_change(self) -> None:
        for month, books in self.frozen.items():
            assert self._books(month) == books


def test_months_close_reclose_and_freeze_in_any_order(postgres_url: str) -> None:
    async def migrate() -> None:
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
            await apply_migrations(conn)

    asyncio.run(migrate())
    run_state_machine_as_test(
        lambda: Months(postgres_url),
        settings=settings(
            max_examples=25,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
