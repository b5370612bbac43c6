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
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance
from schemathesis.core.failures import FailureGroup

from .conftest import ApiserverFactory, tenant_key

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


async def test_what_schemathesis_found_is_served_as_documented(
    start_apiserver: ApiserverFactory, postgres_url: str, admin_headers: dict[str, str]
) -> None:
    """A 400 for limit=501 is in the document; an empty limit= is refused like any non-integer;
    a 405 names every method of the path in Allow, spread over several routes as they are."""
    url = await start_apiserver(database_url=postgres_url)
    document = await fetch_document(url)
    assert "400" in document["paths"]["/api/v1/credentials"]["get"]["responses"]
    async with httpx.AsyncClient(headers=admin_headers, base_url=url) as http:
        assert (await http.get("/api/v1/credentials", params={"limit": "501"})).status_code == 400
        empty = await http.get("/api/v1/credentials?limit=")
        assert empty.status_code == 400
        assert empty.json()["error"]["param"] == "limit"
        refused = await http.post("/api/v1/model-rates/m", json={})
        assert refused.status_code == 405
        assert refused.headers["allow"] == "DELETE, GET, HEAD, PUT"


SEED = 20261207
"""Schemathesis runs derandomized from this seed: the same requests on every run."""
EXAMPLES = 6
"""Generated requests per operation, role and mode: about a minute on two cores, both roles."""
EXCLUDED = [positive_data_acceptance]
"""Every check but one: the document cannot say which schema-valid requests are still refused
with 400 for what JSON Schema does not express (a cursor must be one the server issued; a
project must exist; ``to`` after ``from``; an instant from 1970 to 8999; ``1.0`` for an
integer), so "valid data is accepted" is not a property of this API."""


async def test_every_check_holds_for_the_admin_and_a_tenant(
    start_apiserver: ApiserverFactory, postgres_url: str, admin_headers: dict[str, str]
) -> None:
    """Every schemathesis check (`EXCLUDED` says which not): status codes and headers the
    document names, ``Allow`` on a 405, bodies that match it, invalid input refused, never a
    5xx; for the admin (who may call everything, so requests reach the handlers) and a
    tenant's key (for which most operations are a documented 403)."""
    control_plane_url = await start_apiserver(database_url=postgres_url)
    async with httpx.AsyncClient(headers=admin_headers, base_url=control_plane_url) as http:
        secret = await tenant_key(http, "acme")
    callers = {"admin": admin_headers["Authorization"], "tenant": f"Bearer {secret}"}
    # schemathesis calls over requests (blocking): off the loop that serves the apiserver
    exercised, failures = await asyncio.to_thread(
        exercise_every_operation, control_plane_url, callers
    )
    assert failures == [], "\n".join(failures)
    # schemathesis leaves out the document it was loaded from
    assert exercised == INVENTORY - {("GET", "/api/v1/openapi.json")} | DATABASE


def exercise_every_operation(
    control_plane_url: str, callers: dict[str, str]
) -> tuple[set[tuple[str, str]], list[str]]:
    schema = schemathesis.openapi.from_url(f"{control_plane_url}/api/v1/openapi.json")
    exercised: set[tuple[str, str]] = set()
    failures: list[str] = []
    with requests.Session() as session:  # closed here, not left to the garbage collector
        for result in schema.get_all_operations():
            operation = result.ok()
            for authorization in callers.values():
                for mode in GenerationMode:
                    failures += exercise(operation, control_plane_url, session, authorization, mode)
            exercised.add((operation.method.upper(), operation.path))
    return exercised, failures


def exercise(
    operation: schemathesis.APIOperation,
    control_plane_url: str,
    session: requests.Session,
    authorization: str,
    mode: GenerationMode,
) -> list[str]:
    found: list[str] = []

    @hypothesis.seed(SEED)
    @hypothesis.settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(hypothesis.HealthCheck),
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    )
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case) -> None:
        auth = {"Authorization": authorization}
        response = case.call(base_url=control_plane_url, session=session, timeout=10, headers=auth)
        try:
            case.validate_response(
                response,
                excluded_checks=EXCLUDED,
                headers=auth,
                transport_kwargs={"base_url": control_plane_url, "headers": auth},
            )
        except (AssertionError, FailureGroup) as exc:
            failed = getattr(exc, "exceptions", [exc])
            titles = sorted({getattr(f, "title", type(f).__name__) for f in failed})
            found.append(
                f"{mode.value} {operation.method.upper()} {operation.path}: {titles}"
                f" {response.status_code} {response.text[:150]}"
            )

    run()
    return found
