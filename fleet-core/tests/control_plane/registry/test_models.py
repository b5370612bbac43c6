"""The models API: registration, validation as 4xx naming the field, rates, delete rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from fleet_core.control_plane.registry.objects import ObjectStore

from .conftest import HubUnderTest, pull_to_end, register

CONTRACT_FIXTURES = Path(__file__).parents[4] / "contract" / "tests" / "fixtures"
directory_only = pytest.mark.parametrize("object_store", ["directory"], indirect=True)


@directory_only
async def test_a_model_is_registered_listed_and_read(
    control_plane_client: httpx.AsyncClient,
) -> None:
    model = await register(control_plane_client, "Fleet/Tiny-Safetensors")
    assert model["id"] == "tiny-safetensors"  # from the repository's name
    assert (model["status"], model["reason"], model["facts"]) == ("Registered", "", None)
    assert model["source"] == {
        "huggingface": {"repo": "Fleet/Tiny-Safetensors", "revision": "main"}
    }
    by_uri = await control_plane_client.post(
        "/api/v1/models", json={"id": "pinned", "source": {"uri": "hf://fleet/tiny-gguf@main"}}
    )
    assert by_uri.status_code == 201
    listed = (await control_plane_client.get("/api/v1/models/")).json()
    assert listed["object"] == "list"
    assert [m["id"] for m in listed["data"]] == ["tiny-safetensors", "pinned"]
    progress = (await control_plane_client.get("/api/v1/models/pinned/pull")).json()
    assert (progress["status"], progress["filesTotal"], progress["etaSeconds"]) == (
        "Registered",
        0,
        None,
    )


@directory_only
@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"source": {}}, "source"),
        ({"source": {"huggingface": {"repo": "a/b"}, "uri": "hf://a/b"}}, "source"),
        ({"source": {"uri": "s3://bucket/model"}}, "source.uri"),
        ({"source": {"huggingface": {"repo": "../etc"}}}, "source.huggingface.repo"),
        ({"id": "Not Valid", "source": {"uri": "hf://a/b"}}, "id"),
        ({"source": {"uri": "hf://a/b"}, "format": "pickle"}, "format"),
        ({"id": "x"}, "source"),
    ],
)
async def test_a_bad_registration_is_400_naming_the_field(
    control_plane_client: httpx.AsyncClient, body: dict[str, Any], param: str
) -> None:
    response = await control_plane_client.post("/api/v1/models", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


@directory_only
async def test_duplicates_and_unknown_models(control_plane_client: httpx.AsyncClient) -> None:
    await register(control_plane_client, "fleet/tiny-gguf", id="dup")
    again = await control_plane_client.post(
        "/api/v1/models", json={"id": "dup", "source": {"uri": "hf://a/b"}}
    )
    assert again.status_code == 409
    for method, path in [
        ("GET", "/api/v1/models/nope"),
        ("DELETE", "/api/v1/models/nope"),
        ("POST", "/api/v1/models/nope/pull"),
        ("GET", "/api/v1/models/nope/pull"),
        ("GET", "/api/v1/models/nope/pull/events"),
        ("DELETE", "/api/v1/models/nope/pull"),
        ("GET", "/api/v1/models/nope/tokenizer"),
    ]:
        response = await control_plane_client.request(method, path)
        assert response.status_code == 404, (method, path)
        assert response.json()["error"]["code"] == "model_not_found"


@directory_only
async def test_rates_are_kept_in_model_rates(
    control_plane_client: httpx.AsyncClient, postgres_url: str
) -> None:
    await register(control_plane_client, "fleet/tiny-gguf", id="rated")
    rates = {"inputFresh": 1.5, "inputCached": 0.001, "output": 6}
    patched = await control_plane_client.patch("/api/v1/models/rated", json={"rates": rates})
    assert patched.status_code == 200, patched.text
    assert patched.json()["rates"] == {"inputFresh": 1.5, "inputCached": 0.001, "output": 6.0}
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute(
            "SELECT input_fresh_micro_per_1k, input_cached_micro_per_1k, output_micro_per_1k"
            " FROM model_rates WHERE model = 'rated'"
        ).fetchone()
    assert row == (1500, 1, 6000)  # integer micro-units per 1,000 tokens
    finer = await control_plane_client.patch(
        "/api/v1/models/rated", json={"rates": {**rates, "output": 0.0005}}
    )
    assert finer.status_code == 400
    assert finer.json()["error"]["param"] == "rates.output"
    negative = await control_plane_client.patch(
        "/api/v1/models/rated", json={"rates": {**rates, "output": -1}}
    )
    assert negative.status_code == 400
    assert negative.json()["error"]["param"] == "rates.output"


async def bind(http: httpx.AsyncClient, models: tuple[str, ...]) -> None:
    """The admin binds the fixture's cluster to ``models`` before it reports (ADR 0020)."""
    body = {"servedModels": list(models), "endpoints": ["10.42.0.0/16"]}
    assert (await http.put("/api/v1/clusters/gpu-east/binding", json=body)).status_code == 200


@directory_only
async def test_delete_is_refused_while_a_fleetmodel_uses_the_model(
    control_plane_client: httpx.AsyncClient, objects: ObjectStore
) -> None:
    await register(control_plane_client, "fleet/tiny-gguf", id="gemma-270m")
    await pull_to_end(control_plane_client, "gemma-270m")
    report = json.loads((CONTRACT_FIXTURES / "v1-full.json").read_text())
    await bind(
        control_plane_client, ("Qwen/Qwen2.5-7B-Instruct", "gemma-270m", "llama-405b", "tiny")
    )
    assert (await control_plane_client.put("/api/v1/inventory", json=report)).status_code == 200
    refused = await control_plane_client.delete("/api/v1/models/gemma-270m")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "model_in_use"
    assert "gpu-east/" in refused.json()["error"]["message"]
    report["deployments"] = []
    report["observedAt"] = "2026-09-14T08:35:00Z"  # newer than the fixture's
    assert (await control_plane_client.put("/api/v1/inventory", json=report)).status_code == 200
    deleted = await control_plane_client.delete("/api/v1/models/gemma-270m")
    assert deleted.status_code == 200
    assert (await control_plane_client.get("/api/v1/models/gemma-270m")).status_code == 404
    assert await objects.keys("models/gemma-270m/") == []


async def test_deleting_a_model_mid_pull_cancels_it_and_removes_its_objects(
    control_plane_client: httpx.AsyncClient, hub: HubUnderTest, objects: ObjectStore
) -> None:
    await register(control_plane_client, "fleet/slow", id="slow")
    assert (await control_plane_client.post("/api/v1/models/slow/pull")).status_code == 202
    await hub.hub.requested.wait()
    deleted = await control_plane_client.delete("/api/v1/models/slow")
    assert deleted.status_code == 200
    assert (await control_plane_client.get("/api/v1/models/slow")).status_code == 404
    assert await objects.keys("models/slow/") == []
    assert await objects.keys(".partial/models/slow/") == []
    again = await control_plane_client.post(
        "/api/v1/models", json={"id": "slow", "source": {"uri": "hf://a/b"}}
    )
    assert again.status_code == 201  # the id is free again


@directory_only
async def test_delete_is_refused_while_a_fleetmodel_names_the_model_as_its_source(
    control_plane_client: httpx.AsyncClient,
) -> None:
    await register(control_plane_client, "fleet/tiny-gguf", id="tiny")
    report = json.loads((CONTRACT_FIXTURES / "v1-full.json").read_text())
    deployment = {**report["deployments"][0], "name": "chat", "servedModelName": "chat"}
    report["deployments"] = [deployment]
    await bind(control_plane_client, ("chat",))
    assert (await control_plane_client.put("/api/v1/inventory", json=report)).status_code == 200
    assert (
        await control_plane_client.delete("/api/v1/models/tiny")
    ).status_code == 200  # "chat" is not it
    await register(control_plane_client, "fleet/tiny-gguf", id="tiny")
    report["deployments"] = [deployment | {"registryModel": "tiny"}]
    report["observedAt"] = "2026-09-14T08:35:00Z"  # newer than the fixture's
    assert (await control_plane_client.put("/api/v1/inventory", json=report)).status_code == 200
    refused = await control_plane_client.delete("/api/v1/models/tiny")
    assert refused.status_code == 409
    assert "/chat" in refused.json()["error"]["message"]
