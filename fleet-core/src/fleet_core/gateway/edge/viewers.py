"""Who may read the gateway's fleet-wide operations data: /metrics (every tenant's series),
the upstream detail of /health and /readyz (engine URLs), and every tenant's recent requests.

A tenant's API key never may (docs/security.md). The metrics credential is FLEET_METRICS_TOKEN
(or FLEET_METRICS_TOKEN_FILE); in database mode also any control-plane service credential with
the ``metrics`` or ``admin`` role, looked up in the control plane's ``service_credentials`` table
the gateway already shares. A gateway with no credential of any kind configured (no keys, no
metrics token, no database: the local ``--demo``) has nothing to protect it with, and shows all.
"""

from __future__ import annotations

import hmac
from typing import Literal

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from fleet_core.gateway.admission.key_ring import Principal
from fleet_core.gateway.admission.service import Admission
from fleet_core.shared import credentials
from fleet_core.shared.errors import AuthenticationError, FleetError, PermissionDenied, Unavailable

__all__ = ["VIEWER_ROLES", "Viewers"]

VIEWER_ROLES = frozenset({"metrics", "admin"})
_ROLE = "SELECT role FROM service_credentials WHERE secret_hash = %s AND revoked_at IS NULL"


class Viewers:
    def __init__(
        self, admission: Admission, *, metrics_token: str | None, pool: AsyncConnectionPool | None
    ) -> None:
        self._admission = admission
        self._token = metrics_token
        self._pool = pool

    @property
    def open(self) -> bool:
        """Nothing configured to tell anyone apart: everyone sees everything."""
        return not self._admission.auth_required and not self._token and self._pool is None

    async def sees_all(self, authorization: str | None) -> bool:
        """True for the metrics credential (or an admin's), or on an open gateway."""
        return await self._verdict(authorization) == "all"

    async def reader(self, authorization: str | None) -> Principal | None:
        """Whose recent requests a caller reads: None for everyone's (the metrics credential, an
        admin's, an open gateway), else its API key's principal (its own tenant's). Another
        control-plane credential (finance, operator …) is known, so 403, not 401."""
        verdict = await self._verdict(authorization)
        if verdict == "all":
            return None
        try:
            return self._admission.authenticate(authorization)
        except AuthenticationError:
            if verdict != "denied":
                raise
        raise PermissionDenied(
            "only the metrics credential (or an admin's) or an API key reads recent requests",
            code="insufficient_role",
        )

    async def require(self, authorization: str | None) -> None:
        """401 without a known credential, 403 with one that may not see fleet-wide data."""
        verdict = await self._verdict(authorization)
        if verdict == "unknown":
            raise AuthenticationError("this needs the metrics credential: Authorization: Bearer …")
        if verdict == "denied":
            raise PermissionDenied(
                "only the metrics credential (or an admin's) reads fleet-wide data; an API key "
                "reads its own tenant's through GET /api/v1/requests",
                code="insufficient_role",
            )

    async def _verdict(self, authorization: str | None) -> Literal["all", "denied", "unknown"]:
        if self.open:
            return "all"
        token = (authorization or "").partition(" ")[2].strip()
        if not token:
            return "unknown"
        if self._token and hmac.compare_digest(token.encode(), self._token.encode()):
            return "all"
        role = await self._role(token)
        if role is not None:
            return "all" if role in VIEWER_ROLES else "denied"
        try:
            self._admission.authenticate(authorization)
        except FleetError:
            return "unknown"
        return "denied"  # a tenant's key

    async def _role(self, token: str) -> str | None:
        """The role of an active control-plane credential (database mode), or None."""
        if self._pool is None:
            return None
        try:
            async with self._pool.connection() as conn:
                cursor = await conn.execute(_ROLE, (credentials.digest(token),))
                row = await cursor.fetchone()
        except (psycopg.Error, PoolTimeout, OSError) as exc:
            raise Unavailable("cannot check the credential: the database is unavailable") from exc
        return None if row is None else str(row[0])
