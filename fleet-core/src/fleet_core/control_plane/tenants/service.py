"""Tenant and project rules: ids, limits that nest, and when a deletion is allowed.

A project's limits may not exceed its tenant's (a project cannot be promised more than the tenant
it draws from), so both a project above its tenant and a tenant lowered below one of its projects
are refused, naming the field. Deletion is refused once anything was billed to the tenant or
project, because the ledger must keep pointing at something: deactivate instead.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Literal

import msgspec
from msgspec import UNSET
from psycopg_pool import AsyncConnectionPool

from fleet_core.control_plane.tenants.store import TenantStore, TenantTransaction
from fleet_core.control_plane.tenants.wire import (
    Deleted,
    Project,
    ProjectCreate,
    ProjectPatch,
    Tenant,
    TenantCreate,
    TenantPatch,
)
from fleet_core.shared import paging
from fleet_core.shared.errors import Conflict, InvalidRequest, NotFound

__all__ = [
    "Deleted",
    "Project",
    "ProjectCreate",
    "ProjectPatch",
    "Tenant",
    "TenantCreate",
    "TenantPatch",
    "TenantService",
    "check_covers",
    "check_fits",
    "valid_id",
    "valid_project_id",
]

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def valid_id(value: str) -> bool:
    """A tenant id or project name as the schema allows it (``fullmatch``: no trailing newline)."""
    return _ID.fullmatch(value) is not None


def valid_project_id(value: str) -> bool:
    tenant, slash, name = value.partition("/")
    return bool(slash) and valid_id(tenant) and valid_id(name)


def check_fits(request_limit: int | None, token_limit: int | None, tenant: Tenant) -> None:
    """A project's limits against its tenant's; ``None`` means no limit of its own."""
    for param, value, cap in (
        ("requestLimit", request_limit, tenant.request_limit),
        ("tokenLimit", token_limit, tenant.token_limit),
    ):
        if value is not None and cap is not None and value > cap:
            raise InvalidRequest(
                f"{param} {value} is above tenant {tenant.id!r}'s {param} {cap}",
                param=param,
                code="limit_above_tenant",
            )


def check_covers(tenant: Tenant, projects: Iterable[Project]) -> None:
    """A tenant's (new) limits against every existing project's."""
    for project in projects:
        for param, value, cap in (
            ("requestLimit", project.request_limit, tenant.request_limit),
            ("tokenLimit", project.token_limit, tenant.token_limit),
        ):
            if value is not None and cap is not None and value > cap:
                raise InvalidRequest(
                    f"{param} {cap} is below project {project.id!r}'s {param} {value}; "
                    "lower the project's first",
                    param=param,
                    code="limit_below_project",
                )


def patched(current: Any, patch: msgspec.Struct) -> Any:
    """``current`` with the fields ``patch`` sets (``null`` clears a limit; absent keeps it)."""
    changes = {f: v for f in patch.__struct_fields__ if (v := getattr(patch, f)) is not UNSET}
    return msgspec.structs.replace(current, **changes)


class TenantService:
    def __init__(self, store: TenantStore) -> None:
        self.store = store

    @classmethod
    def on_pool(cls, pool: AsyncConnectionPool) -> TenantService:
        """For other features (keys, budgets), which must not build this feature's store."""
        return cls(TenantStore(pool))

    async def create_tenant(self, new: TenantCreate) -> Tenant:
        _require_id(new.id, "id")
        async with self.store.transaction() as tx:
            return await tx.insert_tenant(new)

    async def list_tenants(
        self, page: paging.Page, *, q: str | None = None
    ) -> paging.Listing[Tenant]:
        async with self.store.transaction() as tx:
            return paging.listing(await tx.tenants(page, q=q), page, lambda t: (t.id,))

    async def get_tenant(self, tenant_id: str) -> Tenant:
        async with self.store.transaction() as tx:
            return await _tenant(tx, tenant_id, lock=False)

    async def patch_tenant(self, tenant_id: str, patch: TenantPatch) -> Tenant:
        async with self.store.transaction() as tx:
            updated: Tenant = patched(await _tenant(tx, tenant_id, lock=True), patch)
            check_covers(updated, await tx.projects(tenant_id=tenant_id))
            return await tx.update_tenant(updated)

    async def delete_tenant(self, tenant_id: str) -> Deleted:
        async with self.store.transaction() as tx:
            await _tenant(tx, tenant_id, lock=True)
            await _refuse_if_billed(tx, "tenant", tenant_id)
            await tx.delete_tenant(tenant_id)
        return Deleted(id=tenant_id, object="tenant")

    async def create_project(self, new: ProjectCreate) -> Project:
        _require_id(new.tenant_id, "tenantId")
        _require_id(new.name, "name")
        async with self.store.transaction() as tx:
            tenant = await tx.tenant(new.tenant_id, lock=True)
            if tenant is None:
                raise InvalidRequest(
                    f"no tenant {new.tenant_id!r}", param="tenantId", code="unknown_tenant"
                )
            check_fits(new.request_limit, new.token_limit, tenant)
            return await tx.insert_project(new)

    async def list_projects(
        self, page: paging.Page, *, tenant_id: str | None = None, q: str | None = None
    ) -> paging.Listing[Project]:
        if tenant_id is not None and not valid_id(tenant_id):
            return paging.Listing(object="list", data=[])  # no tenant can have that id
        async with self.store.transaction() as tx:
            rows = await tx.projects(page, tenant_id=tenant_id, q=q)
        return paging.listing(rows, page, lambda p: (p.id,))

    async def get_project(self, project_id: str) -> Project:
        async with self.store.transaction() as tx:
            return await _project(tx, project_id, lock=False)

    async def patch_project(self, project_id: str, patch: ProjectPatch) -> Project:
        async with self.store.transaction() as tx:
            current = await _project(tx, project_id, lock=True)
            tenant = await _tenant(tx, current.tenant_id, lock=True)
            updated: Project = patched(current, patch)
            check_fits(updated.request_limit, updated.token_limit, tenant)
            return await tx.update_project(updated)

    async def delete_project(self, project_id: str) -> Deleted:
        async with self.store.transaction() as tx:
            await _project(tx, project_id, lock=True)
            await _refuse_if_billed(tx, "project", project_id)
            await tx.delete_project(project_id)
        return Deleted(id=project_id, object="project")


def _require_id(value: str, param: str) -> None:
    if not valid_id(value):
        raise InvalidRequest(
            f"{param} must be 1-64 of A-Z a-z 0-9 . _ - starting with a letter or digit",
            param=param,
        )


async def _tenant(tx: TenantTransaction, tenant_id: str, *, lock: bool) -> Tenant:
    tenant = await tx.tenant(tenant_id, lock=lock) if valid_id(tenant_id) else None
    if tenant is None:
        raise NotFound(f"no tenant {tenant_id!r}")
    return tenant


async def _project(tx: TenantTransaction, project_id: str, *, lock: bool) -> Project:
    found = valid_project_id(project_id)
    project = await tx.project(project_id, lock=lock) if found else None
    if project is None:
        raise NotFound(f"no project {project_id!r}")
    return project


async def _refuse_if_billed(
    tx: TenantTransaction, kind: Literal["tenant", "project"], id_: str
) -> None:
    if await tx.billed(kind, id_):
        raise Conflict(
            f"{kind} {id_!r} has billed usage in the ledger and cannot be deleted; "
            'deactivate it instead with PATCH {"active": false}',
            code="has_usage",
        )
