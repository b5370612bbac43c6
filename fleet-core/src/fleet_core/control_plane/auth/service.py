"""Who is calling, and the credentials an admin issues and revokes.

A bearer token is looked up by its SHA-256, like an API key: ``fsc_…`` service credentials in
``service_credentials``, ``fk_…`` tenant keys in ``api_keys``. Nothing is cached, so a revocation
holds from the next request. The bootstrap admin credential comes from FLEET_ADMIN_TOKEN at start
(ADR 0009); a control plane with no active admin credential refuses to start.
"""

from __future__ import annotations

import secrets

import msgspec
from psycopg_pool import AsyncConnectionPool

from fleet_core.control_plane.auth.store import (
    AuthStore,
    LastAdmin,
    MemoryAuthStore,
    NewCredential,
    NewEvent,
    PostgresAuthStore,
)
from fleet_core.control_plane.auth.wire import (
    AuditEvent,
    Credential,
    CredentialCreate,
    IssuedCredential,
    Principal,
)
from fleet_core.shared import credentials, paging
from fleet_core.shared.errors import (
    AuthenticationError,
    ConfigError,
    Conflict,
    InvalidRequest,
    NotFound,
)

__all__ = ["AuthService", "NewEvent"]


class AuthService:
    def __init__(self, store: AuthStore) -> None:
        self.store = store

    @classmethod
    def on_pool(cls, pool: AsyncConnectionPool | None) -> AuthService:
        return cls(MemoryAuthStore() if pool is None else PostgresAuthStore(pool))

    async def start(self, admin_token: str | None) -> None:
        """Install FLEET_ADMIN_TOKEN's credential; refuse to run with no admin at all."""
        if admin_token is not None:
            digest = credentials.digest(admin_token)
            await self.store.bootstrap(digest, admin_token[: credentials.DISPLAY_PREFIX_LENGTH])
        if not await self.store.has_active_admin():
            raise ConfigError(
                "no admin credential: set FLEET_ADMIN_TOKEN or FLEET_ADMIN_TOKEN_FILE to a random "
                "token (e.g. `openssl rand -hex 32`); `make dev` makes one under .dev/"
            )

    async def authenticate(self, authorization: str | None) -> Principal:
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthenticationError(
                "this API needs a credential: send Authorization: Bearer <token>"
            )
        digest = credentials.digest(token)
        found = (
            await self.store.tenant_key(digest)
            if token.startswith(credentials.API_KEY_PREFIX)
            else None
        )
        if found is None:
            credential = await self.store.active(digest)
            if credential is not None:
                found = Principal(
                    id=credential.id, role=credential.role, cluster_id=credential.cluster_id
                )
        if found is None:
            raise AuthenticationError("the credential is unknown or revoked")
        return found

    async def issue(self, new: CredentialCreate, *, by: Principal) -> IssuedCredential:
        if (new.role == "operator") != (new.cluster_id is not None):
            raise InvalidRequest(
                "an operator credential needs clusterId (the one cluster it may report); "
                "no other role takes one",
                param="clusterId",
            )
        secret = credentials.SERVICE_CREDENTIAL_PREFIX + secrets.token_urlsafe(32)
        stored = await self.store.insert(
            NewCredential(
                id="cred_" + secrets.token_hex(6),
                role=new.role,
                cluster_id=new.cluster_id,
                label=new.label,
                prefix=secret[: credentials.DISPLAY_PREFIX_LENGTH],
                secret_hash=credentials.digest(secret),
                created_by=by.id,
            )
        )
        return IssuedCredential(**msgspec.structs.asdict(stored), secret=secret)

    async def credentials(self, page: paging.Page) -> paging.Listing[Credential]:
        rows = await self.store.credentials(page)
        return paging.listing(rows, page, lambda c: (c.created_at, c.id))

    async def revoke(self, credential_id: str) -> Credential:
        """409 for the last active admin credential: issue another admin credential first."""
        try:
            revoked = await self.store.revoke(credential_id) if len(credential_id) <= 64 else None
        except LastAdmin as exc:
            raise Conflict(
                f"{credential_id!r} is the last active admin credential: issue another admin "
                "credential (POST /api/v1/credentials) before revoking this one",
                code="last_admin",
            ) from exc
        if revoked is None:
            raise NotFound(f"no credential {credential_id[:64]!r}")
        return revoked

    async def record(self, event: NewEvent) -> None:
        await self.store.record(event)

    async def events(self, *, limit: int, before: int | None) -> list[AuditEvent]:
        return await self.store.events(limit=limit, before=before)
