"""Pulls through the HTTP API, on the directory store and on SeaweedFS: Ready only when loadable.

Every test runs twice (``object_store`` is parametrized) against a real control plane on Postgres
and the synthetic hub on loopback; waiting is on the pull's own event stream, never on sleeps.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import httpx
from tokenizers import Tokenizer

from fleet_core.control_plane.registry.objects import ObjectStore

from .conftest import HubUnderTest, events, pull_to_end, register


async def test_a_safetensors_repository_becomes_ready_with_its_facts(
    control_plane_client: httpx.AsyncClient, hub: HubUnderTest, objects: ObjectStore
) -> None:
    await register(control_plane_client, "fleet/tiny-safetensors", id="tiny")
    model = await pull_to_end(control_plane_client, "tiny")
    assert model["status"] == "Ready", model["reason"]
    facts = model["facts"]
    assert facts["format"] == "safetensors"
    assert facts["architecture"] == "LlamaForCausalLM"
    assert facts["dtype"] == "F32"
    assert facts["parameters"] == 43 * 16 * 2 + 16 * 16
    assert facts["tokenizer"] is True
    repo = hub.hub.repos["fleet/tiny-safetensors"]
    assert model["revision"] == repo.commit()
    assert {f["path"]: f["sha256"] for f in facts["files"]} == {
        f.name: hashlib.sha256(f.content).hexdigest() for f in repo.files
    }
    assert facts["sizeBytes"] == sum(f.size for f in repo.files)
    assert await objects.keys("models/tiny/") == sorted(f"models/tiny/{f.name}" for f in repo.files)
    progress = (await control_plane_client.get("/api/v1/models/tiny/pull")).json()
    assert progress["filesDone"] == progress["filesTotal"] == 3
    assert progress["bytesDone"] == progress["bytesTotal"] == facts["sizeBytes"]


async def test_the_tokenizer_is_served_and_loads_in_tokenizers(
    control_plane_client: httpx.AsyncClient,
) -> None:
    await register(control_plane_client, "fleet/tiny-safetensors", id="tiny")
    early = await control_plane_client.get("/api/v1/models/tiny/tokenizer")
    assert early.status_code == 404
    assert early.json()["error"]["code"] == "tokenizer_not_found"
    await pull_to_end(control_plane_client, "tiny")
    response = await control_plane_client.get("/api/v1/models/tiny/tokenizer")
    assert response.status_code == 200
    tokenizer = Tokenizer.from_str(response.text)
    assert tokenizer.encode("the fleet model").ids == [1, 3, 4]


async def test_a_gguf_repository_becomes_ready_and_only_llamacpp_fits(
    control_plane_client: httpx.AsyncClient,
) -> None:
    await register(control_plane_client, "fleet/tiny-gguf", id="tiny-gguf")
    model = await pull_to_end(control_plane_client, "tiny-gguf")
    assert model["status"] == "Ready", model["reason"]
    facts = model["facts"]
    assert (facts["format"], facts["architecture"], facts["quantization"]) == (
        "gguf",
        "llama",
        "Q8_0",
    )
    assert facts["parameters"] == 16 * 43 + 2 * 32 * 16
    assert facts["tokenizer"] is False
    fits = await control_plane_client.get(
        "/api/v1/models/tiny-gguf/fit", params={"engine": "llamacpp"}
    )
    assert fits.status_code == 200
    assert fits.json()["fits"] is True
    refused = await control_plane_client.get(
        "/api/v1/models/tiny-gguf/fit", params={"engine": "vllm"}
    )
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["code"] == "engine_mismatch"
    assert "vllm loads safetensors" in error["message"]
    assert "gguf" in error["message"]


async def test_safetensors_for_llamacpp_is_refused_with_the_reason(
    control_plane_client: httpx.AsyncClient,
) -> None:
    await register(control_plane_client, "fleet/tiny-safetensors", id="tiny")
    await pull_to_end(control_plane_client, "tiny")
    refused = await control_plane_client.get(
        "/api/v1/models/tiny/fit", params={"engine": "llamacpp"}
    )
    assert refused.status_code == 409
    assert "llamacpp loads gguf" in refused.json()["error"]["message"]
    unknown = await control_plane_client.get("/api/v1/models/tiny/fit", params={"engine": "tgi"})
    assert unknown.status_code == 400
    assert unknown.json()["error"]["param"] == "engine"


async def assert_failed(
    control_plane_client: httpx.AsyncClient,
    objects: ObjectStore,
    repo: str,
    *reason: str,
    **fields: Any,
) -> dict[str, Any]:
    model_id = repo.split("/")[1]
    await register(control_plane_client, repo, id=model_id, **fields)
    model = await pull_to_end(control_plane_client, model_id)
    assert model["status"] == "Failed"
    for part in reason:
        assert part in model["reason"], model["reason"]
    assert model["facts"] is None
    assert await objects.keys(f"models/{model_id}/") == []
    assert await objects.keys(f".partial/models/{model_id}/") == []
    return model


async def test_a_repository_failing_mid_pull_is_failed_with_the_reason(
    control_plane_client: httpx.AsyncClient, objects: ObjectStore
) -> None:
    await assert_failed(
        control_plane_client, objects, "fleet/fails-mid-pull", "model.safetensors", "connection"
    )


async def test_a_sha256_mismatch_is_failed(
    control_plane_client: httpx.AsyncClient, objects: ObjectStore
) -> None:
    await assert_failed(
        control_plane_client, objects, "fleet/sha-mismatch", "sha256 mismatch", "model.safetensors"
    )


async def test_a_truncated_safetensors_file_is_failed(
    control_plane_client: httpx.AsyncClient, objects: ObjectStore
) -> None:
    await assert_failed(
        control_plane_client, objects, "fleet/truncated", "model.safetensors", "truncated"
    )


async def test_weights_whose_bytes_are_another_format_are_failed(
    control_plane_client: httpx.AsyncClient, objects: ObjectStore
) -> None:
    await assert_failed(
        control_plane_client,
        objects,
        "fleet/gguf-named-safetensors",
        "named as safetensors",
        "gguf",
    )


async def test_a_format_the_files_do_not_contain_is_failed(
    control_plane_client: httpx.AsyncClient, objects: ObjectStore
) -> None:
    await register(control_plane_client, "fleet/tiny-safetensors", id="wants-gguf", format="gguf")
    model = await pull_to_end(control_plane_client, "wants-gguf")
    assert model["status"] == "Failed"
    assert "format gguf was asked for, but the files hold safetensors" in model["reason"]


async def test_a_stalled_hub_is_timed_out_with_the_reason(
    control_plane_client: httpx.AsyncClient, objects: ObjectStore
) -> None:
    started = time.monotonic()
    await assert_failed(
        control_plane_client, objects, "fleet/stalls", "stalled", "model.safetensors"
    )
    assert time.monotonic() - started < 10


async def test_cancel_stops_within_a_second_and_leaves_no_objects(
    control_plane_client: httpx.AsyncClient, objects: ObjectStore
) -> None:
    await register(control_plane_client, "fleet/slow", id="slow")
    assert (await control_plane_client.post("/api/v1/models/slow/pull")).status_code == 202
    async for progress in events(control_plane_client, "slow"):
        if progress["currentFile"] == "model.safetensors" and progress["bytesDone"] > 800:
            break
    started = time.monotonic()
    cancelled = await control_plane_client.delete("/api/v1/models/slow/pull")
    assert time.monotonic() - started < 1.0
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "Cancelled"
    model = (await control_plane_client.get("/api/v1/models/slow")).json()
    assert (model["status"], model["reason"]) == ("Cancelled", "cancelled by a client")
    assert await objects.keys("models/slow/") == []
    assert await objects.keys(".partial/models/slow/") == []


async def test_pulling_the_same_model_twice_is_one_pull(
    control_plane_client: httpx.AsyncClient, hub: HubUnderTest
) -> None:
    await register(control_plane_client, "fleet/tiny-safetensors", id="tiny")
    first, second = await asyncio.gather(
        control_plane_client.post("/api/v1/models/tiny/pull"),
        control_plane_client.post("/api/v1/models/tiny/pull"),
    )
    assert first.status_code == second.status_code == 202
    assert {first.json()["status"], second.json()["status"]} <= {"Pulling", "Ready"}
    async for _ in events(control_plane_client, "tiny"):
        pass
    model = (await control_plane_client.get("/api/v1/models/tiny")).json()
    assert model["status"] == "Ready"
    fetched = [r.file for r in hub.hub.requests if r.repo == "fleet/tiny-safetensors"]
    assert sorted(fetched) == ["config.json", "model.safetensors", "tokenizer.json"]
    again = await control_plane_client.post(
        "/api/v1/models/tiny/pull"
    )  # Ready: reported, not pulled again
    assert again.json()["status"] == "Ready"
    assert len(hub.hub.requests) == 3


async def test_different_models_pull_concurrently(control_plane_client: httpx.AsyncClient) -> None:
    await register(control_plane_client, "fleet/tiny-safetensors", id="a")
    await register(control_plane_client, "fleet/tiny-gguf", id="b")
    models = await asyncio.gather(
        pull_to_end(control_plane_client, "a"), pull_to_end(control_plane_client, "b")
    )
    assert [m["status"] for m in models] == ["Ready", "Ready"]
