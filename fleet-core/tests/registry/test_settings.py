"""The registry's environment, and the dev wiring: the synthetic hub mounted on the control plane
itself, so ``make dev`` pulls with no network."""

from __future__ import annotations

import socket

import httpx
import pytest

from fleet_core.apiserver.app import ApiserverSettings, create_apiserver_app, open_resources
from fleet_core.errors import ConfigError
from fleet_core.registry.settings import DEFAULT_HUB_URL, registry_settings
from fleet_core.settings import LogSettings
from fleet_core.stub_engine import running_app
from fleet_testing.fix_auth import bearer

from .conftest import pull_to_end, register


def test_the_environment_is_read_into_settings() -> None:
    settings = registry_settings(
        {
            "FLEET_S3_ENDPOINT": "127.0.0.1:9000",
            "FLEET_S3_BUCKET": "weights",
            "FLEET_S3_ACCESS_KEY": "fleetadmin",
            "FLEET_S3_SECRET_KEY": "fleet-secret-key-01",
            "FLEET_S3_USE_SSL": "false",
            "FLEET_S3_DOWNLOAD_ENDPOINT": "minio.fleet-system.svc:9000",
            "FLEET_HF_TOKEN": "hf_abc",
        },
        listen="127.0.0.1:8081",
    )
    assert settings.s3 is not None
    assert (settings.s3.endpoint, settings.s3.bucket, settings.s3.use_ssl) == (
        "127.0.0.1:9000",
        "weights",
        False,
    )
    assert settings.s3.download_endpoint == "minio.fleet-system.svc:9000"
    assert "fleet-secret-key-01" not in repr(settings)
    assert "hf_abc" not in repr(settings)
    assert settings.hub_url == DEFAULT_HUB_URL
    dev = registry_settings({"FLEET_SYNTHETIC_HUB": "1"}, listen="0.0.0.0:8081")
    assert (dev.s3, dev.synthetic_hub, dev.hub_url) == (None, True, "http://127.0.0.1:8081/hub")


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"FLEET_S3_USE_SSL": "maybe", "FLEET_S3_ENDPOINT": "h:1"}, "FLEET_S3_USE_SSL"),
        ({"FLEET_S3_ENDPOINT": "http://h:1"}, "FLEET_S3_ENDPOINT"),
        (
            {"FLEET_S3_ENDPOINT": "h:1", "FLEET_S3_DOWNLOAD_ENDPOINT": "https://h:1"},
            "FLEET_S3_DOWNLOAD_ENDPOINT",
        ),
        ({"FLEET_HUB_STALL_TIMEOUT_S": "0"}, "FLEET_HUB_STALL_TIMEOUT_S"),
    ],
)
def test_a_setting_that_cannot_work_refuses_naming_it(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        registry_settings(env, listen="127.0.0.1:8081")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_the_control_plane_pulls_from_its_own_synthetic_hub(
    postgres_url: str, tmp_path: object, admin_token: str
) -> None:
    port = free_port()
    env = {"FLEET_SYNTHETIC_HUB": "true", "FLEET_MODELS_DIR": str(tmp_path)}
    settings = ApiserverSettings(
        database_url=postgres_url,
        log=LogSettings(access=False),
        registry=registry_settings(env, listen=f"127.0.0.1:{port}"),
        admin_token=admin_token,
    )
    async with (
        open_resources(settings) as resources,
        running_app(create_apiserver_app(settings, resources), port=port) as url,
        httpx.AsyncClient(base_url=url, headers=bearer(admin_token), timeout=30) as http,
    ):
        await register(http, "fleet/tiny-safetensors", id="dev")
        model = await pull_to_end(http, "dev")
    assert model["status"] == "Ready", model["reason"]
