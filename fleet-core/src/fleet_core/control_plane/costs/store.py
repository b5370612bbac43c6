"""Cost rows, and the two queries that measure a month, streamed in Postgres.

A month of a busy fleet is millions of ledger rows; none of them comes to Python. Capacity is a
window over ``capacity_samples`` (each sample holds until the next, for at most the maximum gap);
busy time is a sweep over each replica's request starts and ends (``measuring`` says, in Python,
what both compute). Only per-cluster and per-project sums come back.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any

import msgspec
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from fleet_core.control_plane.costs.allocation import round_half_up
from fleet_core.control_plane.costs.measuring import Measurements, RateSlice
from fleet_core.control_plane.costs.periods import Period
from fleet_core.control_plane.costs.wire import CorrectionLine, CostRate, CostReport, RateCreate
from fleet_core.shared import paging
from fleet_core.shared.storage.rows import utc_row

__all__ = ["CostStore"]

# A close reads one snapshot (capacity, who used the month and how much must agree, or a
# project committed between two statements has usage and no key), taken after the lock: LOCK
# TABLE takes no snapshot, so the first SELECT, after it, sees every close committed before.
# SHARE ROW EXCLUSIVE excludes itself and writers, not readers: GETs go on during a close.
_BEGIN_CLOSE = (
    "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
    "LOCK TABLE cost_periods IN SHARE ROW EXCLUSIVE MODE",
)
# When the fleet first had anything to bill before a month: capacity, or a finished request
# (through the ledger's done_at index).
_DATA_BEFORE = """
SELECT least((SELECT min(observed_at) FROM capacity_samples WHERE observed_at < %(start)s),
             (SELECT min(done_at) FROM ledger WHERE done_at <= %(start)s))
"""
_RATE = (
    "id, cluster_id AS cluster, gpu_hour_micro, currency,"
    " nullif(effective_from, '-infinity') AS effective_from, created_at"
)


def _us(ts: str) -> str:
    """A timestamptz expression as integer microseconds since the epoch (exact: numeric)."""
    return f"(extract(epoch FROM {ts}) * 1000000)::bigint"


# Each sample holds until the next one, for at most %(gap)s, never past a decommission; clipped
# to the month. A cluster's lifetime runs from its first sample to its decommission, or else to
# what its last sample vouches for: coverage is observed time over the part of the month the
# cluster existed ('existed'). Clusters are those with samples near the month, those reporting
# now and those decommissioned; their first and last samples come from the primary key's index.
# GPU-time is summed as numeric: the largest count a report may carry (2^31 - 1 GPUs) over a
# 31-day month is 5.8e21 GPU-µs, past bigint; Python carries the figure on exactly. A sample's
# MIG slices are slice_num / slice_den cards (ADR 0026): their time is summed per denominator,
# as integers, and Python adds the fractions ('gpu_us' whole GPUs, 'slice_us' over 'den').
_OBSERVED = f"""
WITH s AS (
    SELECT cluster_id, observed_at AS t, gpus, slice_num, slice_den,
           lead(observed_at) OVER (PARTITION BY cluster_id ORDER BY observed_at) AS next_t
    FROM capacity_samples
    WHERE observed_at >= %(start)s - %(gap)s AND observed_at < %(end)s
), iv AS (
    SELECT s.cluster_id, gpus, slice_num, slice_den, greatest(t, %(start)s) AS a,
           least(coalesce(next_t, 'infinity'), t + %(gap)s, %(end)s,
                 coalesce(d.decommissioned_at, 'infinity')) AS b
    FROM s LEFT JOIN cluster_decommissions d USING (cluster_id)
), obs AS (
    SELECT cluster_id, gpus, slice_num, slice_den, {_us("a")} AS a, {_us("b")} AS b
    FROM iv WHERE b > a
), r AS (
    SELECT id, cluster_id, gpu_hour_micro, currency, effective_from,
           CASE WHEN effective_from = '-infinity' THEN -9223372036854775807
                ELSE {_us("effective_from")} END AS ra,
           coalesce({_us("lead(effective_from) OVER w")}, 9223372036854775807) AS rb
    FROM cost_rates
    WINDOW w AS (PARTITION BY cluster_id ORDER BY effective_from)
), known AS (
    SELECT DISTINCT cluster_id FROM s
    UNION SELECT cluster_id FROM inventory_reports
    UNION SELECT cluster_id FROM cluster_decommissions
), span AS (
    SELECT k.cluster_id, d.decommissioned_at,
           (SELECT min(observed_at) FROM capacity_samples c WHERE c.cluster_id = k.cluster_id)
               AS first_at,
           (SELECT max(observed_at) FROM capacity_samples c WHERE c.cluster_id = k.cluster_id)
               AS last_at
    FROM known k LEFT JOIN cluster_decommissions d USING (cluster_id)
), life AS (
    SELECT cluster_id, greatest(first_at, %(start)s) AS a,
           least(coalesce(decommissioned_at, last_at + %(gap)s), %(end)s) AS b
    FROM span
), priced AS (
    SELECT o.*, r.gpu_hour_micro, r.currency, r.effective_from,
           least(o.b, r.rb) - greatest(o.a, r.ra) AS us
    FROM obs o LEFT JOIN r ON r.cluster_id = o.cluster_id AND r.ra < o.b AND r.rb > o.a
)
SELECT 'rate' AS kind, cluster_id, gpu_hour_micro, currency,
       nullif(effective_from, '-infinity') AS effective_from, slice_den AS den,
       sum(gpus::numeric * us) AS gpu_us, sum(slice_num * us) AS slice_us
FROM priced
GROUP BY 1, 2, 3, 4, 5, 6
UNION ALL
SELECT 'seconds', cluster_id, NULL, NULL, NULL, 1, sum(b - a)::numeric, 0 FROM obs GROUP BY 2
UNION ALL
SELECT 'gpu', cluster_id, NULL, NULL, NULL, slice_den, sum(gpus::numeric * (b - a)),
       sum(slice_num * (b - a))
FROM obs GROUP BY 2, 6
UNION ALL
SELECT 'existed', cluster_id, NULL, NULL, NULL, 1, ({_us("b")} - {_us("a")})::numeric, 0
FROM life WHERE b > a
"""


def _offset(ts: str) -> str:
    """A timestamptz expression as integer microseconds from the month's start."""
    return f"round(date_part('epoch', {ts} - %(start)s) * 1e6)::bigint"


# Per replica, events sorted by time: n = requests in flight after an event, len = the time to
# the next distinct event. F(t) = ∫ SCALE/n over busy time before t, so a request's share is
# F(end) − F(start), and a project's is Σ −delta × F over its events. Among events at the same
# instant only the last in sort order has len > 0 and its n counts them all, so ties cannot
# change the result; F before a row is the running sum of the shares of the rows before it (both
# windows are one pass over one sort). Each share is an integer (SCALE/n is exact for n up to
# 10, truncated by less than 1/SCALE µs beyond) and every running sum stays below 2^53 (a 31-day
# month × SCALE), so summing them as float8 — much cheaper than numeric — is exact, and the
# figures do not depend on the order Postgres adds them in: recomputing an unchanged month gives
# the same result to the micro-unit. Times are µs from the month's start.
SCALE = 2_520  # lcm(1..10)


def _hash(tenant: str, project: str) -> str:
    """The 64-bit key of a (tenant, project): the same expression wherever it is computed."""
    return f"hashtextextended({tenant} || chr(1) || {project}, 20261130)"


_KEY = _hash("coalesce(l.tenant, '')", "coalesce(l.project, '')")
# Requests on a replica in the month: each gives a start event (+1) and an end event (−1), clipped
# to the month. A request belongs to the placement version in effect when it was received (pod
# IPs are recycled: the same URL was another replica in another month). Two branches of one
# UNION ALL, each a parallel scan, rather than a LATERAL VALUES of two rows per request: that
# nested loop cost more than scanning the ledger twice.
_IN_MONTH = "l.done_at > %(start)s AND l.received_at < %(end)s AND l.done_at > l.received_at"
_PLACED = "p.endpoint = l.endpoint AND l.received_at >= p.valid_from AND l.received_at < p.valid_to"
_USAGE = f"""
WITH ev AS (
    SELECT p.replica, {_KEY} AS key, {_offset("greatest(l.received_at, %(start)s)")} AS t, 1 AS d
    FROM ledger l JOIN endpoint_placements p ON {_PLACED}
    WHERE {_IN_MONTH}
    UNION ALL
    SELECT p.replica, {_KEY}, {_offset("least(l.done_at, %(end)s)")}, -1
    FROM ledger l JOIN endpoint_placements p ON {_PLACED}
    WHERE {_IN_MONTH}
), swept AS (
    SELECT ev.*, sum(d) OVER w AS n, lead(t) OVER w AS next_t
    FROM ev
    WINDOW w AS (PARTITION BY replica ORDER BY t ROWS UNBOUNDED PRECEDING)
), segs AS (
    SELECT replica, key, t, d, CASE WHEN n > 0 AND next_t > t THEN next_t - t ELSE 0 END AS len, n
    FROM swept
), f AS (
    SELECT replica, key, d, len, share,
           sum(share) OVER (PARTITION BY replica ORDER BY t ROWS UNBOUNDED PRECEDING) AS upto
    FROM (SELECT segs.*, (len * {SCALE} / greatest(n, 1))::float8 AS share FROM segs) AS shared
), summed AS (
    SELECT replica, key, sum(len) AS busy, sum(-d * (upto - share)::bigint) AS used
    FROM f GROUP BY 1, 2
)
SELECT p.cluster_id, p.gpus_per_replica AS g, p.share_num AS sn, p.share_den AS sd, s.key,
       s.busy, s.used
FROM summed s JOIN endpoint_placements p USING (replica)
"""

# Who used the month, each (tenant, project) as a 64-bit hash: the sweep sorts millions of
# events, and an integer is cheaper to carry through a sort than two strings. (A temporary table
# of numbered keys would do too, but parallel workers cannot read temporary tables.) ``measure``
# refuses a collision rather than merge two projects' shares.
_KEYS = f"""
SELECT tenant, project, {_hash("tenant", "project")} AS key, unplaced
FROM (
    SELECT coalesce(l.tenant, '') AS tenant, coalesce(l.project, '') AS project,
           count(*) FILTER (WHERE p.endpoint IS NULL) AS unplaced
    FROM ledger l LEFT JOIN endpoint_placements p ON {_PLACED}
    WHERE l.done_at > %(start)s AND l.received_at < %(end)s AND l.endpoint IS NOT NULL
    GROUP BY 1, 2
) AS k
"""


_report = msgspec.json.Decoder(CostReport)


class CostStore:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool

    async def insert_rate(self, rate_id: str, new: RateCreate) -> CostRate | None:
        """The new rate, or None when the cluster already has one from the same instant."""
        async with self._pool.connection() as conn:
            cursor = conn.cursor(row_factory=utc_row(_rate))
            await cursor.execute(
                "INSERT INTO cost_rates (id, cluster_id, gpu_hour_micro, currency, effective_from)"
                " VALUES (%s, %s, %s, %s, coalesce(%s, '-infinity'::timestamptz))"
                f" ON CONFLICT (cluster_id, effective_from) DO NOTHING RETURNING {_RATE}",
                (rate_id, new.cluster, new.gpu_hour_micro, new.currency, new.effective_from),
            )
            return await cursor.fetchone()

    async def list_rates(self, cluster: str | None, page: paging.Page) -> list[CostRate]:
        """One page by cluster and start (unique together; the first start may be -infinity)."""
        past, order = paging.keyset(["cluster_id", "cost_rates.effective_from"], page)
        async with self._pool.connection() as conn:
            cursor = conn.cursor(row_factory=utc_row(_rate))
            await cursor.execute(
                f"SELECT {_RATE} FROM cost_rates WHERE (%(c)s::text IS NULL OR cluster_id = %(c)s)"
                f" AND {past} ORDER BY {order}",
                {"c": cluster, **paging.params(page)},
            )
            return await cursor.fetchall()

    async def list_periods(
        self, page: paging.Page
    ) -> list[tuple[str, bytes, datetime, int, str | None]]:
        past, order = paging.keyset(["c.period"], page)
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT c.period, c.report::text, c.closed_at, c.recomputes, n.period"
                " FROM cost_periods c LEFT JOIN cost_periods n ON n.period = to_char("
                " to_date(c.period, 'YYYY-MM') + interval '1 month', 'YYYY-MM')"
                f" WHERE {past} ORDER BY {order}",
                paging.params(page),
            )
            return [
                (r[0], r[1].encode(), r[2].astimezone(UTC), r[3], r[4])
                for r in await cursor.fetchall()
            ]

    async def get(self, conn: AsyncConnection[Any], period: Period) -> CostReport | None:
        cursor = await conn.execute(
            "SELECT report::text, closed_at, recomputed_at, recomputes FROM cost_periods"
            " WHERE period = %s",
            (period.name,),
        )
        row = await cursor.fetchone()
        if row is None:
            return None
        booked = await self.corrections(conn, from_period=period.name)
        return msgspec.structs.replace(
            _report.decode(row[0]),
            closed_at=row[1].astimezone(UTC),
            recomputed_at=row[2].astimezone(UTC) if row[2] else None,
            recomputes=row[3],
            corrections_booked=booked,
        )

    async def allocations(
        self, conn: AsyncConnection[Any], period: Period
    ) -> dict[tuple[str, str], int]:
        cursor = await conn.execute(
            "SELECT tenant, project, allocated FROM cost_allocations WHERE period = %s",
            (period.name,),
        )
        return {(r[0], r[1]): r[2] for r in await cursor.fetchall()}

    async def corrections(
        self, conn: AsyncConnection[Any], *, into: str | None = None, from_period: str | None = None
    ) -> list[CorrectionLine]:
        column, value = ("period", into) if into is not None else ("from_period", from_period)
        cursor = await conn.execute(
            "SELECT from_period, tenant, project, sum(amount)::bigint FROM cost_corrections"
            f" WHERE {column} = %s GROUP BY 1, 2, 3 HAVING sum(amount) <> 0 ORDER BY 1, 2, 3",
            (value,),
        )
        return [
            CorrectionLine(from_period=r[0], tenant=r[1], project=r[2], amount=r[3])
            for r in await cursor.fetchall()
        ]

    async def closed(self, conn: AsyncConnection[Any]) -> set[str]:
        cursor = await conn.execute("SELECT period FROM cost_periods")
        return {row[0] for row in await cursor.fetchall()}

    async def begin_close(self, conn: AsyncConnection[Any]) -> None:
        """Closing is serialized, one close at a time until the transaction ends, on one
        snapshot. The first statements of the transaction."""
        for statement in _BEGIN_CLOSE:
            await conn.execute(statement)

    async def data_before(self, conn: AsyncConnection[Any], period: Period) -> datetime | None:
        """The earliest capacity sample or finished request before ``period``, if any."""
        cursor = await conn.execute(_DATA_BEFORE, {"start": period.start})
        row = await cursor.fetchone()
        return _utc(row[0]) if row else None

    async def measure(
        self, conn: AsyncConnection[Any], period: Period, *, max_gap_s: int
    ) -> Measurements:
        params = {"start": period.start, "end": period.end, "gap": timedelta(seconds=max_gap_s)}
        found = Measurements()
        # A batch job over millions of rows: let the planner scan and join in parallel workers
        # (its estimates of the ledger filters are far below the truth), and sort in memory
        # what fits. No JIT: these plans are costed far above jit_above_cost, and compiling
        # them (with inlining and optimization, in the leader and every worker) took seconds
        # that the expressions it sped up never gave back.
        for setting in (
            "SET LOCAL jit = off",
            "SET LOCAL work_mem = '128MB'",
            "SET LOCAL parallel_setup_cost = 0",
            "SET LOCAL parallel_tuple_cost = 0",
        ):
            await conn.execute(setting)
        cursor = conn.cursor(row_factory=dict_row)
        await cursor.execute(_OBSERVED, params)
        _observed(found, await cursor.fetchall())
        await cursor.execute(_KEYS, params)
        keys: dict[int, tuple[str, str]] = {}
        for row in await cursor.fetchall():
            found.unplaced += int(row["unplaced"])
            seen = keys.setdefault(row["key"], (row["tenant"], row["project"]))
            if seen != (row["tenant"], row["project"]):
                raise RuntimeError(f"cost key hash collision between {seen} and {row}")
        await cursor.execute(_USAGE, params)
        # A project's weight: its share on whole GPUs rounded half up to the GPU-µs, as closes
        # computed it before slices were priced (so a month closed then recomputes to the same
        # micro-unit), plus its share on slices exactly (ADR 0026).
        whole: dict[tuple[str, str], Fraction] = {}
        sliced: dict[tuple[str, str], Fraction] = {}
        for row in await cursor.fetchall():
            cluster, key = row["cluster_id"], keys[row["key"]]
            cards = Fraction(row["g"] * row["sn"], row["sd"])  # the replica's part of cards
            busy = found.busy_gpu_us.get(cluster, Fraction(0)) + cards * int(row["busy"])
            found.busy_gpu_us[cluster] = busy
            into = whole if row["sn"] == row["sd"] else sliced
            into[key] = into.get(key, Fraction(0)) + cards * int(row["used"]) / SCALE
        found.used_gpu_us = {
            key: round_half_up(whole.get(key, Fraction(0))) + sliced.get(key, Fraction(0))
            for key in whole.keys() | sliced.keys()
        }
        return found

    async def save(
        self,
        conn: AsyncConnection[Any],
        report: CostReport,
        allocations: dict[tuple[str, str], int],
    ) -> None:
        await conn.execute(
            "INSERT INTO cost_periods (period, report, closed_at) VALUES (%s, %s::jsonb, %s)",
            (report.period, msgspec.json.encode(report).decode(), report.computed_at),
        )
        await self._put_allocations(conn, report.period, allocations)

    async def book(
        self,
        conn: AsyncConnection[Any],
        period: Period,
        allocations: dict[tuple[str, str], int],
        differences: dict[tuple[str, str], int],
        *,
        at: datetime,
    ) -> None:
        """A re-close that changed figures: differences go to the next month, never this one."""
        async with conn.cursor() as cursor:
            await cursor.executemany(
                "INSERT INTO cost_corrections (period, from_period, tenant, project, amount,"
                " booked_at) VALUES (%s, %s, %s, %s, %s, %s)",
                [
                    (period.following().name, period.name, t, p, amount, at)
                    for (t, p), amount in sorted(differences.items())
                ],
            )
        await conn.execute(
            "UPDATE cost_periods SET recomputed_at = %s, recomputes = recomputes + 1"
            " WHERE period = %s",
            (at, period.name),
        )
        await conn.execute("DELETE FROM cost_allocations WHERE period = %s", (period.name,))
        await self._put_allocations(conn, period.name, allocations)

    async def _put_allocations(
        self, conn: AsyncConnection[Any], period: str, allocations: dict[tuple[str, str], int]
    ) -> None:
        async with conn.cursor() as cursor:
            await cursor.executemany(
                "INSERT INTO cost_allocations (period, tenant, project, allocated)"
                " VALUES (%s, %s, %s, %s)",
                [(period, t, p, amount) for (t, p), amount in sorted(allocations.items())],
            )

    def connection(self) -> Any:
        return self._pool.connection()


def _observed(found: Measurements, rows: list[dict[str, Any]]) -> None:
    """The rows of ``_OBSERVED`` into ``found``: time per cluster, GPU-time (whole GPUs plus
    slices, one row per slice denominator) per cluster and per rate, as exact fractions."""
    priced: dict[tuple[str, int, str, datetime | None], Fraction] = {}
    for row in rows:
        cluster, amount = row["cluster_id"], int(row["gpu_us"] or 0)
        gpu_us = amount + Fraction(int(row["slice_us"] or 0), int(row["den"]))
        if row["kind"] == "seconds":
            found.observed_us[cluster] = amount
        elif row["kind"] == "existed":
            found.existed_us[cluster] = amount
        elif row["kind"] == "gpu":
            found.capacity_gpu_us[cluster] = found.capacity_gpu_us.get(cluster, 0) + gpu_us
        elif row["gpu_hour_micro"] is not None:  # else: observed time no rate covers
            rate = (cluster, row["gpu_hour_micro"], row["currency"], _utc(row["effective_from"]))
            priced[rate] = priced.get(rate, Fraction(0)) + gpu_us
    found.slices = [RateSlice(*rate, gpu_us=gpu_us) for rate, gpu_us in priced.items()]


def _utc(value: datetime | None) -> datetime | None:
    return value.astimezone(UTC) if value is not None else None


def _rate(**row: Any) -> CostRate:
    converted: dict[str, Any] = {
        k: _utc(v) if isinstance(v, datetime) else v for k, v in row.items()
    }
    return CostRate(**converted)
