"""Tenants and projects in Postgres, read and written inside one transaction per request.

Rules that span rows (a project's limits against its tenant's) are checked by the service between
reads and writes of a ``TenantTransaction``, with the tenant row locked, so two concurrent writes
cannot together break a rule each would have kept. Constraint violations become ``FleetError``s
here, the one module that talks to this part of the database.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Literal, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from fleet_core.control_plane.tenants.wire import Project, ProjectCreate, Tenant, TenantCreate
from fleet_core.shared import paging
from fleet_core.shared.errors import Conflict, InvalidRequest
from fleet_core.shared.storage.rows import utc_row

__all__ = ["TenantStore", "TenantTransaction"]

_TENANT = "id, name, request_limit, token_limit, active, created_at, updated_at, priority"
_PROJECT = "id, tenant_id, name, request_limit, token_limit, active, created_at, updated_at"
_MATCH = (
    "(%(q)s::text IS NULL OR strpos(lower(id), lower(%(q)s)) > 0"
    " OR strpos(lower(name), lower(%(q)s)) > 0)"
)
"""A row whose id or name holds ``q`` (`paging.search`), in any case; no LIKE, so no escaping."""
T = TypeVar("T")

_BILLED = {
    "tenant": "SELECT EXISTS (SELECT 1 FROM ledger WHERE tenant = %(tenant)s)",
    "project": "SELECT EXISTS (SELECT 1 FROM ledger WHERE tenant = %(tenant)s"
    " AND project IN (%(name)s, %(id)s))",
}


class TenantStore:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[TenantTransaction]:
        async with self._pool.connection() as conn, conn.transaction():
            yield TenantTransaction(conn)


class TenantTransaction:
    def __init__(self, conn: AsyncConnection[object]) -> None:
        self._conn = conn

    async def tenant(self, tenant_id: str, *, lock: bool = False) -> Tenant | None:
        query = f"SELECT {_TENANT} FROM tenants WHERE id = %s" + (" FOR UPDATE" if lock else "")
        cursor = self._conn.cursor(row_factory=utc_row(Tenant))
        return await (await cursor.execute(query, (tenant_id,))).fetchone()

    async def tenants(self, page: paging.Page, *, q: str | None = None) -> list[Tenant]:
        """One page of tenants by id (`paging.keyset`: one row past the page), those whose id or
        name holds ``q`` (lower case) when given."""
        past, order = paging.keyset(["id"], page)
        cursor = self._conn.cursor(row_factory=utc_row(Tenant))
        query = f"SELECT {_TENANT} FROM tenants WHERE {_MATCH} AND {past} ORDER BY {order}"
        return await (await cursor.execute(query, {"q": q, **paging.params(page)})).fetchall()

    async def insert_tenant(self, new: TenantCreate) -> Tenant:
        cursor = self._conn.cursor(row_factory=utc_row(Tenant))
        try:
            await cursor.execute(
                "INSERT INTO tenants (id, name, request_limit, token_limit, active, priority)"
                f" VALUES (%s, %s, %s, %s, %s, %s) RETURNING {_TENANT}",
                (new.id, new.name, new.request_limit, new.token_limit, new.active, new.priority),
            )
        except psycopg.errors.UniqueViolation as exc:
            raise Conflict(f"tenant {new.id!r} already exists", code="already_exists") from exc
        return _one(await cursor.fetchone())

    async def update_tenant(self, tenant: Tenant) -> Tenant:
        cursor = self._conn.cursor(row_factory=utc_row(Tenant))
        await cursor.execute(
            "UPDATE tenants SET name = %s, request_limit = %s, token_limit = %s, active = %s,"
            f" priority = %s, updated_at = now() WHERE id = %s RETURNING {_TENANT}",
            (
                tenant.name,
                tenant.request_limit,
                tenant.token_limit,
                tenant.active,
                tenant.priority,
                tenant.id,
            ),
        )
        return _one(await cursor.fetchone())

    async def delete_tenant(self, tenant_id: str) -> None:
        # Projects and their keys go by ON DELETE CASCADE (0002); rules have no foreign key.
        await self._conn.execute(
            "DELETE FROM budget_rules WHERE (scope_kind = 'tenant' AND scope_id = %s)"
            " OR (scope_kind = 'project' AND scope_id IN"
            " (SELECT id FROM projects WHERE tenant_id = %s))",
            (tenant_id, tenant_id),
        )
        await self._conn.execute("DELETE FROM tenants WHERE id = %s", (tenant_id,))

    async def project(self, project_id: str, *, lock: bool = False) -> Project | None:
        query = f"SELECT {_PROJECT} FROM projects WHERE id = %s" + (" FOR UPDATE" if lock else "")
        cursor = self._conn.cursor(row_factory=utc_row(Project))
        return await (await cursor.execute(query, (project_id,))).fetchone()

    async def projects(
        self,
        page: paging.Page | None = None,
        *,
        tenant_id: str | None = None,
        q: str | None = None,
    ) -> list[Project]:
        past, order = paging.keyset(["id"], page)
        cursor = self._conn.cursor(row_factory=utc_row(Project))
        await cursor.execute(
            f"SELECT {_PROJECT} FROM projects WHERE (%(tenant)s::text IS NULL"
            f" OR tenant_id = %(tenant)s) AND {_MATCH} AND {past} ORDER BY {order}",
            {"tenant": tenant_id, "q": q, **paging.params(page)},
        )
        return await cursor.fetchall()

    async def insert_project(self, new: ProjectCreate) -> Project:
        cursor = self._conn.cursor(row_factory=utc_row(Project))
        project_id = f"{new.tenant_id}/{new.name}"
        try:
            await cursor.execute(
                "INSERT INTO projects (id, tenant_id, name, request_limit, token_limit, active)"
                f" VALUES (%s, %s, %s, %s, %s, %s) RETURNING {_PROJECT}",
                (
                    project_id,
                    new.tenant_id,
                    new.name,
                    new.request_limit,
                    new.token_limit,
                    new.active,
                ),
            )
        except psycopg.errors.UniqueViolation as exc:
            raise Conflict(f"project {project_id!r} already exists", code="already_exists") from exc
        except psycopg.errors.ForeignKeyViolation as exc:  # the tenant went in between
            raise InvalidRequest(f"no tenant {new.tenant_id!r}", param="tenantId") from exc
        return _one(await cursor.fetchone())

    async def update_project(self, project: Project) -> Project:
        cursor = self._conn.cursor(row_factory=utc_row(Project))
        await cursor.execute(
            "UPDATE projects SET request_limit = %s, token_limit = %s, active = %s,"
            f" updated_at = now() WHERE id = %s RETURNING {_PROJECT}",
            (project.request_limit, project.token_limit, project.active, project.id),
        )
        return _one(await cursor.fetchone())

    async def delete_project(self, project_id: str) -> None:
        await self._conn.execute(
            "DELETE FROM budget_rules WHERE scope_kind = 'project' AND scope_id = %s",
            (project_id,),
        )
        await self._conn.execute("DELETE FROM projects WHERE id = %s", (project_id,))

    async def billed(self, kind: Literal["tenant", "project"], id_: str) -> bool:
        """Whether the ledger (0003, the ledger feature's) has rows for this tenant or project.

        Checked only when the table exists, so this feature works before and without it. The
        ledger names a project by ``tenant`` plus the bare ``project`` name (the key's segments);
        the full ``tenant/name`` is matched too, in case a writer records that instead.
        """
        cursor = await self._conn.execute("SELECT to_regclass('ledger') IS NOT NULL")
        exists = await cursor.fetchone()
        if exists is None or not exists[0]:  # type: ignore[index]
            return False
        tenant, _, name = id_.partition("/")
        params = {"tenant": tenant, "name": name, "id": id_}
        row = await (await self._conn.execute(_BILLED[kind], params)).fetchone()
        return bool(row and row[0])  # type: ignore[index]


def _one(row: T | None) -> T:
    assert row is not None, "INSERT/UPDATE … RETURNING returns the row"
    return row
