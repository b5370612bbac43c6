"""Where reports are kept: the newest per cluster, and each report's cards as a time series.

Postgres when the control plane has a database; process memory otherwise, because inventory is one
of the things the control plane serves without one (the series is then lost on restart, and the
cost pool, which needs it, requires the database anyway).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

import msgspec
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from fleet_contract import InventoryReport, decode_report, encode_report
from fleet_core.control_plane.inventory import cards
from fleet_core.control_plane.inventory.bindings import Binding
from fleet_core.control_plane.inventory.service import total_gpus
from fleet_core.shared import paging

__all__ = ["InventoryStore", "MemoryInventory", "PostgresInventory", "TimeCheck"]

TimeCheck = Callable[[datetime | None, datetime | None], None]
"""Called inside the save with the cluster's newest stored report time and the end of the last
closed cost period (each None when there is none); raising refuses the report, nothing saved."""


class InventoryStore(Protocol):
    async def save(self, report: InventoryReport, *, check: TimeCheck) -> None: ...

    async def binding(self, cluster_id: str) -> Binding | None: ...

    async def bindings(self) -> dict[str, Binding]: ...

    async def bind(self, binding: Binding) -> Binding: ...

    async def unbind(self, cluster_id: str) -> bool: ...

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
        self._bindings: dict[str, Binding] = {}

    async def save(self, report: InventoryReport, *, check: TimeCheck) -> None:
        current = self._latest.get(report.cluster_id)
        check(current.observed_at if current else None, None)  # no database: no closed periods
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

    async def binding(self, cluster_id: str) -> Binding | None:
        return self._bindings.get(cluster_id)

    async def bindings(self) -> dict[str, Binding]:
        return dict(self._bindings)

    async def bind(self, binding: Binding) -> Binding:
        self._bindings[binding.cluster_id] = binding
        return binding

    async def unbind(self, cluster_id: str) -> bool:
        return self._bindings.pop(cluster_id, None) is not None


class PostgresInventory:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool

    async def save(self, report: InventoryReport, *, check: TimeCheck) -> None:
        body = encode_report(report).decode()
        async with self._pool.connection() as conn, conn.transaction():
            await self._check_time(conn, report.cluster_id, check)
            # An older report arriving late never replaces a newer one.
            await conn.execute(
                "INSERT INTO inventory_reports (cluster_id, observed_at, report)"
                " VALUES (%s, %s, %s::jsonb)"
                " ON CONFLICT (cluster_id) DO UPDATE SET observed_at = excluded.observed_at,"
                " report = excluded.report, received_at = now()"
                " WHERE inventory_reports.observed_at <= excluded.observed_at",
                (report.cluster_id, report.observed_at, body),
            )
            slices = cards.slice_cards(report)  # exact: numerator and denominator (ADR 0026)
            await conn.execute(
                "INSERT INTO capacity_samples (cluster_id, observed_at, gpus, slice_num, slice_den)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (cluster_id, observed_at) DO UPDATE"
                " SET gpus = excluded.gpus, slice_num = excluded.slice_num,"
                " slice_den = excluded.slice_den",
                (
                    report.cluster_id,
                    report.observed_at,
                    total_gpus(report),
                    slices.numerator,
                    slices.denominator,
                ),
            )
            await conn.execute(  # a report after its decommission: the cluster is back
                "DELETE FROM cluster_decommissions WHERE cluster_id = %s"
                " AND decommissioned_at < %s",
                (report.cluster_id, report.observed_at),
            )

    @staticmethod
    async def _check_time(conn: AsyncConnection[Any], cluster_id: str, check: TimeCheck) -> None:
        """The bounds' inputs, read under locks so the check holds when the report commits:
        one report per cluster at a time, and none while a month is being closed (SHARE waits
        for a close's SHARE ROW EXCLUSIVE, and a close for the reports in flight)."""
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext('inventory:' || %s))", (cluster_id,)
        )
        await conn.execute("LOCK TABLE cost_periods IN SHARE MODE")
        cursor = await conn.execute(
            "SELECT (SELECT observed_at FROM inventory_reports WHERE cluster_id = %s),"
            " (SELECT to_date(max(period), 'YYYY-MM')::timestamp AT TIME ZONE 'UTC'"
            " + interval '1 month' FROM cost_periods)",
            (cluster_id,),
        )
        newest, closed_until = await cursor.fetchone() or (None, None)
        check(newest, closed_until)

    async def binding(self, cluster_id: str) -> Binding | None:
        found = await self._bindings("WHERE cluster_id = %s", (cluster_id,))
        return found.get(cluster_id)

    async def bindings(self) -> dict[str, Binding]:
        return await self._bindings("", ())

    async def _bindings(self, where: str, params: tuple[str, ...]) -> dict[str, Binding]:
        query = (
            "SELECT cluster_id, served_models, endpoints, updated_at, updated_by"
            f" FROM cluster_bindings {where}"
        )
        async with self._pool.connection() as conn:
            cursor = await conn.execute(query.encode(), params)
            rows = await cursor.fetchall()
        return {
            r[0]: Binding(
                cluster_id=r[0],
                served_models=r[1],
                endpoints=r[2],
                updated_at=r[3],
                updated_by=r[4],
            )
            for r in rows
        }

    async def bind(self, binding: Binding) -> Binding:
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                "INSERT INTO cluster_bindings (cluster_id, served_models, endpoints, updated_by)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (cluster_id) DO UPDATE SET"
                " served_models = excluded.served_models, endpoints = excluded.endpoints,"
                " updated_by = excluded.updated_by, updated_at = now() RETURNING updated_at",
                (binding.cluster_id, binding.served_models, binding.endpoints, binding.updated_by),
            )
            row = await cursor.fetchone()
        assert row is not None
        return msgspec.structs.replace(binding, updated_at=row[0])

    async def unbind(self, cluster_id: str) -> bool:
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                "DELETE FROM cluster_bindings WHERE cluster_id = %s RETURNING 1", (cluster_id,)
            )
            return await cursor.fetchone() is not None

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
