"""API keys over HTTP on a real Postgres: the secret shown once, only its digest stored."""

from __future__ import annotations

import hashlib

import httpx
import psycopg
import pytest

from .conftest import envelope


@pytest.fixture
async def db_api(acme_api: str, admin_headers: dict[str, str]) -> str:
    """``acme_api`` with a second project, ``acme/old``, deactivated."""
    async with httpx.AsyncClient(headers=admin_headers, base_url=acme_api) as http:
        await http.post("/api/v1/projects", json={"tenantId": "acme", "name": "old"})
        await http.patch("/api/v1/projects/acme/old", json={"active": False})
    return acme_api


async def test_the_secret_is_shown_once_and_only_its_digest_kept(
    db_api: str, postgres_url: str, admin_headers: dict[str, str]
) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=db_api) as http:
        issued = await http.post("/api/v1/keys/", json={"projectId": "acme/chat", "label": "ci"})
        assert issued.status_code == 201, issued.text
        key = issued.json()
        secret = key["secret"]
        assert secret.startswith("fk_")
        assert len(secret) > 40
        assert key["prefix"] == secret[:8]
        assert key["id"].startswith("key_")
        assert len(key["id"]) == 16
        assert key["revokedAt"] is None
        assert key["createdAt"].endswith("Z")
        digest = hashlib.sha256(secret.encode()).digest()
        listed = await http.get("/api/v1/keys")
        assert secret not in listed.text
        assert digest.hex() not in listed.text
        (shown,) = listed.json()["data"]
        assert "secret" not in shown
        assert "secretHash" not in shown
        assert shown == {k: v for k, v in key.items() if k != "secret"}
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute("SELECT secret_hash, prefix FROM api_keys").fetchone()
        assert row == (digest, secret[:8])
        text = conn.execute("SELECT row_to_json(api_keys)::text FROM api_keys").fetchone()
        assert text is not None
        assert secret not in text[0]


async def test_revoking_is_recorded_and_unknown_keys_are_404(
    db_api: str, postgres_url: str, admin_headers: dict[str, str]
) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=db_api) as http:
        key = (
            await http.post("/api/v1/keys", json={"projectId": "acme/chat", "label": "a"})
        ).json()
        revoked = await http.delete(f"/api/v1/keys/{key['id']}")
        assert revoked.status_code == 200
        assert revoked.json()["revokedAt"].endswith("Z")
        again = await http.delete(f"/api/v1/keys/{key['id']}/")
        assert again.json()["revokedAt"] == revoked.json()["revokedAt"]  # the first time is kept
        (listed,) = (await http.get("/api/v1/keys", params={"projectId": "acme/chat"})).json()[
            "data"
        ]
        assert listed["revokedAt"] == revoked.json()["revokedAt"]
        assert "secret" not in revoked.json()
        envelope(await http.delete("/api/v1/keys/key_000000000000"), 404)
        envelope(await http.delete("/api/v1/keys/nonsense"), 404)
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT revoked_at IS NOT NULL FROM api_keys").fetchone() == (True,)


async def test_keys_only_for_existing_active_projects(
    db_api: str, admin_headers: dict[str, str]
) -> None:
    async with httpx.AsyncClient(headers=admin_headers, base_url=db_api) as http:
        unknown = await http.post("/api/v1/keys", json={"projectId": "acme/none", "label": "x"})
        assert envelope(unknown, 400)["param"] == "projectId"
        inactive = await http.post("/api/v1/keys", json={"projectId": "acme/old", "label": "x"})
        refused = envelope(inactive, 400)
        assert (refused["param"], refused["code"]) == ("projectId", "project_inactive")
        missing = await http.post("/api/v1/keys", json={"projectId": "acme/chat"})
        assert envelope(missing, 400)["param"] == "label"
        other = await http.get("/api/v1/keys", params={"projectId": "acme/old"})
        assert other.json() == {"object": "list", "data": []}
