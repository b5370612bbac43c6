"""CORS on the control plane: a console on the gateway's origin, a loopback dev server or a
configured origin may call it from a browser; a foreign origin may not (docs/console.md)."""

from __future__ import annotations

import httpx
import pytest

from fleet_core.control_plane.main import apiserver_settings

from .conftest import ApiserverFactory

CONSOLE = "https://console.example.com"


async def _preflight(http: httpx.AsyncClient, url: str, origin: str) -> httpx.Response:
    return await http.options(
        f"{url}/api/v1/whoami",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "authorization",
        },
    )


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("http://127.0.0.1:8080", True),  # the gateway serving the console (make dev)
        ("http://localhost:5173", True),  # make web-dev's vite server
        (CONSOLE, True),  # FLEET_CORS_ORIGINS
        ("https://evil.example", False),
        ("http://127.0.0.2:8080", False),  # not the loopback names the console uses
        ("https://console.example.com.evil.example", False),
        ("null", False),
    ],
)
async def test_console_origins_are_allowed_and_foreign_ones_refused(
    start_apiserver: ApiserverFactory, admin_token: str, origin: str, allowed: bool
) -> None:
    url = await start_apiserver(cors_origins=(CONSOLE,))
    async with httpx.AsyncClient() as http:
        preflight = await _preflight(http, url, origin)
        actual = await http.get(
            f"{url}/api/v1/whoami",
            headers={"Origin": origin, "Authorization": f"Bearer {admin_token}"},
        )
    assert (preflight.headers.get("access-control-allow-origin") == origin) is allowed
    assert (preflight.status_code == 200) is allowed
    assert (actual.headers.get("access-control-allow-origin") == origin) is allowed
    if allowed:
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()


def test_extra_origins_come_from_the_environment() -> None:
    env = {"FLEET_CORS_ORIGINS": f"{CONSOLE}, https://ops.example.com"}
    settings = apiserver_settings(env, "127.0.0.1:8081")
    assert settings.cors_origins == (CONSOLE, "https://ops.example.com")
