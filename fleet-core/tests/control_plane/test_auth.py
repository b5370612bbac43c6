"""Who may call the control plane: calls it once let through, and the credential model.

Each reproduction was a success on the old control plane (a secret handed to anyone, another
tenant's usage, traffic redirected by an anonymous inventory PUT, a text/plain write, a count
past bigint answered 500); here each is refused with the right status and an envelope.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import psycopg
import pytest

from fleet_core.control_plane.app import ApiserverSettings, open_resources
from fleet_core.shared.errors import ConfigError
from fleet_core.shared.settings import LogSettings
from fleet_testing.fix_auth import bearer

from .conftest import ApiserverFactory, bind, envelope, issue, refused_to_start, tenant_key
from .test_inventory import report


def as_(admin: httpx.AsyncClient, token: str | None) -> httpx.AsyncClient:
    headers = bearer(token) if token else {"Content-Type": "application/json"}
    return httpx.AsyncClient(base_url=admin.base_url, headers=headers, timeout=30)


async def test_an_anonymous_post_of_a_key_gets_no_secret(admin: httpx.AsyncClient) -> None:
    await tenant_key(admin, "acme")
    async with as_(admin, None) as anyone:
        response = await anyone.post("/api/v1/keys", json={"projectId": "acme/chat", "label": "x"})
    assert envelope(response, 401)["code"] == "invalid_api_key"
    assert "secret" not in response.text
    keys = (await admin.get("/api/v1/keys")).json()["data"]
    assert [k["label"] for k in keys] == ["test"]  # only the fixture's own key exists


async def test_a_tenant_key_reads_its_own_tenant_only(admin: httpx.AsyncClient) -> None:
    acme = await tenant_key(admin, "acme")
    await tenant_key(admin, "globex")
    rule = {"dimension": "tokens_total", "limit": 5, "window": "1d", "scopeKind": "tenant"}
    for scope in ("acme", "globex"):
        assert (
            await admin.post("/api/v1/budget-rules", json={**rule, "scopeId": scope})
        ).is_success
    async with as_(admin, acme) as tenant:
        other = await tenant.get("/api/v1/usage", params={"tenantId": "globex"})
        assert envelope(other, 403)["code"] == "other_tenant"
        by_project = await tenant.get("/api/v1/usage", params={"projectId": "globex/chat"})
        assert envelope(by_project, 403)["param"] == "projectId"
        assert (await tenant.get("/api/v1/usage", params={"tenantId": "acme"})).status_code == 200
        assert (await tenant.get("/api/v1/usage")).status_code == 200
        envelope(await tenant.get("/api/v1/keys", params={"projectId": "globex/chat"}), 403)
        keys = (await tenant.get("/api/v1/keys")).json()["data"]
        assert {k["projectId"] for k in keys} == {"acme/chat"}
        assert all("secret" not in k for k in keys)
        rules = (await tenant.get("/api/v1/budget-rules")).json()["data"]
        assert [r["scopeId"] for r in rules] == ["acme"]
        raise_own = await tenant.patch(f"/api/v1/budget-rules/{rules[0]['id']}", json={"limit": 9})
        envelope(raise_own, 403)  # a tenant cannot lift its own budget
        theirs = [r for r in (await admin.get("/api/v1/budget-rules")).json()["data"]]
        globex_rule = next(r["id"] for r in theirs if r["scopeId"] == "globex")
        envelope(await tenant.get(f"/api/v1/budget-rules/{globex_rule}"), 403)
        envelope(await tenant.get("/api/v1/tenants/globex"), 403)
        envelope(await tenant.get("/api/v1/projects/globex/chat"), 403)
        envelope(await tenant.get("/api/v1/projects", params={"tenantId": "globex"}), 403)
        projects = (await tenant.get("/api/v1/projects")).json()["data"]
        assert [p["id"] for p in projects] == ["acme/chat"]
        assert (await tenant.get("/api/v1/tenants/acme")).json()["id"] == "acme"


async def test_a_tenant_key_stops_working_when_revoked_or_its_project_is_inactive(
    admin: httpx.AsyncClient,
) -> None:
    acme = await tenant_key(admin, "acme")
    async with as_(admin, acme) as tenant:
        assert (await tenant.get("/api/v1/whoami")).json()["tenantId"] == "acme"
        await admin.patch("/api/v1/projects/acme/chat", json={"active": False})
        envelope(await tenant.get("/api/v1/whoami"), 401)


async def test_an_anonymous_inventory_put_cannot_redirect_traffic(
    admin: httpx.AsyncClient,
) -> None:
    hostile = report()
    hostile["deployments"][0]["endpoints"] = [{"url": "http://attacker.example:80", "ready": True}]
    async with as_(admin, None) as anyone:
        envelope(await anyone.put("/api/v1/inventory", json=hostile), 401)
    operator = await issue(admin, "operator", clusterId="gpu-west")
    async with as_(admin, operator) as other_cluster:
        refused = await other_cluster.put("/api/v1/inventory", json=hostile)
        assert envelope(refused, 403)["code"] == "other_cluster"
        in_own_name = await other_cluster.put(
            "/api/v1/inventory", json={**hostile, "clusterId": "gpu-west"}
        )
        assert envelope(in_own_name, 403)["code"] == "outside_binding"  # not bound: serves nothing
        await bind(admin, "gpu-west")
        own = await other_cluster.put(
            "/api/v1/inventory", json={**report(), "clusterId": "gpu-west"}
        )
        assert own.status_code == 200, own.text
    gateway = await issue(admin, "gateway")
    async with as_(admin, gateway) as router:
        endpoints = (await router.get("/api/v1/endpoints")).text
    assert "attacker" not in endpoints


@pytest.mark.parametrize(
    ("method", "path", "content_type"),
    [
        ("POST", "/api/v1/tenants", "text/plain"),
        ("POST", "/api/v1/keys", "application/x-www-form-urlencoded"),
        ("PUT", "/api/v1/inventory", "multipart/form-data; boundary=x"),
        ("POST", "/api/v1/models/x/pull", "text/plain"),
    ],
)
async def test_a_write_that_is_not_json_is_415(
    admin: httpx.AsyncClient, method: str, path: str, content_type: str | None
) -> None:
    """What a hostile page can make a browser send without a preflight (CSRF) is refused."""
    headers = {"Authorization": admin.headers["Authorization"]}
    if content_type:
        headers["Content-Type"] = content_type
    body = b'{"id": "acme", "name": "Acme"}' if content_type else None
    async with httpx.AsyncClient(base_url=admin.base_url) as http:
        response = await http.request(method, path, content=body, headers=headers)
    assert envelope(response, 415)["code"] == "unsupported_media_type"
    assert (await admin.get("/api/v1/tenants")).json()["data"] == []


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("PUT", "/api/v1/cost-periods/2026-09", 400, "insufficient_coverage"),
        ("POST", "/api/v1/models/x/pull", 404, "model_not_found"),
        ("POST", "/api/v1/tenants", 400, "invalid_json"),
    ],
)
async def test_a_write_without_a_body_needs_no_content_type(
    admin: httpx.AsyncClient, method: str, path: str, status: int, code: str
) -> None:
    """``curl -X PUT $A/cost-periods/2026-09`` sends no body and no type: nothing for a cross-site
    page to smuggle, so it is served (or refused for what it is), never 415."""
    headers = {"Authorization": admin.headers["Authorization"]}
    async with httpx.AsyncClient(base_url=admin.base_url) as http:
        response = await http.request(method, path, headers=headers)
    assert "content-type" not in response.request.headers
    assert envelope(response, status)["code"] == code


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/api/v1/tenants", {"id": "a", "name": "A", "tokenLimit": 2**53}, "tokenLimit"),
        ("/api/v1/tenants", {"id": "a", "name": "A", "tokenLimit": 2**64}, "tokenLimit"),
        (
            "/api/v1/budget-rules",
            {"scopeKind": "tenant", "scopeId": "a", "dimension": "units", "limit": 2**63,
             "window": "1d"},
            "limit",
        ),
        ("/api/v1/cost-rates", {"cluster": "c", "gpuHourMicro": 2**70, "currency": "USD"},
         "gpuHourMicro"),
    ],
)  # fmt: skip
async def test_numbers_past_what_clients_and_columns_hold_are_400(
    admin: httpx.AsyncClient, path: str, body: dict[str, Any], param: str
) -> None:
    assert envelope(await admin.post(path, json=body), 400)["param"] == param


async def test_an_inventory_count_past_the_column_is_400_not_500(
    admin: httpx.AsyncClient,
) -> None:
    huge = report()
    huge["nodes"][0]["gpus"][0]["count"] = 2**40
    error = envelope(await admin.put("/api/v1/inventory", json=huge), 400)
    assert error["param"] == "nodes[0].gpus[0].count"
    many = report()
    for gpu in (gpu for node in many["nodes"] for gpu in node["gpus"]):
        gpu["count"] = 2**31 - 1  # each fits; their sum does not
    assert envelope(await admin.put("/api/v1/inventory", json=many), 400)["param"] == "nodes"


async def test_credentials_are_shown_once_stored_hashed_and_revoked(
    admin: httpx.AsyncClient, postgres_url: str
) -> None:
    created = await admin.post("/api/v1/credentials", json={"role": "finance", "label": "books"})
    assert created.status_code == 201, created.text
    issued = created.json()
    secret = issued["secret"]
    assert secret.startswith("fsc_")
    assert issued["prefix"] == secret[:8]
    listed = await admin.get("/api/v1/credentials")
    assert secret not in listed.text
    assert {c["role"] for c in listed.json()["data"]} == {"admin", "finance"}
    with psycopg.connect(postgres_url) as conn:
        dump = conn.execute("SELECT row_to_json(c)::text FROM service_credentials c").fetchall()
    assert not any(secret in row[0] for row in dump)
    async with as_(admin, secret) as finance:
        assert (await finance.get("/api/v1/whoami")).json()["role"] == "finance"
        envelope(
            await finance.post("/api/v1/credentials", json={"role": "admin", "label": "x"}), 403
        )
        assert (await admin.delete(f"/api/v1/credentials/{issued['id']}")).status_code == 200
        envelope(await finance.get("/api/v1/whoami"), 401)


async def test_the_last_admin_credential_cannot_be_revoked(admin: httpx.AsyncClient) -> None:
    """Revoking it would leave nobody able to issue or revoke credentials: 409, until another
    admin credential exists. Two admins revoking each other at once leave one of them."""
    refused = await admin.delete("/api/v1/credentials/cred_bootstrap_admin")
    assert envelope(refused, 409)["code"] == "last_admin"
    assert (await admin.get("/api/v1/whoami")).status_code == 200
    second = await admin.post("/api/v1/credentials", json={"role": "admin", "label": "two"})
    other = second.json()
    async with as_(admin, other["secret"]) as two:
        both = await asyncio.gather(
            admin.delete(f"/api/v1/credentials/{other['id']}"),
            two.delete("/api/v1/credentials/cred_bootstrap_admin"),
        )
        # the second waits for the first, then is refused: 409, or 401 when its own was revoked
        assert sorted(r.status_code for r in both)[0] == 200
        assert sorted(r.status_code for r in both)[1] in (401, 409)
        alive = [c for c in (admin, two) if (await c.get("/api/v1/whoami")).status_code == 200]
        assert len(alive) == 1
        listed = (await alive[0].get("/api/v1/credentials")).json()["data"]
        assert [c["revokedAt"] for c in listed if c["role"] == "admin"].count(None) == 1


async def test_rate_changes_are_audited_with_what_they_set_and_replaced(
    admin: httpx.AsyncClient,
) -> None:
    rate = {"cluster": "c", "gpuHourMicro": 7, "currency": "USD"}
    assert (await admin.post("/api/v1/cost-rates", json=rate)).status_code == 201
    first = {"inputFresh": 1000, "inputCached": 100, "output": 4000}
    assert (await admin.put("/api/v1/model-rates/m", json=first)).status_code == 201
    second = {**first, "output": 5000}
    assert (await admin.put("/api/v1/model-rates/m", json=second)).status_code == 200
    events = (await admin.get("/api/v1/audit-events")).json()["data"]
    replaced, created, cost = (e["detail"] for e in events[:3])
    assert cost["after"]["gpuHourMicro"] == 7
    assert cost["after"]["cluster"] == "c"
    assert created["before"] is None
    assert created["after"]["output"] == 4000
    assert (replaced["before"]["output"], replaced["after"]["output"]) == (4000, 5000)


@pytest.mark.parametrize(
    "body",
    [
        {"role": "operator", "label": "op"},  # which cluster?
        {"role": "finance", "label": "f", "clusterId": "c1"},
        {"role": "tenant", "label": "t"},  # tenants get API keys, not credentials
        {"role": "admin", "label": "a\n"},
    ],
)
async def test_invalid_credentials_are_400(admin: httpx.AsyncClient, body: dict[str, Any]) -> None:
    envelope(await admin.post("/api/v1/credentials", json=body), 400)


async def test_the_audit_trail_names_who_did_what_never_a_secret(
    admin: httpx.AsyncClient,
) -> None:
    secret = await tenant_key(admin, "acme")
    key_id = (await admin.get("/api/v1/keys")).json()["data"][0]["id"]
    await admin.delete(f"/api/v1/keys/{key_id}")
    finance = await issue(admin, "finance")
    async with as_(admin, finance) as books:
        await books.post(
            "/api/v1/cost-rates", json={"cluster": "c", "gpuHourMicro": 1, "currency": "USD"}
        )
        envelope(await books.get("/api/v1/audit-events"), 403)
    trail = await admin.get("/api/v1/audit-events")
    events = trail.json()["data"]
    assert [(e["action"], e["target"]) for e in events[:3]] == [
        ("create", "/api/v1/cost-rates"),
        ("create", "/api/v1/credentials"),
        ("revoke", f"/api/v1/keys/{key_id}"),
    ]
    assert events[0]["actorRole"] == "finance"
    assert events[0]["actor"].startswith("cred_")
    assert events[1]["actor"] == "cred_bootstrap_admin"
    assert secret not in trail.text
    assert finance not in trail.text
    older = await admin.get("/api/v1/audit-events", params={"before": events[0]["id"], "limit": 1})
    assert [e["id"] for e in older.json()["data"]] == [events[1]["id"]]
    envelope(await admin.get("/api/v1/audit-events", params={"limit": 2**64}), 400)


async def test_without_an_admin_token_the_control_plane_refuses_to_start(postgres_url: str) -> None:
    for database_url in (None, postgres_url):
        settings = ApiserverSettings(log=LogSettings(access=False), database_url=database_url)
        with pytest.raises(ConfigError, match="FLEET_ADMIN_TOKEN"):
            async with open_resources(settings):
                pass


async def test_the_bootstrap_token_is_kept_rotated_and_its_revocation_sticks(
    start_apiserver: ApiserverFactory, postgres_url: str, admin_token: str
) -> None:
    await start_apiserver(database_url=postgres_url)  # first start: installs the token
    again = await start_apiserver(database_url=postgres_url, admin_token=None)
    async with httpx.AsyncClient(base_url=again, headers=bearer(admin_token)) as http:
        assert (await http.get("/api/v1/whoami")).json()["id"] == "cred_bootstrap_admin"
    rotated = "rotated-" + admin_token
    url = await start_apiserver(database_url=postgres_url, admin_token=rotated)
    async with httpx.AsyncClient(base_url=url, headers=bearer(rotated)) as http:
        envelope(await http.get("/api/v1/whoami", headers=bearer(admin_token)), 401)
        last = await http.delete("/api/v1/credentials/cred_bootstrap_admin")
        assert envelope(last, 409)["code"] == "last_admin"  # nobody could administer after it
        other = await http.post("/api/v1/credentials", json={"role": "admin", "label": "next"})
        ok = await http.delete("/api/v1/credentials/cred_bootstrap_admin")
        assert ok.status_code == 200
    url = await start_apiserver(database_url=postgres_url, admin_token=rotated)
    async with httpx.AsyncClient(base_url=url) as http:
        envelope(await http.get("/api/v1/whoami", headers=bearer(rotated)), 401)  # it sticks
        assert (await http.get("/api/v1/whoami", headers=bearer(other.json()["secret"]))).json()[
            "role"
        ] == "admin"


def test_the_cli_refuses_to_start_without_an_admin_token_in_one_line() -> None:
    stderr = refused_to_start({})
    assert stderr.startswith("fleet-apiserver: no admin credential: set FLEET_ADMIN_TOKEN")


def test_a_short_admin_token_is_refused_in_one_line() -> None:
    stderr = refused_to_start({"FLEET_ADMIN_TOKEN": "admin"})
    assert "FLEET_ADMIN_TOKEN is shorter than 32 characters" in stderr
