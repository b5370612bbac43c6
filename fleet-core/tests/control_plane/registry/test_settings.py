"""The registry's environment, and the dev wiring: a control plane pointed at the synthetic hub
(FLEET_HUB_URL), as ``make dev`` runs it, pulls with no network."""

from __future__ import annotations

import httpx
import pytest

from fleet_core.control_plane.app import ApiserverSettings
from fleet_core.control_plane.registry.settings import DEFAULT_HUB_URL, registry_settings
from fleet_core.shared.errors import ConfigError
from fleet_core.shared.settings import LogSettings
from fleet_testing.asgi import control_plane_app
from fleet_testing.fix_auth import bearer

from .conftest import HubUnderTest, pull_to_end, register


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
        }
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
    dev = registry_settings({"FLEET_HUB_URL": "http://127.0.0.1:8090"})
    assert (dev.s3, dev.hub_url) == (None, "http://127.0.0.1:8090")


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
        ({"FLEET_SYNTHETIC_HUB": "1"}, "FLEET_HUB_URL"),
    ],
)
def test_a_setting_that_cannot_work_refuses_naming_it(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        registry_settings(env)


async def test_the_control_plane_pulls_from_the_synthetic_hub_as_make_dev_runs_them(
    postgres_url: str, tmp_path: object, admin_token: str, hub: HubUnderTest
) -> None:
    env = {"FLEET_HUB_URL": hub.url, "FLEET_MODELS_DIR": str(tmp_path)}
    settings = ApiserverSettings(
        database_url=postgres_url,
        log=LogSettings(access=False),
        registry=registry_settings(env),
        admin_token=admin_token,
    )
    async with (
        control_plane_app(settings) as url,
        httpx.AsyncClient(base_url=url, headers=bearer(admin_token), timeout=30) as http,
    ):
        await register(http, "fleet/tiny-safetensors", id="dev")
        model = await pull_to_end(http, "dev")
    assert model["status"] == "Ready", model["reason"]
