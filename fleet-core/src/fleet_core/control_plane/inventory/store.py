"""Where reports are kept: the newest per cluster, and each report's GPU count as a time series.

Postgres when the control plane has a database; process memory otherwise, because inventory is one
of the things the control plane serves without one (the series is then lost on restart, and the
cost pool, which needs it, requires the database anyway).
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from psycopg_pool import AsyncConnectionPool

from fleet_contract import InventoryReport, decode_report, encode_report
from fleet_core.control_plane.inventory.service import total_gpus
from fleet_core.shared import paging

__all__ = ["InventoryStore", "MemoryInventory", "PostgresInventory"]


class InventoryStore(Protocol):
    async def save(self, report: InventoryReport) -> None: ...

    async def latest(self) -> list[InventoryReport]: ...

    async def page(self, page: paging.Page) -> list[InventoryReport]:
        """A page of the newest reports in ``cluster_id`` order (`paging.keyset`'s limit + 1)."""
        ...

    async def get(self, cluster_id: str) -> InventoryReport | None: ...

    async def samples(self, cluster_id: str) -> list[tuple[datetime, int]]: ...

    async def decommission(self, cluster_id: str, *, at: datetime) -> bool:
        """Record that the cluster left at ``at``; False when it never reported."""
        ...


class MemoryInventory:
    def __init__(self) -> None:
        self._latest: dict[str, InventoryReport] = {}
        self._samples: dict[str, dict[datetime, int]] = {}

    async def save(self, report: InventoryReport) -> None:
        current = self._latest.get(report.cluster_id)
        if current is None or current.observed_at <= report.observed_at:
            self._latest[report.cluster_id] = report
        self._samples.setdefault(report.cluster_id, {})[report.observed_at] = total_gpus(report)

    async def latest(self) -> list[InventoryReport]:
        return list(self._latest.values())

    async def page(self, page: paging.Page) -> list[InventoryReport]:
        return paging.window(self._latest.values(), page, lambda r: (r.cluster_id,))

    async def get(self, cluster_id: str) -> InventoryReport | None:
        return self._latest.get(cluster_id)

    async def samples(self, cluster_id: str) -> list[tuple[datetime, int]]:
        return sorted(self._samples.get(cluster_id, {}).items())

    async def decommission(self, cluster_id: str, *, at: datetime) -> bool:
        return self._latest.pop(cluster_id, None) is not None


class PostgresInventory:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool

    async def save(self, report: InventoryReport) -> None:
        body = encode_report(report).decode()
        async with self._pool.connection() as conn, conn.transaction():
            # An older report arriving late never replaces a newer one.
            await conn.execute(
                "INSERT INTO inventory_reports (cluster_id, observed_at, report)"
                " VALUES (%s, %s, %s::jsonb)"
                " ON CONFLICT (cluster_id) DO UPDATE SET observed_at = excluded.observed_at,"
                " report = excluded.report, received_at = now()"
                " WHERE inventory_reports.observed_at <= excluded.observed_at",
                (report.cluster_id, report.observed_at, body),
            )
            await conn.execute(
                "INSERT INTO capacity_samples (cluster_id, observed_at, gpus) VALUES (%s, %s, %s)"
                " ON CONFLICT (cluster_id, observed_at) DO UPDATE SET gpus = excluded.gpus",
                (report.cluster_id, report.observed_at, total_gpus(report)),
            )
            await conn.execute(  # a report after its decommission: the cluster is back
                "DELETE FROM cluster_decommissions WHERE cluster_id = %s"
                " AND decommissioned_at < %s",
                (report.cluster_id, report.observed_at),
            )

    async def decommission(self, cluster_id: str, *, at: datetime) -> bool:
        async with self._pool.connection() as conn, conn.transaction():
            cursor = await conn.execute(
                "DELETE FROM inventory_reports WHERE cluster_id = %s RETURNING 1", (cluster_id,)
            )
            if await cursor.fetchone() is None:
                return False
            await conn.execute(
                "INSERT INTO cluster_decommissions (cluster_id, decommissioned_at)"
                " VALUES (%s, %s) ON CONFLICT (cluster_id) DO UPDATE"
                " SET decommissioned_at = excluded.decommissioned_at, recorded_at = now()",
                (cluster_id, at),
            )
            return True

    async def latest(self) -> list[InventoryReport]:
        async with self._pool.connection() as conn:
            cursor = await conn.execute("SELECT report::text FROM inventory_reports")
            return [decode_report(row[0]) for row in await cursor.fetchall()]

    async def page(self, page: paging.Page) -> list[InventoryReport]:
        past, order = paging.keyset(["cluster_id"], page)
        query = f"SELECT report::text FROM inventory_reports WHERE {past} ORDER BY {order}"
        async with self._pool.connection() as conn:
            cursor = await conn.execute(query.encode(), paging.params(page))
            return [decode_report(row[0]) for row in await cursor.fetchall()]

    async def get(self, cluster_id: str) -> InventoryReport | None:
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT report::text FROM inventory_reports WHERE cluster_id = %s", (cluster_id,)
            )
            row = await cursor.fetchone()
        return decode_report(row[0]) if row else None

    async def samples(self, cluster_id: str) -> list[tuple[datetime, int]]:
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT observed_at, gpus FROM capacity_samples WHERE cluster_id = %s"
                " ORDER BY observed_at",
                (cluster_id,),
            )
            return [(row[0], row[1]) for row in await cursor.fetchall()]
