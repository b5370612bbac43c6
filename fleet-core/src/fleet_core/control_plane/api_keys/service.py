"""Issuing and revoking API keys.

The secret is ``fk_`` + 32 random bytes (url-safe base64) and exists only in the response that
creates it: the database keeps its SHA-256 (what the gateway looks a presented key up by) and an
8-character prefix for people to recognise it. A key is issued only to an existing, active
project; revoking keeps the row, with ``revoked_at``, so past usage stays attributable.
"""

from __future__ import annotations

import re
import secrets

import msgspec
from psycopg_pool import AsyncConnectionPool

from fleet_core.control_plane.api_keys.store import KeyStore
from fleet_core.control_plane.api_keys.wire import ApiKey, IssuedKey, KeyCreate
from fleet_core.control_plane.tenants import service as tenants
from fleet_core.shared import paging
from fleet_core.shared.credentials import API_KEY_PREFIX, DISPLAY_PREFIX_LENGTH, digest
from fleet_core.shared.errors import InvalidRequest, NotFound

__all__ = ["KeyService", "new_secret"]

_KEY_ID = re.compile(r"key_[0-9a-f]{12}")


def new_secret() -> str:
    return API_KEY_PREFIX + secrets.token_urlsafe(32)


class KeyService:
    def __init__(self, store: KeyStore, *, tenants: tenants.TenantService) -> None:
        self.store = store
        self.tenants = tenants

    @classmethod
    def on_pool(cls, pool: AsyncConnectionPool) -> KeyService:
        return cls(KeyStore(pool), tenants=tenants.TenantService.on_pool(pool))

    async def issue(self, new: KeyCreate) -> IssuedKey:
        await self._require_active_project(new.project_id)
        secret = new_secret()
        key_id = "key_" + secrets.token_hex(6)
        stored = await self.store.insert(
            key_id,
            project_id=new.project_id,
            label=new.label,
            prefix=secret[:DISPLAY_PREFIX_LENGTH],
            secret_hash=digest(secret),
        )
        return IssuedKey(**msgspec.structs.asdict(stored), secret=secret)

    async def list(
        self, page: paging.Page, *, project_id: str | None = None, tenant_id: str | None = None
    ) -> paging.Listing[ApiKey]:
        """One page of keys' metadata, of one project or one tenant's projects if given."""
        if project_id is not None and not tenants.valid_project_id(project_id):
            return paging.Listing(object="list", data=[])
        rows = await self.store.list(page, project_id=project_id, tenant_id=tenant_id)
        return paging.listing(rows, page, lambda k: (k.created_at, k.id))

    async def revoke(self, key_id: str) -> ApiKey:
        revoked = await self.store.revoke(key_id) if _KEY_ID.fullmatch(key_id) else None
        if revoked is None:
            raise NotFound(f"no key {key_id!r}")
        return revoked

    async def _require_active_project(self, project_id: str) -> None:
        try:
            project = await self.tenants.get_project(project_id)
        except NotFound as exc:
            raise InvalidRequest(
                f"no project {project_id!r}", param="projectId", code="unknown_project"
            ) from exc
        if not project.active:
            raise InvalidRequest(
                f"project {project_id!r} is inactive; PATCH it active first",
                param="projectId",
                code="project_inactive",
            )
