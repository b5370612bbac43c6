"""The role x route matrix: every served /api/v1 route has a policy, and every role gets what the
policy says — allowed: anything but 401/403; refused: 401 without a credential, 403 with the wrong
one, both as OpenAI-style envelopes."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from starlette.routing import Route

from fleet_core.control_plane.access import POLICY, ROLES
from fleet_core.control_plane.app import ApiserverSettings, create_apiserver_app, open_resources
from fleet_core.shared.settings import LogSettings
from fleet_testing.asgi import serving
from fleet_testing.fix_auth import bearer

from .conftest import envelope, issue, tenant_key

# Path parameters: the tenant key's own tenant and project (so tenant-scoped reads are its own),
# ids that exist nowhere for the rest (so no admin call deletes what a later call needs).
PARAMS = {
    "tenant_id": "acme",
    "project_id": "acme/chat",
    "key_id": "key_000000000000",
    "rule_id": "rule_000000000000",
    "model": "no-such-model",
    "period": "2026-01",
    "model_id": "no-such-model",
    "name": "config.json",
    "cluster_id": "c1",
    "credential_id": "cred_000000000000",
}
_PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")


@dataclass
class Served:
    url: str
    routes: list[tuple[str, str]]
    """(method, path template) of every /api/v1 route the app serves."""
    tokens: dict[str, str]
    """A credential per role."""


@pytest.fixture
async def served(postgres_url: str, admin_token: str) -> AsyncIterator[Served]:
    settings = ApiserverSettings(
        log=LogSettings(access=False), database_url=postgres_url, admin_token=admin_token
    )
    async with contextlib.AsyncExitStack() as stack:
        resources = await stack.enter_async_context(open_resources(settings))
        app = create_apiserver_app(settings, resources)
        url = await stack.enter_async_context(serving(app))
        routes = [
            (method, route.path)
            for route in app.routes
            if isinstance(route, Route) and route.path.startswith("/api/v1/")
            for method in sorted((route.methods or set()) - {"HEAD"})
        ]
        async with httpx.AsyncClient(base_url=url, headers=bearer(admin_token)) as http:
            tokens = {"admin": admin_token, "tenant": await tenant_key(http, "acme")}
            for role in ("finance", "engine", "gateway", "metrics"):
                tokens[role] = await issue(http, role)
            tokens["operator"] = await issue(http, "operator", clusterId="c1")
        yield Served(url, routes, tokens)


def test_every_role_is_in_the_matrix() -> None:
    assert set(ROLES) == {"admin", "finance", "operator", "engine", "gateway", "metrics", "tenant"}


async def test_every_served_route_has_a_policy_and_no_policy_is_stale(served: Served) -> None:
    missing = [route for route in served.routes if route not in POLICY]
    assert not missing, f"routes without a policy in apiserver/policy.py: {missing}"
    assert set(POLICY) == set(served.routes), "policy rows for routes that are not served"


async def call(http: httpx.AsyncClient, method: str, template: str) -> httpx.Response:
    path = _PARAM.sub(lambda m: PARAMS[m[1]], template)
    body = b"{}" if method in ("POST", "PUT", "PATCH") else None
    if template.endswith("/pull/events"):  # a stream: the status line is all this test needs
        async with http.stream(method, path) as response:
            if response.status_code != 200:
                await response.aread()
            return response
    return await http.request(method, path, content=body)


async def test_every_role_on_every_route(served: Served) -> None:
    """Admin last: what it may do (deleting, closing) must not change what others are asked."""
    checked = 0
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as anonymous:
        for method, template in served.routes:
            policy = POLICY[(method, template)]
            response = await call(anonymous, method, template)
            if policy.public:
                assert response.status_code not in (401, 403), (method, template)
            else:
                error = envelope(response, 401)
                assert error["type"] == "authentication_error", (method, template)
                assert response.headers["www-authenticate"] == "Bearer"
    for role in [r for r in ROLES if r != "admin"] + ["admin"]:
        headers = bearer(served.tokens[role])
        async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=30) as http:
            for method, template in served.routes:
                policy = POLICY[(method, template)]
                response = await call(http, method, template)
                where = f"{role} {method} {template}: {response.text[:200]}"
                if policy.public or policy.admits(role):  # type: ignore[arg-type]
                    assert response.status_code not in (401, 403), where
                else:
                    assert envelope(response, 403)["type"] == "permission_error", where
                checked += 1
    assert checked == len(ROLES) * len(served.routes)
