"""The gateway counts with the tokenizer the registry pulled (P6): ``tokenizer: registry:<id>``."""

from __future__ import annotations

import contextlib

import httpx
import msgspec
import pytest
from tokenizers import Tokenizer

from fleet_core.devtools.stub_engine import StubSettings, create_app
from fleet_core.gateway.app import create_gateway_app, open_resources
from fleet_core.gateway.config import GatewayConfig, validate
from fleet_core.gateway.settings import GatewaySettings, LogSettings, from_env
from fleet_core.shared.errors import ConfigError
from fleet_testing.asgi import serving
from fleet_testing.fix_auth import bearer

from .conftest import ControlPlaneFactory, pull_to_end, register

PROMPT = "the quick brown fox jumps over the lazy dog"


@pytest.mark.parametrize("object_store", ["directory"], indirect=True)
async def test_the_gateway_counts_with_the_registry_tokenizer(
    start_control_plane: ControlPlaneFactory,
) -> None:
    plane = await start_control_plane()
    async with httpx.AsyncClient(
        base_url=plane.url, headers=plane.headers, timeout=30
    ) as control_plane_client:
        await register(control_plane_client, "fleet/tiny-safetensors", id="tiny")
        assert (await pull_to_end(control_plane_client, "tiny"))["status"] == "Ready"
        credential = {"role": "gateway", "label": "gateway"}
        token = (await control_plane_client.post("/api/v1/credentials", json=credential)).json()[
            "secret"
        ]
        envelope = (
            await control_plane_client.get("/api/v1/models/tiny/tokenizer")
        ).text  # admin may, too
        served = (
            await control_plane_client.get("/api/v1/models/tiny/tokenizer", headers=bearer(token))
        ).text
    assert served == envelope
    expected = len(Tokenizer.from_str(served).encode(PROMPT, add_special_tokens=False).ids)

    config = msgspec.convert(
        {
            "upstreams": [
                {"id": "m", "model": "m", "base_url": "http://x", "tokenizer": "registry:tiny"}
            ]
        },
        GatewayConfig,
    )
    async with contextlib.AsyncExitStack() as stack:
        engine = await stack.enter_async_context(serving(create_app(StubSettings(model="m"))))
        config = msgspec.structs.replace(
            config, upstreams=(msgspec.structs.replace(config.upstreams[0], base_url=engine),)
        )
        validate(config)
        settings = GatewaySettings(
            config=config,
            control_plane_url=plane.url,
            control_plane_token=token,
            log=LogSettings(access=False),
        )
        resources = await stack.enter_async_context(open_resources(settings))
        gateway = await stack.enter_async_context(serving(create_gateway_app(settings, resources)))
        async with httpx.AsyncClient(base_url=gateway) as http:
            reply = await http.post(
                "/v1/completions", json={"model": "m", "prompt": PROMPT, "max_tokens": 4}
            )
            assert reply.status_code == 200
            (record,) = (await http.get("/api/v1/requests")).json()["data"]
    assert record["gateway"]["method"] == "tokenizer:registry:tiny"
    assert record["gateway"]["promptTokens"] == expected


def test_a_registry_tokenizer_needs_the_control_plane_url() -> None:
    config = msgspec.convert(
        {
            "upstreams": [
                {"id": "m", "model": "m", "base_url": "http://x", "tokenizer": "registry:t"}
            ]
        },
        GatewayConfig,
    )
    with pytest.raises(ConfigError, match="FLEET_CONTROL_PLANE_URL"):
        from_env({}, config)


def test_the_control_plane_url_needs_the_gateways_credential() -> None:
    """The control plane answers no anonymous caller, so a gateway without its token could
    only fail at every poll: it refuses to start instead, in one line."""
    with pytest.raises(ConfigError, match="FLEET_CONTROL_PLANE_TOKEN"):
        from_env({"FLEET_CONTROL_PLANE_URL": "http://127.0.0.1:8081"}, GatewayConfig())
    settings = from_env(
        {"FLEET_CONTROL_PLANE_URL": "http://cp:8081", "FLEET_CONTROL_PLANE_TOKEN": "t" * 40},
        GatewayConfig(),
    )
    assert settings.control_plane_token == "t" * 40
    assert "t" * 40 not in repr(settings)
