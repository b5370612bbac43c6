"""GET /api/v1/openapi.json describes exactly what is served, and the API holds up to it.

The schemathesis run generates requests for every operation from the document itself (valid and
invalid bodies, odd path and query values) against a running control plane on a real database,
and asserts that none is answered 5xx.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import hypothesis
import requests
import schemathesis
from schemathesis.checks import not_a_server_error

from .conftest import ApiserverFactory

INVENTORY = {
    ("PUT", "/api/v1/inventory"),
    ("GET", "/api/v1/inventory"),
    ("GET", "/api/v1/clusters/{cluster_id}"),
    ("DELETE", "/api/v1/clusters/{cluster_id}"),
    ("PUT", "/api/v1/clusters/{cluster_id}/binding"),
    ("GET", "/api/v1/clusters/{cluster_id}/binding"),
    ("DELETE", "/api/v1/clusters/{cluster_id}/binding"),
    ("GET", "/api/v1/endpoints"),
    ("GET", "/api/v1/openapi.json"),
    ("GET", "/api/v1/whoami"),
    ("POST", "/api/v1/credentials"),
    ("GET", "/api/v1/credentials"),
    ("DELETE", "/api/v1/credentials/{credential_id}"),
    ("GET", "/api/v1/audit-events"),
}
DATABASE = {
    *(
        (method, path)
        for collection, one in [("tenants", "tenant_id"), ("projects", "project_id")]
        for method, path in [
            ("POST", f"/api/v1/{collection}"),
            ("GET", f"/api/v1/{collection}"),
            ("GET", f"/api/v1/{collection}/{{{one}}}"),
            ("PATCH", f"/api/v1/{collection}/{{{one}}}"),
            ("DELETE", f"/api/v1/{collection}/{{{one}}}"),
        ]
    ),
    ("POST", "/api/v1/keys"),
    ("GET", "/api/v1/keys"),
    ("DELETE", "/api/v1/keys/{key_id}"),
    ("POST", "/api/v1/budget-rules"),
    ("GET", "/api/v1/budget-rules"),
    ("GET", "/api/v1/budget-rules/{rule_id}"),
    ("PATCH", "/api/v1/budget-rules/{rule_id}"),
    ("DELETE", "/api/v1/budget-rules/{rule_id}"),
    ("GET", "/api/v1/usage"),
    ("GET", "/api/v1/usage-agreement"),
    ("GET", "/api/v1/model-rates"),
    ("GET", "/api/v1/model-rates/{model}"),
    ("PUT", "/api/v1/model-rates/{model}"),
    ("DELETE", "/api/v1/model-rates/{model}"),
    ("POST", "/api/v1/cost-rates"),
    ("GET", "/api/v1/cost-rates"),
    ("GET", "/api/v1/cost-periods"),
    ("GET", "/api/v1/cost-periods/{period}"),
    ("PUT", "/api/v1/cost-periods/{period}"),
    # the model registry (fleet-core/tests/control_plane/registry)
    ("POST", "/api/v1/models"),
    ("GET", "/api/v1/models"),
    *((m, "/api/v1/models/{model_id}") for m in ("GET", "PATCH", "DELETE")),
    ("GET", "/api/v1/models/{model_id}/tokenizer"),
    ("GET", "/api/v1/models/{model_id}/weights"),
    ("GET", "/api/v1/models/{model_id}/files/{name}"),
    ("GET", "/api/v1/models/{model_id}/fit"),
    *((m, "/api/v1/models/{model_id}/pull") for m in ("POST", "GET", "DELETE")),
    ("GET", "/api/v1/models/{model_id}/pull/events"),
    ("POST", "/api/v1/models/{model_id}/import"),
    ("PUT", "/api/v1/models/{model_id}/import/{name}"),
}


def operations(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {(m.upper(), path) for path, ops in document["paths"].items() for m in ops}


async def fetch_document(control_plane_url: str) -> dict[str, Any]:
    """The document, read without a credential: it is the one public /api/v1 route."""
    async with httpx.AsyncClient() as http:
        response = await http.get(f"{control_plane_url}/api/v1/openapi.json/")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    document: dict[str, Any] = response.json()
    assert document["openapi"].startswith("3.1")
    return document


async def test_without_a_database_the_document_describes_what_is_served(
    start_apiserver: ApiserverFactory, admin_headers: dict[str, str]
) -> None:
    control_plane_url = await start_apiserver()
    document = await fetch_document(control_plane_url)
    assert operations(document) == INVENTORY
    async with httpx.AsyncClient() as http:
        anonymous = await http.get(f"{control_plane_url}/api/v1/tenants")
        tenants = await http.get(f"{control_plane_url}/api/v1/tenants", headers=admin_headers)
    assert anonymous.status_code == 401
    assert tenants.status_code == 503
    assert tenants.json()["error"]["code"] == "database_required"


async def test_with_a_database_every_route_is_described(
    start_apiserver: ApiserverFactory, postgres_url: str
) -> None:
    document = await fetch_document(await start_apiserver(database_url=postgres_url))
    assert operations(document) == INVENTORY | DATABASE
    schemas = document["components"]["schemas"]
    assert {"InventoryReport", "TenantCreate", "IssuedKey", "RuleCreate"} <= set(schemas)
    post_key = document["paths"]["/api/v1/keys"]["post"]
    assert set(post_key["responses"]) == {"201", "400", "401", "403", "415"}
    assert document["security"] == [{"bearer": []}]
    assert document["paths"]["/api/v1/openapi.json"]["get"]["security"] == []
    listing = document["paths"]["/api/v1/tenants"]["get"]["responses"]["200"]
    assert listing["content"]["application/json"]["schema"]["properties"]["object"] == {
        "const": "list"
    }


async def test_no_generated_request_is_answered_5xx(
    start_apiserver: ApiserverFactory, postgres_url: str, admin_headers: dict[str, str]
) -> None:
    control_plane_url = await start_apiserver(database_url=postgres_url)
    async with httpx.AsyncClient(
        headers=admin_headers, base_url=control_plane_url
    ) as http:  # some rows
        await http.post("/api/v1/tenants", json={"id": "acme", "name": "Acme", "tokenLimit": 9})
        await http.post("/api/v1/projects", json={"tenantId": "acme", "name": "chat"})
    # schemathesis calls over requests (blocking): off the loop that serves the apiserver
    exercised = await asyncio.to_thread(exercise_every_operation, control_plane_url, admin_headers)
    # schemathesis leaves out the document it was loaded from
    assert exercised == INVENTORY - {("GET", "/api/v1/openapi.json")} | DATABASE


def exercise_every_operation(
    control_plane_url: str, headers: dict[str, str]
) -> set[tuple[str, str]]:
    schema = schemathesis.openapi.from_url(f"{control_plane_url}/api/v1/openapi.json")
    exercised = set()
    with requests.Session() as session:  # closed here, not left to the garbage collector
        for result in schema.get_all_operations():
            operation = result.ok()
            exercise(operation, control_plane_url, session, headers)
            exercised.add((operation.method.upper(), operation.path))
    return exercised


def exercise(
    operation: schemathesis.APIOperation,
    control_plane_url: str,
    session: requests.Session,
    headers: dict[str, str],
) -> None:
    """Generated requests as the admin (who may call every operation), so they reach the
    handlers; the role x route matrix (test_roles.py) covers everyone else."""

    @hypothesis.settings(
        max_examples=20,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(hypothesis.HealthCheck),
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    )
    @hypothesis.given(case=operation.as_strategy())
    def run(case: schemathesis.Case) -> None:
        auth = {"Authorization": headers["Authorization"]}
        response = case.call(base_url=control_plane_url, session=session, timeout=10, headers=auth)
        case.validate_response(response, checks=[not_a_server_error])

    run()
