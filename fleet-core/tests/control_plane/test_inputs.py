"""Hostile input at the control plane is a 400 envelope, never a 500: JSON nested past Python's
recursion limit, instants at the ends of ``datetime``'s range, NUL characters Postgres cannot
store. Each used to reach a decoder, the clock or Postgres and come back as a traceback."""

from __future__ import annotations

import httpx
import pytest

from .conftest import ApiserverFactory, envelope


@pytest.fixture
async def db_api(start_apiserver: ApiserverFactory, postgres_url: str) -> str:
    return await start_apiserver(database_url=postgres_url)


def _deep(depth: int) -> bytes:
    return b'{"id": "deep", "name": "Deep", "x": ' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/v1/tenants"),
        ("PATCH", "/api/v1/tenants/acme"),
        ("POST", "/api/v1/cost-rates"),
        ("PUT", "/api/v1/model-rates/m"),
        ("PUT", "/api/v1/inventory"),
        ("POST", "/api/v1/models"),
    ],
)
async def test_json_nested_a_thousand_deep_is_400_on_every_body(
    db_api: str, admin_headers: dict[str, str], method: str, path: str
) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=db_api) as http:
        for depth in (1_000, 100_000):
            response = await http.request(method, path, content=_deep(depth))
            assert envelope(response, 400)["code"] == "too_deep"
        shallow = await http.post("/api/v1/tenants", content=_deep(10))
        assert shallow.status_code == 201, shallow.text  # unknown fields still skipped


@pytest.mark.parametrize(
    "query",
    [
        {"from": "9999-12-31T23:30:00Z"},
        {"from": "9999-12-31T23:30:00Z", "to": "9999-12-31T23:59:59Z"},
        {"from": "0001-01-01T00:00:00+05:00"},
        {"to": "0001-01-01T00:00:00+05:00"},
        {"from": "1969-12-31T23:00:00-05:00"},
        {"to": "9999-12-31T23:59:59.999999-14:00"},
    ],
)
@pytest.mark.parametrize("path", ["/api/v1/usage", "/api/v1/usage-agreement"])
async def test_instants_at_the_ends_of_the_calendar_are_400(
    db_api: str, admin_headers: dict[str, str], path: str, query: dict[str, str]
) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=db_api) as http:
        if path == "/api/v1/usage":
            query = {**query, "groupBy": "day"}
        error = envelope(await http.get(path, params=query), 400)
        assert error["param"] in {"from", "to"}


@pytest.mark.parametrize(
    "at", ["0001-01-01T00:00:00+05:00", "9999-12-31T23:30:00-05:00", "0001-01-01T00:00:00Z"]
)
async def test_a_decommission_at_the_ends_of_the_calendar_is_400(
    control_plane_url: str, admin_headers: dict[str, str], at: str
) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=control_plane_url) as http:
        response = await http.delete("/api/v1/clusters/c1", params={"at": at})
        assert envelope(response, 400)["param"] == "at"


@pytest.mark.parametrize(
    ("method", "path", "body", "param"),
    [
        ("GET", "/api/v1/cost-rates?cluster=%00", None, "cluster"),
        ("GET", "/api/v1/clusters/%00", None, "cluster_id"),
        ("GET", "/api/v1/tenants/a%00b", None, "tenant_id"),
        ("GET", "/api/v1/usage?model=m%00", None, "model"),
        ("POST", "/api/v1/models", {"source": {"uri": "hf://a/b\x00"}}, None),
        ("POST", "/api/v1/tenants", {"id": "acme", "name": "A\x00"}, None),
        ("PUT", "/api/v1/model-rates/m%00", {"prompt": 1, "completion": 1}, "model"),
    ],
)
async def test_a_nul_anywhere_is_400_before_postgres(
    db_api: str,
    admin_headers: dict[str, str],
    method: str,
    path: str,
    body: object,
    param: str | None,
) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=db_api) as http:
        response = await http.request(method, path, json=body)
        error = envelope(response, 400)
        assert error["code"] == "nul"
        assert error["param"] == param
        assert "\x00" not in response.text


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/api/v1/model-rates/a%0Ab"),  # a {model:path} route: a line break stopped it
        ("GET", "/api/v1/model-rates/m%0A"),
        ("GET", "/api/v1/tenants/a%09b"),
        ("DELETE", "/api/v1/clusters/c%7F"),
    ],
)
async def test_a_control_character_in_the_path_is_400_not_a_missing_route(
    db_api: str, admin_headers: dict[str, str], method: str, path: str
) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=db_api) as http:
        response = await http.request(method, path, json={"prompt": 1, "completion": 1})
        assert envelope(response, 400)["code"] == "control_character"


async def test_an_escaped_backslash_before_u0000_is_not_a_nul(
    db_api: str, admin_headers: dict[str, str]
) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=db_api) as http:
        body = b'{"id": "acme", "name": "C:\\\\u0000"}'  # the text C:\u0000, six characters
        created = await http.post("/api/v1/tenants", content=body)
        assert created.status_code == 201, created.text
        assert created.json()["name"] == "C:\\u0000"
