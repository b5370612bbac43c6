"""Tenants and projects over HTTP on a real Postgres: envelopes, named params, nested limits."""

from __future__ import annotations

from typing import Any

import httpx
import psycopg
import pytest

from .conftest import ApiserverFactory, envelope


@pytest.fixture
async def db_api(start_apiserver: ApiserverFactory, postgres_url: str) -> str:
    return await start_apiserver(database_url=postgres_url)


async def test_a_tenant_is_created_read_listed_and_refused_twice(
    db_api: str, admin_headers: dict[str, str]
) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=db_api) as http:
        created = await http.post("/api/v1/tenants/", json={"id": "acme", "name": "Acme"})
        assert created.status_code == 201, created.text
        tenant = created.json()
        assert tenant["requestLimit"] is None
        assert tenant["active"] is True
        assert tenant["createdAt"].endswith("Z")
        assert (await http.get("/api/v1/tenants/acme/")).json() == tenant
        listed = (await http.get("/api/v1/tenants")).json()
        assert listed == {"object": "list", "data": [tenant]}
        again = await http.post("/api/v1/tenants", json={"id": "acme", "name": "Other"})
        assert envelope(again, 409)["code"] == "already_exists"
        assert envelope(await http.get("/api/v1/tenants/nobody"), 404)["code"] == "not_found"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"name": "no id"}, "id"),
        ({"id": "acme"}, "name"),
        ({"id": "a b", "name": "x"}, "id"),
        ({"id": "acme\n", "name": "x"}, "id"),
        ({"id": "acme", "name": "x", "requestLimit": "many"}, "requestLimit"),
        ({"id": "acme", "name": "x", "tokenLimit": 0}, "tokenLimit"),
        ({"id": "acme", "name": "x", "requestLimit": 2**31}, "requestLimit"),
        ({"id": "acme", "name": "x", "active": "yes"}, "active"),
    ],
)
async def test_invalid_tenants_are_400_naming_the_field(
    db_api: str, body: dict[str, Any], param: str, admin_headers: dict[str, str]
) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=db_api) as http:
        refused = envelope(await http.post("/api/v1/tenants", json=body), 400)
        assert refused["param"] == param
        assert refused["type"] == "invalid_request_error"


async def test_malformed_json_is_400(db_api: str, admin_headers: dict[str, str]) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=db_api) as http:
        assert envelope(await http.post("/api/v1/tenants", content=b"{nope"), 400)["param"] is None


async def test_projects_are_named_tenant_slash_name(
    db_api: str, admin_headers: dict[str, str]
) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=db_api) as http:
        await http.post("/api/v1/tenants", json={"id": "acme", "name": "Acme"})
        created = await http.post("/api/v1/projects", json={"tenantId": "acme", "name": "chat"})
        assert created.status_code == 201, created.text
        assert created.json()["id"] == "acme/chat"
        assert (await http.get("/api/v1/projects/acme/chat")).json()["name"] == "chat"
        assert (await http.get("/api/v1/projects/acme%2Fchat/")).json()["name"] == "chat"
        listed = (await http.get("/api/v1/projects", params={"tenantId": "acme"})).json()
        assert [p["id"] for p in listed["data"]] == ["acme/chat"]
        dup = await http.post("/api/v1/projects", json={"tenantId": "acme", "name": "chat"})
        envelope(dup, 409)
        orphan = await http.post("/api/v1/projects", json={"tenantId": "nobody", "name": "x"})
        assert envelope(orphan, 400)["param"] == "tenantId"
        envelope(await http.get("/api/v1/projects/acme/none"), 404)


async def test_project_limits_never_exceed_the_tenants(
    db_api: str, admin_headers: dict[str, str]
) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=db_api) as http:
        tenant = {"id": "acme", "name": "Acme", "requestLimit": 100, "tokenLimit": 1000}
        await http.post("/api/v1/tenants", json=tenant)
        above = {"tenantId": "acme", "name": "big", "tokenLimit": 1001}
        refused = envelope(await http.post("/api/v1/projects", json=above), 400)
        assert refused["param"] == "tokenLimit"
        fits = {"tenantId": "acme", "name": "chat", "requestLimit": 60, "tokenLimit": 1000}
        assert (await http.post("/api/v1/projects", json=fits)).status_code == 201
        raised = await http.patch("/api/v1/projects/acme/chat", json={"requestLimit": 101})
        assert envelope(raised, 400)["param"] == "requestLimit"
        lowered = await http.patch("/api/v1/tenants/acme", json={"requestLimit": 59})
        refused = envelope(lowered, 400)
        assert refused["param"] == "requestLimit"
        assert "acme/chat" in refused["message"]
        unlimited = await http.patch("/api/v1/tenants/acme", json={"requestLimit": None})
        assert unlimited.json()["requestLimit"] is None
        assert unlimited.json()["tokenLimit"] == 1000  # absent: kept
        ok = await http.patch("/api/v1/projects/acme/chat/", json={"requestLimit": 5000})
        assert ok.status_code == 200
        assert ok.json()["requestLimit"] == 5000


async def test_inactive_is_stored(acme_api: str, admin_headers: dict[str, str]) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=acme_api) as http:
        patched = await http.patch("/api/v1/projects/acme/chat", json={"active": False})
        assert patched.json()["active"] is False
        assert (await http.get("/api/v1/projects/acme/chat")).json()["active"] is False
        tenant = await http.patch("/api/v1/tenants/acme", json={"active": False, "name": "A"})
        assert tenant.json()["active"] is False
        assert tenant.json()["name"] == "A"


async def test_delete_without_usage_takes_projects_keys_and_rules(
    acme_api: str, postgres_url: str, admin_headers: dict[str, str]
) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=acme_api) as http:
        await http.post("/api/v1/keys", json={"projectId": "acme/chat", "label": "ci"})
        rule = {"scopeKind": "project", "scopeId": "acme/chat", "dimension": "units"}
        await http.post("/api/v1/budget-rules", json={**rule, "limit": 5, "window": "1d"})
        deleted = await http.delete("/api/v1/tenants/acme")
        assert deleted.json() == {"id": "acme", "object": "tenant", "deleted": True}
        envelope(await http.get("/api/v1/projects/acme/chat"), 404)
        envelope(await http.delete("/api/v1/tenants/acme"), 404)
    with psycopg.connect(postgres_url) as conn:
        for table in ("projects", "api_keys", "budget_rules"):
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)


async def test_delete_with_billed_usage_is_409_saying_deactivate(
    acme_api: str, postgres_url: str, admin_headers: dict[str, str]
) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=acme_api) as http:
        await http.post("/api/v1/projects", json={"tenantId": "acme", "name": "idle"})
        bill(postgres_url, tenant="acme", project="chat")
        for path in ("/api/v1/projects/acme/chat", "/api/v1/tenants/acme"):
            refused = envelope(await http.delete(path), 409)
            assert refused["code"] == "has_usage"
            assert "PATCH" in refused["message"]
            assert '"active": false' in refused["message"]
        assert (await http.delete("/api/v1/projects/acme/idle")).status_code == 200
        assert (await http.get("/api/v1/tenants/acme")).status_code == 200


def bill(url: str, *, tenant: str, project: str) -> None:
    """One ledger row, whatever the ledger's other required columns are (or a minimal ledger)."""
    with psycopg.connect(url, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('ledger')").fetchone() == (None,):
            conn.execute("CREATE TABLE ledger (tenant text, project text)")
        columns = conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_name = 'ledger' AND is_nullable = 'NO' AND column_default IS NULL"
        ).fetchall()
        values: dict[str, object] = {name: _dummy(kind) for name, kind in columns}
        values.update(tenant=tenant, project=project)
        names = ", ".join(values)
        marks = ", ".join(["%s"] * len(values))
        conn.execute(f"INSERT INTO ledger ({names}) VALUES ({marks})", list(values.values()))


def _dummy(kind: str) -> object:
    if kind.startswith("timestamp"):
        return "2026-01-01T00:00:00Z"
    if kind in ("integer", "bigint", "smallint", "numeric"):
        return 0
    return False if kind == "boolean" else "x"
