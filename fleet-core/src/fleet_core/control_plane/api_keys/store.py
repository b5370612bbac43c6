"""API key rows: the digest and display prefix, never the secret."""

from __future__ import annotations

import psycopg
from psycopg_pool import AsyncConnectionPool

from fleet_core.control_plane.api_keys.wire import ApiKey
from fleet_core.shared import paging
from fleet_core.shared.errors import InvalidRequest
from fleet_core.shared.storage.rows import utc_row

__all__ = ["KeyStore"]

_KEY = "id, project_id, label, prefix, created_at, last_used_at, revoked_at"


class KeyStore:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool

    async def insert(
        self, key_id: str, *, project_id: str, label: str, prefix: str, secret_hash: bytes
    ) -> ApiKey:
        async with self._pool.connection() as conn:
            cursor = conn.cursor(row_factory=utc_row(ApiKey))
            try:
                await cursor.execute(
                    "INSERT INTO api_keys (id, project_id, label, prefix, secret_hash)"
                    f" VALUES (%s, %s, %s, %s, %s) RETURNING {_KEY}",
                    (key_id, project_id, label, prefix, secret_hash),
                )
            except psycopg.errors.ForeignKeyViolation as exc:  # deleted since it was checked
                raise InvalidRequest(f"no project {project_id!r}", param="projectId") from exc
            row = await cursor.fetchone()
        assert row is not None, "INSERT … RETURNING returns the row"
        return row

    async def list(
        self, page: paging.Page, *, project_id: str | None = None, tenant_id: str | None = None
    ) -> list[ApiKey]:
        past, order = paging.keyset(["created_at", "id"], page)
        async with self._pool.connection() as conn:
            cursor = conn.cursor(row_factory=utc_row(ApiKey))
            await cursor.execute(
                f"SELECT {_KEY} FROM api_keys WHERE (%(project)s::text IS NULL"
                " OR project_id = %(project)s) AND (%(tenant)s::text IS NULL"
                f" OR starts_with(project_id, %(tenant)s || '/')) AND {past} ORDER BY {order}",
                {"project": project_id, "tenant": tenant_id, **paging.params(page)},
            )
            return await cursor.fetchall()

    async def revoke(self, key_id: str) -> ApiKey | None:
        """Revoked now, or when it first was: revoking twice keeps the first time."""
        async with self._pool.connection() as conn:
            cursor = conn.cursor(row_factory=utc_row(ApiKey))
            await cursor.execute(
                "UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())"
                f" WHERE id = %s RETURNING {_KEY}",
                (key_id,),
            )
            return await cursor.fetchone()
