"""Fixtures: a synthetic hub on loopback, an object store (directory or SeaweedFS), and control
planes on a real Postgres database that can be stopped and started again on the same state."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleet_core.control_plane.app import ApiserverSettings
from fleet_core.control_plane.registry.objects import DirectoryStore, ObjectStore
from fleet_core.control_plane.registry.s3 import S3Settings, S3Store
from fleet_core.control_plane.registry.settings import RegistrySettings
from fleet_core.devtools.hub import Hub, create_hub_app, default_repos
from fleet_core.shared.settings import LogSettings
from fleet_testing.asgi import control_plane_app, serving
from fleet_testing.fix_s3 import S3Server

TERMINAL = {"Ready", "Failed", "Cancelled", "Registered"}


@dataclass
class HubUnderTest:
    hub: Hub
    url: str


@pytest.fixture
async def hub() -> AsyncIterator[HubUnderTest]:
    """The synthetic hub on loopback; its slow repository sends 1 MiB/s (4 MiB)."""
    served = Hub(default_repos(slow_bytes_per_s=1 << 20))
    async with serving(create_hub_app(served), grace_s=0.2) as url:
        yield HubUnderTest(served, url)


@pytest.fixture(params=["directory", "s3"])
def object_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[RegistrySettings, ObjectStore]]:
    """Registry settings for the store, and a store to look into what the pulls left."""
    if request.param == "directory":
        root = tmp_path / "models"
        yield RegistrySettings(models_dir=str(root)), DirectoryStore(root)
        return
    server: S3Server = request.getfixturevalue("s3_server")
    s3 = S3Settings(
        endpoint=server.endpoint,
        bucket=request.getfixturevalue("s3_bucket"),
        access_key=server.access_key,
        secret_key=server.secret_key,
        use_ssl=False,
        part_size=5 * 1024 * 1024,
    )
    store = S3Store(s3)
    yield RegistrySettings(s3=s3), store
    store.close()  # its pooled sockets, not the garbage collector's job


@dataclass
class ControlPlane:
    url: str
    stop: Callable[[], Awaitable[None]]
    headers: dict[str, str]
    """The admin's: its bearer token, and the JSON content type writes need."""


ControlPlaneFactory = Callable[..., Awaitable[ControlPlane]]


@pytest.fixture
async def start_control_plane(
    postgres_url: str,
    hub: HubUnderTest,
    object_store: tuple[RegistrySettings, ObjectStore],
    admin_token: str,
    admin_headers: dict[str, str],
) -> AsyncIterator[ControlPlaneFactory]:
    """``await start_control_plane(**registry_fields)``: a control plane on this test's database,
    hub and store; ``.stop()`` shuts it down (pulls are suspended, as on SIGTERM)."""
    async with contextlib.AsyncExitStack() as outer:

        async def start(**fields: Any) -> ControlPlane:
            defaults = {"hub_url": hub.url, "stall_timeout_s": 1.0, "persist_every_s": 0.1}
            registry = replace(object_store[0], **{**defaults, **fields})
            settings = ApiserverSettings(
                database_url=postgres_url,
                log=LogSettings(access=False),
                registry=registry,
                admin_token=admin_token,
            )
            stack = contextlib.AsyncExitStack()
            url = await stack.enter_async_context(control_plane_app(settings))
            outer.push_async_callback(stack.aclose)
            return ControlPlane(url, stack.aclose, admin_headers)

        yield start


@pytest.fixture
async def control_plane_client(
    start_control_plane: ControlPlaneFactory,
) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client on a running control plane (directory store, then SeaweedFS)."""
    plane = await start_control_plane()
    async with httpx.AsyncClient(base_url=plane.url, headers=plane.headers, timeout=30) as http:
        yield http


@pytest.fixture
def objects(object_store: tuple[RegistrySettings, ObjectStore]) -> ObjectStore:
    return object_store[1]


async def register(http: httpx.AsyncClient, repo: str, **fields: Any) -> dict[str, Any]:
    body = {"source": {"huggingface": {"repo": repo}}, **fields}
    response = await http.post("/api/v1/models", json=body)
    assert response.status_code == 201, response.text
    model: dict[str, Any] = response.json()
    return model


async def events(http: httpx.AsyncClient, model_id: str) -> AsyncIterator[dict[str, Any]]:
    """The pull's server-sent events, decoded, until the stream ends."""
    async with http.stream("GET", f"/api/v1/models/{model_id}/pull/events") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                yield json.loads(line.removeprefix("data: "))


async def pull_to_end(http: httpx.AsyncClient, model_id: str) -> dict[str, Any]:
    """Starts the pull and follows its events to the final state; returns the model."""
    started = await http.post(f"/api/v1/models/{model_id}/pull")
    assert started.status_code == 202, started.text
    final = [progress async for progress in events(http, model_id)][-1]
    assert final
    assert final["status"] in TERMINAL
    model = (await http.get(f"/api/v1/models/{model_id}")).json()
    assert isinstance(model, dict)
    return model
