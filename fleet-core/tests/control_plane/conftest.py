"""Fixtures: the control plane served for real over loopback, with or without Postgres."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from fleet_core.control_plane.app import ApiserverSettings
from fleet_core.shared.settings import LogSettings
from fleet_testing.asgi import control_plane_app

ApiserverFactory = Callable[..., Awaitable[str]]


@pytest.fixture
async def start_apiserver(admin_token: str) -> AsyncIterator[ApiserverFactory]:
    """``await start_apiserver(database_url=None)`` → the base URL of a running control plane
    whose bootstrap admin token is the ``admin_token`` fixture."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(**fields: Any) -> str:
            fields = {"admin_token": admin_token, **fields}
            settings = ApiserverSettings(log=LogSettings(access=False), **fields)
            return await stack.enter_async_context(control_plane_app(settings))

        yield start


@pytest.fixture
async def acme_api(
    start_apiserver: ApiserverFactory, postgres_url: str, admin_headers: dict[str, str]
) -> str:
    """A control plane on a fresh Postgres database holding tenant ``acme`` and its project
    ``acme/chat``."""
    control_plane_url = await start_apiserver(database_url=postgres_url)
    async with httpx.AsyncClient(headers=admin_headers, base_url=control_plane_url) as http:
        await http.post("/api/v1/tenants", json={"id": "acme", "name": "Acme"})
        await http.post("/api/v1/projects", json={"tenantId": "acme", "name": "chat"})
    return control_plane_url


@pytest.fixture
async def admin(
    start_apiserver: ApiserverFactory, postgres_url: str, admin_headers: dict[str, str]
) -> AsyncIterator[httpx.AsyncClient]:
    """The admin's client on a control plane with a database."""
    url = await start_apiserver(database_url=postgres_url)
    async with httpx.AsyncClient(base_url=url, headers=admin_headers, timeout=30) as http:
        yield http


@pytest.fixture(params=["memory", "postgres"])
async def control_plane_url(
    request: pytest.FixtureRequest, start_apiserver: ApiserverFactory
) -> str:
    """A control plane without a database, then one on a fresh Postgres database."""
    if request.param == "memory":
        return await start_apiserver()
    return await start_apiserver(database_url=request.getfixturevalue("postgres_url"))


async def issue(http: httpx.AsyncClient, role: str, **fields: str) -> str:
    """A new service credential's secret, issued by ``http``'s (admin) credential."""
    response = await http.post("/api/v1/credentials", json={"role": role, "label": role, **fields})
    assert response.status_code == 201, response.text
    secret: str = response.json()["secret"]
    return secret


FIXTURE_MODELS = ("Qwen/Qwen2.5-7B-Instruct", "gemma-270m", "llama-405b", "tiny")
"""The served model names of the contract's ``v1-full.json`` fixture (cluster ``gpu-east``)."""


async def bind(
    http: httpx.AsyncClient,
    cluster: str = "gpu-east",
    models: tuple[str, ...] = FIXTURE_MODELS,
    endpoints: tuple[str, ...] = ("10.42.0.0/16",),
    *,
    base: str = "",
) -> dict[str, Any]:
    """What an admin does before a cluster reports: bind it to its models and addresses."""
    body = {"servedModels": list(models), "endpoints": list(endpoints)}
    response = await http.put(f"{base}/api/v1/clusters/{cluster}/binding", json=body)
    assert response.status_code == 200, response.text
    bound: dict[str, Any] = response.json()
    return bound


async def tenant_key(http: httpx.AsyncClient, tenant: str, project: str = "chat") -> str:
    """A tenant, a project of it and an API key of that project; returns the key's secret."""
    await http.post("/api/v1/tenants", json={"id": tenant, "name": tenant.title()})
    await http.post("/api/v1/projects", json={"tenantId": tenant, "name": project})
    body = {"projectId": f"{tenant}/{project}", "label": "test"}
    response = await http.post("/api/v1/keys", json=body)
    assert response.status_code == 201, response.text
    secret: str = response.json()["secret"]
    return secret


def envelope(response: httpx.Response, status: int) -> dict[str, Any]:
    """The OpenAI-style error of ``response``, which must have ``status``."""
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def refused_to_start(env: dict[str, str]) -> str:
    """``fleet-apiserver`` started with ``env`` must refuse (exit 2) in one line: that line."""
    result = subprocess.run(
        [sys.executable, "-m", "fleet_core.control_plane", "--listen", "127.0.0.1:0"],
        env={"PATH": "/usr/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    return result.stderr
