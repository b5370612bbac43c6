"""Budget rules over HTTP on a real Postgres: windows, scopes, and the window read back as given."""

from __future__ import annotations

from typing import Any

import httpx
import psycopg
import pytest

from fleet_core.control_plane.budget_rules.windows import parse_window, render_window
from fleet_core.shared.errors import InvalidRequest

from .conftest import envelope

RULE = {"scopeKind": "tenant", "scopeId": "acme", "dimension": "tokens_total", "limit": 1000}


@pytest.mark.parametrize(
    ("window", "seconds"),
    [
        ("30s", 30),
        ("15m", 900),
        ("5h", 18000),
        ("1d", 86400),
        ("7d", 604800),
        ("2w", 1209600),
        ("1mo", 2592000),
    ],
)
def test_windows_parse(window: str, seconds: int) -> None:
    assert parse_window(window) == seconds


@pytest.mark.parametrize("window", ["", "1y", "0d", "5", "d", "-1d", "1.5h", "1mo\n", "999999mo"])
def test_bad_windows_are_refused(window: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        parse_window(window)
    assert raised.value.param == "window"


def test_windows_render_in_the_largest_whole_unit() -> None:
    assert [render_window(s) for s in (2592000, 604800, 86400, 90, 3600)] == [
        "1mo",
        "1w",
        "1d",
        "90s",
        "1h",
    ]


async def test_a_rule_keeps_its_window_as_given(
    acme_api: str, postgres_url: str, admin_headers: dict[str, str]
) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=acme_api) as http:
        created = await http.post("/api/v1/budget-rules/", json={**RULE, "window": "1mo"})
        assert created.status_code == 201, created.text
        rule = created.json()
        assert rule["id"].startswith("rule_")
        assert rule["window"] == "1mo"
        assert rule["windowSeconds"] == 2592000
        week = await http.post("/api/v1/budget-rules", json={**RULE, "window": "7d"})
        assert week.json()["window"] == "7d"
        listed = (await http.get("/api/v1/budget-rules")).json()
        assert [r["window"] for r in listed["data"]] == ["1mo", "7d"]
        assert (await http.get(f"/api/v1/budget-rules/{rule['id']}")).json() == rule
        assert (await http.delete(f"/api/v1/budget-rules/{rule['id']}")).json() == rule
        envelope(await http.get(f"/api/v1/budget-rules/{rule['id']}"), 404)
        envelope(await http.delete("/api/v1/budget-rules/whatever"), 404)
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT window_s, window_spec FROM budget_rules").fetchall() == [
            (604800, "7d")
        ]


async def test_a_rule_written_without_its_window_string_is_rendered(
    acme_api: str, postgres_url: str, admin_headers: dict[str, str]
) -> None:
    with psycopg.connect(postgres_url) as conn:
        conn.execute(
            'INSERT INTO budget_rules (id, scope_kind, scope_id, dimension, "limit", window_s)'
            " VALUES ('rule_00000000000a', 'tenant', 'acme', 'units', 5, 2592000)"
        )
    async with httpx.AsyncClient(headers=admin_headers, base_url=acme_api) as http:
        rule = (await http.get("/api/v1/budget-rules/rule_00000000000a")).json()
        assert rule["window"] == "1mo"


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"window": "1y"}, "window"),
        ({"window": "0d"}, "window"),
        ({"limit": 0}, "limit"),
        ({"limit": "lots"}, "limit"),
        ({"dimension": "dollars"}, "dimension"),
        ({"scopeKind": "key"}, "scopeKind"),
        ({"scopeId": "nobody"}, "scopeId"),
        ({"scopeKind": "project", "scopeId": "acme/none"}, "scopeId"),
        ({"scopeKind": "project", "scopeId": "acme"}, "scopeId"),
    ],
)
async def test_invalid_rules_are_400_naming_the_field(
    acme_api: str, change: dict[str, Any], param: str, admin_headers: dict[str, str]
) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=acme_api) as http:
        body = {**RULE, "window": "1d", **change}
        assert envelope(await http.post("/api/v1/budget-rules", json=body), 400)["param"] == param


async def test_a_project_scope_is_accepted(acme_api: str, admin_headers: dict[str, str]) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=acme_api) as http:
        body = {**RULE, "scopeKind": "project", "scopeId": "acme/chat", "window": "5h"}
        assert (await http.post("/api/v1/budget-rules", json=body)).status_code == 201


async def test_a_rules_limit_and_window_change_in_place(
    acme_api: str, postgres_url: str, admin_headers: dict[str, str]
) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=acme_api) as http:
        rule = (await http.post("/api/v1/budget-rules", json={**RULE, "window": "1d"})).json()
        one = f"/api/v1/budget-rules/{rule['id']}"
        limited = await http.patch(one, json={"limit": 50})
        assert limited.status_code == 200, limited.text
        assert limited.json() == {**rule, "limit": 50}
        widened = (await http.patch(one, json={"window": "7d"})).json()
        assert widened == {**rule, "limit": 50, "window": "7d", "windowSeconds": 604800}
        assert (await http.get(one)).json() == widened
        assert (await http.patch(one, json={})).json() == widened
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute('SELECT "limit", window_s, window_spec FROM budget_rules').fetchone()
    assert row == (50, 604800, "7d")


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"window": "1y"}, "window"),
        ({"window": "0d"}, "window"),
        ({"window": 7}, "window"),
        ({"limit": 0}, "limit"),
        ({"limit": 2**53}, "limit"),
        ({"limit": None}, "limit"),
    ],
)
async def test_a_bad_change_is_400_naming_the_field_and_changes_nothing(
    acme_api: str, change: dict[str, Any], param: str, admin_headers: dict[str, str]
) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=acme_api) as http:
        rule = (await http.post("/api/v1/budget-rules", json={**RULE, "window": "1d"})).json()
        one = f"/api/v1/budget-rules/{rule['id']}"
        assert envelope(await http.patch(one, json=change), 400)["param"] == param
        assert (await http.get(one)).json() == rule


async def test_changing_a_missing_rule_is_404(acme_api: str, admin_headers: dict[str, str]) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=acme_api) as http:
        envelope(await http.patch("/api/v1/budget-rules/rule_00000000000b", json={"limit": 5}), 404)
        envelope(await http.patch("/api/v1/budget-rules/whatever", json={"limit": 5}), 404)
