"""Where credentials and audit events are kept: Postgres, or process memory without a database.

Only digests are stored. A tenant's API key is looked up in the keys' own table (``api_keys``),
read-only: the keys feature owns it; a key counts only while it, its project and its tenant are
active.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import msgspec
from psycopg_pool import AsyncConnectionPool

from fleet_core.control_plane.auth.wire import AuditEvent, Credential, Principal, ServiceRole
from fleet_core.shared import paging
from fleet_core.shared.storage.rows import utc_row

__all__ = [
    "BOOTSTRAP_ID",
    "AuthStore",
    "LastAdmin",
    "MemoryAuthStore",
    "NewCredential",
    "NewEvent",
    "PostgresAuthStore",
]

BOOTSTRAP_ID = "cred_bootstrap_admin"
"""The id of the admin credential FLEET_ADMIN_TOKEN provides."""


class LastAdmin(Exception):
    """Revoking this credential would leave no active admin credential: nobody could issue or
    revoke credentials again, short of a restart with a new FLEET_ADMIN_TOKEN."""


_CREDENTIAL = "id, role, cluster_id, label, prefix, created_by, created_at, revoked_at"
_EVENT = "id, at, actor, actor_role, action, method, target, status, request_id, detail"
_DETAIL = msgspec.json.Decoder(dict[str, Any])


@dataclass(frozen=True)
class NewCredential:
    id: str
    role: ServiceRole
    cluster_id: str | None
    label: str
    prefix: str
    secret_hash: bytes
    created_by: str


@dataclass(frozen=True)
class NewEvent:
    actor: str
    actor_role: str
    action: str
    method: str
    target: str
    status: int
    request_id: str | None
    detail: Any = None
    """What the change set (and replaced), as the handler gave it; encodable as JSON."""


class AuthStore(Protocol):
    async def insert(self, new: NewCredential) -> Credential: ...

    async def credentials(self, page: paging.Page) -> list[Credential]: ...

    async def revoke(self, credential_id: str) -> Credential | None: ...

    async def active(self, secret_hash: bytes) -> Credential | None: ...

    async def bootstrap(self, secret_hash: bytes, prefix: str) -> None: ...

    async def has_active_admin(self) -> bool: ...

    async def tenant_key(self, secret_hash: bytes) -> Principal | None: ...

    async def record(self, event: NewEvent) -> None: ...

    async def events(self, *, limit: int, before: int | None) -> list[AuditEvent]: ...


class MemoryAuthStore:
    """Without a database: lost on restart (FLEET_ADMIN_TOKEN is read again at every start)."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[Credential, bytes]] = {}
        self._events: list[AuditEvent] = []
        self._ids = itertools.count(1)

    async def insert(self, new: NewCredential) -> Credential:
        row = Credential(
            id=new.id,
            role=new.role,
            cluster_id=new.cluster_id,
            label=new.label,
            prefix=new.prefix,
            created_by=new.created_by,
            created_at=datetime.now(UTC),
            revoked_at=None,
        )
        self._rows[new.id] = (row, new.secret_hash)
        return row

    async def credentials(self, page: paging.Page) -> list[Credential]:
        rows = (row for row, _ in self._rows.values())
        return paging.window(rows, page, lambda c: (c.created_at, c.id))

    async def revoke(self, credential_id: str) -> Credential | None:
        if credential_id not in self._rows:
            return None
        row, digest = self._rows[credential_id]
        admins = [
            r.id for r, _ in self._rows.values() if r.role == "admin" and r.revoked_at is None
        ]
        if admins == [credential_id]:
            raise LastAdmin(credential_id)
        if row.revoked_at is None:
            row = msgspec.structs.replace(row, revoked_at=datetime.now(UTC))
            self._rows[credential_id] = (row, digest)
        return row

    async def active(self, secret_hash: bytes) -> Credential | None:
        for row, digest in self._rows.values():
            if digest == secret_hash and row.revoked_at is None:
                return row
        return None

    async def bootstrap(self, secret_hash: bytes, prefix: str) -> None:
        current = self._rows.get(BOOTSTRAP_ID)
        if current is None or current[1] != secret_hash:
            new = NewCredential(
                BOOTSTRAP_ID, "admin", None, "FLEET_ADMIN_TOKEN", prefix, secret_hash, "bootstrap"
            )
            await self.insert(new)

    async def has_active_admin(self) -> bool:
        return any(r.role == "admin" and r.revoked_at is None for r, _ in self._rows.values())

    async def tenant_key(self, secret_hash: bytes) -> Principal | None:
        return None  # API keys live in the database only

    async def record(self, event: NewEvent) -> None:
        detail = None if event.detail is None else _DETAIL.decode(msgspec.json.encode(event.detail))
        fields = {
            **event.__dict__,
            "detail": detail,
            "id": next(self._ids),
            "at": datetime.now(UTC),
        }
        self._events.append(AuditEvent(**fields))

    async def events(self, *, limit: int, before: int | None) -> list[AuditEvent]:
        older = [e for e in self._events if before is None or e.id < before]
        return older[::-1][:limit]


class PostgresAuthStore:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool

    async def insert(self, new: NewCredential) -> Credential:
        async with self._pool.connection() as conn:
            cursor = conn.cursor(row_factory=utc_row(Credential))
            await cursor.execute(
                "INSERT INTO service_credentials (id, role, cluster_id, label, prefix,"
                " secret_hash, created_by) VALUES (%s, %s, %s, %s, %s, %s, %s)"
                f" RETURNING {_CREDENTIAL}",
                (new.id, new.role, new.cluster_id, new.label, new.prefix, new.secret_hash,
                 new.created_by),
            )  # fmt: skip
            row = await cursor.fetchone()
        assert row is not None, "INSERT … RETURNING returns the row"
        return row

    async def credentials(self, page: paging.Page) -> list[Credential]:
        past, order = paging.keyset(["created_at", "id"], page)
        async with self._pool.connection() as conn:
            cursor = conn.cursor(row_factory=utc_row(Credential))
            await cursor.execute(
                f"SELECT {_CREDENTIAL} FROM service_credentials WHERE {past} ORDER BY {order}",
                paging.params(page),
            )
            return await cursor.fetchall()

    async def revoke(self, credential_id: str) -> Credential | None:
        """Revoked now, or when it first was: revoking twice keeps the first time. LastAdmin
        for the only active admin credential: the active admins' rows are locked first, so two
        admins revoking each other at once cannot both succeed (the second sees the first's
        revocation once it commits, and is refused)."""
        async with self._pool.connection() as conn, conn.transaction():
            cursor = conn.cursor(row_factory=utc_row(Credential))
            admins = await conn.execute(
                "SELECT id FROM service_credentials WHERE role = 'admin' AND revoked_at IS NULL"
                " ORDER BY id FOR UPDATE"
            )
            if [row[0] for row in await admins.fetchall()] == [credential_id]:
                raise LastAdmin(credential_id)
            await cursor.execute(
                "UPDATE service_credentials SET revoked_at = coalesce(revoked_at, now())"
                f" WHERE id = %s RETURNING {_CREDENTIAL}",
                (credential_id,),
            )
            return await cursor.fetchone()

    async def active(self, secret_hash: bytes) -> Credential | None:
        async with self._pool.connection() as conn:
            cursor = conn.cursor(row_factory=utc_row(Credential))
            await cursor.execute(
                f"SELECT {_CREDENTIAL} FROM service_credentials"
                " WHERE secret_hash = %s AND revoked_at IS NULL",
                (secret_hash,),
            )
            return await cursor.fetchone()

    async def bootstrap(self, secret_hash: bytes, prefix: str) -> None:
        """A new FLEET_ADMIN_TOKEN replaces (and re-activates) the bootstrap credential; the
        same one again leaves it as it is, so revoking it through the API sticks."""
        async with self._pool.connection() as conn:
            await conn.execute(
                "INSERT INTO service_credentials (id, role, label, prefix, secret_hash,"
                " created_by) VALUES (%s, 'admin', 'FLEET_ADMIN_TOKEN', %s, %s, 'bootstrap')"
                " ON CONFLICT (id) DO UPDATE SET secret_hash = excluded.secret_hash,"
                " prefix = excluded.prefix, created_at = now(), revoked_at = NULL"
                " WHERE service_credentials.secret_hash <> excluded.secret_hash",
                (BOOTSTRAP_ID, prefix, secret_hash),
            )

    async def has_active_admin(self) -> bool:
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT 1 FROM service_credentials WHERE role = 'admin' AND revoked_at IS NULL"
                " LIMIT 1"
            )
            return await cursor.fetchone() is not None

    async def tenant_key(self, secret_hash: bytes) -> Principal | None:
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT k.id, p.tenant_id, k.project_id FROM api_keys k"
                " JOIN projects p ON p.id = k.project_id JOIN tenants t ON t.id = p.tenant_id"
                " WHERE k.secret_hash = %s AND k.revoked_at IS NULL AND p.active AND t.active",
                (secret_hash,),
            )
            row = await cursor.fetchone()
        if row is None:
            return None
        return Principal(id=row[0], role="tenant", tenant_id=row[1], project_id=row[2])

    async def record(self, event: NewEvent) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(
                "INSERT INTO audit_events (actor, actor_role, action, method, target, status,"
                " request_id, detail) VALUES (%s, %s, %s, %s, %s, %s, %s, %s::jsonb)",
                (event.actor, event.actor_role, event.action, event.method, event.target,
                 event.status, event.request_id,
                 None if event.detail is None else msgspec.json.encode(event.detail).decode()),
            )  # fmt: skip

    async def events(self, *, limit: int, before: int | None) -> list[AuditEvent]:
        async with self._pool.connection() as conn:
            cursor = conn.cursor(row_factory=utc_row(AuditEvent))
            await cursor.execute(
                f"SELECT {_EVENT} FROM audit_events WHERE %(before)s::bigint IS NULL"
                " OR id < %(before)s ORDER BY id DESC LIMIT %(limit)s",
                {"before": before, "limit": limit},
            )
            return await cursor.fetchall()
