"""The console served by the gateway over real HTTP: shell, deep links, assets, placeholder, and
the ``/api/v1`` calls passed to a real control plane (ADR 0012)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleet_core.gateway.console.serving import PLACEHOLDER
from fleet_core.gateway.console.settings import ConsoleSettings, console_from_env
from fleet_testing.fix_auth import bearer

from .conftest import GatewayFactory, StubFactory

SHELL = (
    '<!doctype html><html><body><div id="root"></div>'
    '<script type="module" src="/assets/index-abc123.js"></script></body></html>'
)
SCRIPT = "export const answer = 42;\n"


@pytest.fixture
def built(tmp_path: Path) -> Path:
    """A console as ``make web`` leaves it: index.html and content-hashed assets."""
    (tmp_path / "assets").mkdir()
    (tmp_path / "index.html").write_text(SHELL)
    (tmp_path / "assets" / "index-abc123.js").write_text(SCRIPT)
    (tmp_path / "assets" / "index-abc123.css").write_text("body{margin:0}")
    (tmp_path / "secret.txt").write_text("not an asset")
    return tmp_path


async def _gateway(start_stub: StubFactory, start_gateway: GatewayFactory, **console: Any) -> str:
    engine = await start_stub(model="m")
    config = {"upstreams": [{"id": "a", "model": "m", "base_url": engine.url}]}
    gw = await start_gateway(config, console=ConsoleSettings(**console))
    return gw.url


@pytest.fixture
async def served(start_stub: StubFactory, start_gateway: GatewayFactory, built: Path) -> str:
    """The URL of a gateway serving the ``built`` console, with no control plane."""
    return await _gateway(start_stub, start_gateway, static_dir=built)


async def _get(url: str) -> httpx.Response:
    async with httpx.AsyncClient() as http:
        return await http.get(url)


@pytest.mark.parametrize("path", ["/", "/costs", "/models/hf-org-repo", "/tenants?tab=keys"])
async def test_every_page_path_is_the_app_shell(served: str, path: str) -> None:
    response = await _get(f"{served}{path}")
    assert response.status_code == 200
    assert response.text == SHELL
    assert response.headers["content-type"].startswith("text/html")
    assert response.headers["cache-control"] == "no-cache"
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]


async def test_assets_are_served_as_themselves_and_cached_for_good(served: str) -> None:
    async with httpx.AsyncClient(base_url=served) as http:
        script = await http.get("/assets/index-abc123.js")
        style = await http.get("/assets/index-abc123.css")
    assert script.status_code == 200
    assert script.text == SCRIPT  # the script, not index.html under a 200
    assert script.headers["content-type"].split(";")[0] == "text/javascript"
    assert script.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert script.headers["x-content-type-options"] == "nosniff"
    assert style.headers["content-type"].split(";")[0] == "text/css"


@pytest.mark.parametrize(
    "path",
    [
        "/assets/index-gone.js",
        "/assets/",
        "/assets/%2e%2e/secret.txt",
        "/assets/..%2fsecret.txt",
    ],
)
async def test_a_missing_asset_is_404_never_the_shell(served: str, path: str) -> None:
    response = await _get(f"{served}{path}")
    assert response.status_code == 404, response.text
    assert "not an asset" not in response.text
    assert response.headers["content-type"] == "application/json"


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/nope"), ("GET", "/api/v2/x"), ("POST", "/costs"), ("DELETE", "/")],
)
async def test_api_paths_and_writes_are_never_the_shell(
    served: str, method: str, path: str
) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.request(method, f"{served}{path}")
    assert response.status_code == 404
    assert "no route for" in response.json()["error"]["message"]


async def test_a_known_path_with_the_wrong_method_is_still_405(served: str) -> None:
    response = await _get(f"{served}/v1/chat/completions")
    assert response.status_code == 405
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_the_api_is_unchanged_beside_the_console(served: str) -> None:
    async with httpx.AsyncClient(base_url=served) as http:
        models = await http.get("/v1/models")
        health = await http.get("/healthz")
        requests = await http.get("/api/v1/requests")  # the gateway's own, not proxied
    assert models.json()["data"][0]["id"] == "m"
    assert health.json() == {"status": "ok"}
    assert requests.json()["object"] == "list"


async def test_without_a_build_a_placeholder_says_how_to_build(
    start_stub: StubFactory, start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    url = await _gateway(start_stub, start_gateway, static_dir=tmp_path / "absent")
    async with httpx.AsyncClient() as http:
        page = await http.get(f"{url}/fleet")
        script = await http.get(f"{url}/assets/index-abc123.js")
    assert page.status_code == 200
    assert page.text == PLACEHOLDER
    assert "make web" in page.text
    assert script.status_code == 404


async def test_without_a_control_plane_api_calls_say_what_to_set(served: str) -> None:
    response = await _get(f"{served}/api/v1/whoami")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "no_control_plane"
    assert "FLEET_CONSOLE_API_URL" in response.json()["error"]["message"]


async def test_console_calls_reach_the_control_plane_with_the_callers_credential(
    start_stub: StubFactory,
    start_gateway: GatewayFactory,
    control_plane: httpx.AsyncClient,
    admin_token: str,
    built: Path,
) -> None:
    api_url = str(control_plane.base_url).rstrip("/")
    url = await _gateway(start_stub, start_gateway, static_dir=built, api_url=api_url)
    async with httpx.AsyncClient(base_url=url) as http:
        anonymous = await http.get("/api/v1/tenants")
        who = await http.get("/api/v1/whoami", headers=bearer(admin_token))
        created = await http.post(
            "/api/v1/tenants", json={"id": "acme", "name": "Acme"}, headers=bearer(admin_token)
        )
        listed = await http.get("/api/v1/tenants", params={"limit": 5}, headers=bearer(admin_token))
        since = "2026-09-01T00:00:00+02:00"  # a '+' that must reach the control plane as one
        usage = await http.get(
            "/api/v1/usage", params={"from": since, "groupBy": "day"}, headers=bearer(admin_token)
        )
    assert anonymous.status_code == 401  # the gateway adds no credential of its own
    assert anonymous.headers["www-authenticate"].startswith("Bearer")
    assert who.json()["role"] == "admin"
    assert created.status_code == 201, created.text
    assert [t["id"] for t in listed.json()["data"]] == ["acme"]
    assert usage.status_code == 200, usage.text
    # The answer names the same instant (in UTC): the '+' was not read as a space.
    assert datetime.fromisoformat(usage.json()["from"]) == datetime.fromisoformat(since)


async def test_an_unreachable_control_plane_is_a_502_envelope(
    start_stub: StubFactory, start_gateway: GatewayFactory, built: Path
) -> None:
    url = await _gateway(start_stub, start_gateway, static_dir=built, api_url="http://127.0.0.1:9")
    response = await _get(f"{url}/api/v1/whoami")
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "control_plane_unavailable"


def test_the_control_plane_is_passed_through_only_when_asked() -> None:
    """Discovery's FLEET_CONTROL_PLANE_URL alone does not open the control plane's API through a
    gateway that may face the internet (docs/security.md)."""
    assert console_from_env({}).api_url is None
    assert console_from_env({"FLEET_CONTROL_PLANE_URL": "http://cp:8081"}).api_url is None
    asked = {"FLEET_CONSOLE_API_URL": "http://cp:8081/"}
    assert console_from_env(asked).api_url == "http://cp:8081"
