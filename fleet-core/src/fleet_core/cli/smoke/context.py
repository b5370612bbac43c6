"""What every area is handed: where the system is, the credentials, and the throwaway tenants.

Tenants are made on first use under the run's own prefix (``smoke-<time>-<random>``), so a second
run never meets the first one's buckets or budgets, and every one is deactivated when the run ends,
failed or not. A key is only used once the gateway serves it (the catalog reaches a database-mode
gateway within a second or two).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from fleet_core.cli.smoke.http import Http, Reply

__all__ = ["Context", "NeedsAdmin", "SetupFailed", "Tenant", "Throwaway", "run_id"]

_SERVED_WITHIN_S = 20.0


class SetupFailed(Exception):
    """The control plane refused to make what the checks need; the message says what it said."""


class NeedsAdmin(Exception):
    """The area needs ``--admin-token-file``."""


def run_id() -> str:
    return f"smoke-{time.strftime('%m%d%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class Tenant:
    id: str
    keys: tuple[str, ...]
    key_ids: tuple[str, ...] = ()

    @property
    def project(self) -> str:
        return f"{self.id}/smoke"


@dataclass
class Throwaway:
    """Tenants (and budget rules) made for this run, deactivated (rules deleted) by ``close``."""

    http: Http
    control_plane: str
    admin: str
    run: str
    made: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)

    async def call(self, method: str, path: str, body: object = None) -> Reply:
        url = f"{self.control_plane}{path}"
        if body is None and method in ("POST", "PUT", "PATCH"):
            body = {}  # the control plane takes JSON writes only
        return await self.http.call(method, url, token=self.admin, body=body)

    async def expect(self, method: str, path: str, body: object = None) -> dict[str, object]:
        reply = await self.call(method, path, body)
        found = reply.json()
        if reply.status not in (200, 201, 202) or not isinstance(found, dict):
            raise SetupFailed(f"{method} {path}: {reply.brief()}")
        return found

    async def tenant(
        self,
        role: str,
        *,
        keys: int = 1,
        request_limit: int | None = None,
        token_limit: int | None = None,
    ) -> Tenant:
        tenant_id = f"{self.run}-{role}"
        body: dict[str, object] = {"id": tenant_id, "name": f"fleet smoke {role}"}
        if request_limit is not None:
            body["requestLimit"] = request_limit
        if token_limit is not None:
            body["tokenLimit"] = token_limit
        await self.expect("POST", "/api/v1/tenants", body)
        self.made.append(tenant_id)
        await self.expect("POST", "/api/v1/projects", {"tenantId": tenant_id, "name": "smoke"})
        issued = [
            await self.expect(
                "POST", "/api/v1/keys", {"projectId": f"{tenant_id}/smoke", "label": "fleet smoke"}
            )
            for _ in range(keys)
        ]
        return Tenant(
            tenant_id,
            tuple(str(k["secret"]) for k in issued),
            tuple(str(k["id"]) for k in issued),
        )

    async def rule(self, body: dict[str, object]) -> dict[str, object]:
        made = await self.expect("POST", "/api/v1/budget-rules", body)
        self.rules.append(str(made["id"]))
        return made

    async def close(self) -> list[str]:
        """Deactivate every tenant made and delete every rule; what could not be undone."""
        left = []
        for rule in self.rules:
            if (await self.call("DELETE", f"/api/v1/budget-rules/{rule}")).status != 200:
                left.append(f"budget rule {rule}")
        for tenant in self.made:
            done = await self.call("PATCH", f"/api/v1/tenants/{tenant}", {"active": False})
            if done.status != 200:
                left.append(f"tenant {tenant} ({done.status})")
        return left


@dataclass
class Context:
    http: Http
    gateway: str
    control_plane: str
    run: str
    admin: str | None = None
    key: str | None = None
    """``--key-file`` (or FLEET_SMOKE_KEY): a key of the deployment's own, for the OpenAI rows."""
    model: str | None = None
    hub: str | None = None
    """``--hub``: the synthetic hub the control plane pulls from, for the weight-format rows."""
    metrics_token: str | None = None
    throwaway: Throwaway | None = None
    limited: object | None = None
    """The gateway the auth, rate-limit and metrics rows use (``limited.Limited``), made once."""
    make_limited: Callable[[Context], Awaitable[object]] | None = None
    """How to make it (``--own-gateway``: start one); None: the gateway under test."""
    stack: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)
    """What the run must undo at its end, failed or not."""
    _tenants: dict[str, Tenant] = field(default_factory=dict)

    def tenants(self) -> Throwaway:
        if self.throwaway is None:
            raise NeedsAdmin("needs --admin-token-file (a control-plane admin credential)")
        return self.throwaway

    async def tenant(self, role: str, **options: int | None) -> Tenant:
        """The run's tenant for ``role`` (made once), once the gateway serves its keys."""
        if role not in self._tenants:
            made = await self.tenants().tenant(role, **options)  # type: ignore[arg-type]
            for key in made.keys:
                await served(self.http, self.gateway, key)
            self._tenants[role] = made
        return self._tenants[role]

    async def user_key(self) -> str:
        return self.key or (await self.tenant("main")).keys[0]

    async def model_name(self, key: str) -> str:
        if self.model is None:
            listed = (await self.http.call("GET", f"{self.gateway}/v1/models", token=key)).json()
            data = listed.get("data") if isinstance(listed, dict) else None
            self.model = str(data[0]["id"]) if data else "unknown"
        return self.model


async def served(http: Http, gateway: str, key: str) -> None:
    """Wait until ``gateway`` accepts ``key`` (a new key reaches it with the next catalog)."""
    deadline = time.monotonic() + _SERVED_WITHIN_S
    while True:
        reply = await http.call("GET", f"{gateway}/v1/models", token=key)
        if reply.status == 200:
            return
        if time.monotonic() > deadline:
            raise SetupFailed(
                f"the gateway did not accept a new key within {_SERVED_WITHIN_S:.0f} s: "
                f"{reply.brief()}"
            )
        await asyncio.sleep(0.25)
