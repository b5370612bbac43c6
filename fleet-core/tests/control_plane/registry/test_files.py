"""A Ready model's files over HTTP, as the operator's init container downloads them.

Every file named in ``facts.files`` is served, streamed from the object store, with its size and
sha256 from the facts in the headers; no other name is, so no path reaches another store key. Each
test runs on the directory store and on SeaweedFS, against a real control plane and the synthetic
hub on loopback.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any
from urllib.parse import unquote

import httpx
import pytest

from fleet_contract import decode_weights
from fleet_core.control_plane.registry.objects import ObjectStore
from fleet_core.control_plane.registry.settings import RegistrySettings
from fleet_core.devtools.hub import files
from fleet_core.devtools.hub.repos import HubFile, Repo

from .conftest import ControlPlaneFactory, HubUnderTest, pull_to_end, register

directory_only = pytest.mark.parametrize("object_store", ["directory"], indirect=True)


async def ready(
    control_plane_client: httpx.AsyncClient, repo: str, model_id: str
) -> list[dict[str, Any]]:
    """Registers and pulls ``repo`` as ``model_id``; its ``facts.files``."""
    await register(control_plane_client, repo, id=model_id)
    model = await pull_to_end(control_plane_client, model_id)
    assert model["status"] == "Ready", model["reason"]
    listed: list[dict[str, Any]] = model["facts"]["files"]
    return listed


async def download(
    control_plane_client: httpx.AsyncClient, model_id: str, name: str
) -> tuple[httpx.Response, str]:
    """The response (headers) and the sha256 of its body, hashed as it streams in."""
    digest = hashlib.sha256()
    async with control_plane_client.stream(
        "GET", f"/api/v1/models/{model_id}/files/{name}"
    ) as response:
        async for chunk in response.aiter_raw():
            digest.update(chunk)
    return response, digest.hexdigest()


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    return error


@pytest.mark.parametrize(
    ("repo", "names"),
    [
        ("fleet/tiny-safetensors", {"config.json", "tokenizer.json", "model.safetensors"}),
        ("fleet/tiny-gguf", {"README.md", "tiny-q8_0.gguf"}),
    ],
)
async def test_every_file_of_a_ready_model_downloads_with_its_hash(
    control_plane_client: httpx.AsyncClient, hub: HubUnderTest, repo: str, names: set[str]
) -> None:
    listed = await ready(control_plane_client, repo, "m")
    assert {f["path"] for f in listed} == names
    for item in listed:
        response, sha256 = await download(control_plane_client, "m", item["path"])
        assert response.status_code == 200
        assert sha256 == item["sha256"]
        assert response.headers["content-type"] == "application/octet-stream"
        assert response.headers["content-length"] == str(item["size"])
        assert response.headers["etag"] == f'"{item["sha256"]}"'
        assert response.headers["x-fleet-sha256"] == item["sha256"]
        assert hub.hub.repos[repo].file(item["path"]) is not None


@directory_only
async def test_a_file_in_a_subfolder_is_served_by_its_listed_name(
    control_plane_client: httpx.AsyncClient, hub: HubUnderTest
) -> None:
    tiny = hub.hub.repos["fleet/tiny-safetensors"]
    extra = HubFile("extra/generation_config.json", files.config_json(), lfs=False)
    hub.hub.repos["fleet/nested"] = Repo("fleet/nested", (*tiny.files, extra))
    listed = await ready(control_plane_client, "fleet/nested", "nested")
    assert "extra/generation_config.json" in {f["path"] for f in listed}
    response, sha256 = await download(
        control_plane_client, "nested", "extra/generation_config.json"
    )
    assert response.status_code == 200
    assert sha256 == hashlib.sha256(extra.content).hexdigest()
    missing = await control_plane_client.get("/api/v1/models/nested/files/extra")
    assert_error(missing, 404, "file_not_found")


@pytest.mark.parametrize(
    "name",
    [
        "nope.bin",
        "..%2Fother%2Ftokenizer.json",  # encoded: httpx would resolve a plain "../" itself
        "..%2F..%2Fmodels%2Fother%2Ftokenizer.json",
        "models%2Fother%2Ftokenizer.json",  # the other model's store key
        "%2Fetc%2Fpasswd",
        "CONFIG.JSON",
    ],
)
async def test_a_name_not_in_the_facts_is_404_whatever_the_store_holds(
    control_plane_client: httpx.AsyncClient, name: str
) -> None:
    await ready(control_plane_client, "fleet/tiny-gguf", "m")
    await ready(
        control_plane_client, "fleet/tiny-safetensors", "other"
    )  # its tokenizer.json is in the store
    response = await control_plane_client.get(f"/api/v1/models/m/files/{name}")
    error = assert_error(response, 404, "file_not_found")
    assert error["param"] == "name"
    assert "'m'" in error["message"]
    assert "GET /api/v1/models/m" in error["message"]
    assert repr(unquote(name)) in error["message"]


@directory_only
async def test_an_unknown_model_is_404_and_one_not_ready_is_409(
    control_plane_client: httpx.AsyncClient,
) -> None:
    unknown = await control_plane_client.get("/api/v1/models/nope/files/config.json")
    assert_error(unknown, 404, "model_not_found")
    await register(control_plane_client, "fleet/tiny-safetensors", id="later")
    early = await control_plane_client.get("/api/v1/models/later/files/config.json")
    error = assert_error(early, 409, "model_not_ready")
    assert error["message"] == (
        "model 'later' is Registered; its files are served once it is Ready"
    )
    assert (
        await control_plane_client.head("/api/v1/models/later/files/config.json")
    ).status_code == 409


async def test_head_answers_the_headers_without_the_body(
    control_plane_client: httpx.AsyncClient,
) -> None:
    listed = await ready(control_plane_client, "fleet/tiny-safetensors", "m")
    weights = next(f for f in listed if f["path"] == "model.safetensors")
    response = await control_plane_client.head("/api/v1/models/m/files/model.safetensors")
    assert response.status_code == 200
    assert response.content == b""
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.headers["content-length"] == str(weights["size"])
    assert response.headers["etag"] == f'"{weights["sha256"]}"'
    assert response.headers["x-fleet-sha256"] == weights["sha256"]
    missing = await control_plane_client.head("/api/v1/models/m/files/nope.bin")
    assert missing.status_code == 404


@directory_only
async def test_the_weights_document_is_the_contract_s_view_of_the_model(
    control_plane_client: httpx.AsyncClient, hub: HubUnderTest
) -> None:
    await register(control_plane_client, "fleet/tiny-gguf", id="g")
    before = decode_weights((await control_plane_client.get("/api/v1/models/g/weights")).content)
    assert (before.model_id, before.status, before.files) == ("g", "Registered", ())
    assert not before.ready
    pulled = await pull_to_end(control_plane_client, "g")
    assert pulled["status"] == "Ready", pulled["reason"]
    listed = pulled["facts"]["files"]
    after = decode_weights((await control_plane_client.get("/api/v1/models/g/weights")).content)
    assert after.ready
    assert after.format == "gguf"
    assert {(f.path, f.size, f.sha256) for f in after.files} == {
        (f["path"], f["size"], f["sha256"]) for f in listed
    }
    assert_error(
        await control_plane_client.get("/api/v1/models/nope/weights"), 404, "model_not_found"
    )


async def test_byte_ranges_resume_a_download(
    control_plane_client: httpx.AsyncClient, hub: HubUnderTest
) -> None:
    listed = await ready(control_plane_client, "fleet/tiny-gguf", "m")
    (gguf,) = [f for f in listed if f["path"].endswith(".gguf")]
    url, size = f"/api/v1/models/m/files/{gguf['path']}", gguf["size"]
    whole = (await control_plane_client.get(url)).content
    assert hashlib.sha256(whole).hexdigest() == gguf["sha256"]

    tail = await control_plane_client.get(url, headers={"Range": "bytes=1000-"})
    assert tail.status_code == 206
    assert tail.content == whole[1000:]
    assert tail.headers["content-range"] == f"bytes 1000-{size - 1}/{size}"
    assert tail.headers["content-length"] == str(size - 1000)
    assert tail.headers["accept-ranges"] == "bytes"
    middle = await control_plane_client.get(url, headers={"Range": "bytes=10-19"})
    assert (middle.status_code, middle.content) == (206, whole[10:20])
    last = await control_plane_client.get(url, headers={"Range": "bytes=-5"})
    assert (last.status_code, last.content) == (206, whole[-5:])
    head = await control_plane_client.head(url, headers={"Range": "bytes=1000-"})
    assert (head.status_code, head.headers["content-length"]) == (206, str(size - 1000))

    past = await control_plane_client.get(url, headers={"Range": f"bytes={size}-"})
    assert_error(past, 416, "range_not_satisfiable")
    assert past.headers["content-range"] == f"bytes */{size}"
    # Ignored, as RFC 9110 allows: several ranges, another unit, a stale If-Range.
    for headers in (
        {"Range": "bytes=0-1,5-6"},
        {"Range": "items=0-1"},
        {"Range": "bytes=5-1"},
        {"Range": "bytes=10-", "If-Range": '"0000"'},
    ):
        full = await control_plane_client.get(url, headers=headers)
        assert (full.status_code, full.content) == (200, whole), headers
    same = await control_plane_client.get(
        url, headers={"Range": "bytes=10-", "If-Range": f'"{gguf["sha256"]}"'}
    )
    assert (same.status_code, same.content) == (206, whole[10:])


s3_only = pytest.mark.parametrize("object_store", ["s3"], indirect=True)


@s3_only
async def test_with_a_download_endpoint_the_store_serves_the_file_through_a_signed_url(
    start_control_plane: ControlPlaneFactory,
    object_store: tuple[RegistrySettings, ObjectStore],
    hub: HubUnderTest,
) -> None:
    s3 = object_store[0].s3
    assert s3 is not None
    plane = await start_control_plane(s3=replace(s3, download_endpoint=s3.endpoint))
    async with httpx.AsyncClient(
        base_url=plane.url, headers=plane.headers, timeout=30
    ) as control_plane_client:
        listed = await ready(control_plane_client, "fleet/tiny-gguf", "m")
        (gguf,) = [f for f in listed if f["path"].endswith(".gguf")]
        url = f"/api/v1/models/m/files/{gguf['path']}"
        redirected = await control_plane_client.get(url)
        assert redirected.status_code == 307
        assert redirected.headers["x-fleet-sha256"] == gguf["sha256"]
        location = redirected.headers["location"]
        assert location.startswith(f"http://{s3.endpoint}/")
        assert "X-Amz-Signature=" in location
        assert (
            await control_plane_client.head(url)
        ).status_code == 200  # HEAD answers from the facts
        async with httpx.AsyncClient(timeout=30) as outside:  # as a pod: no credentials
            whole = await outside.get(location)
            assert hashlib.sha256(whole.content).hexdigest() == gguf["sha256"]
            tail = await outside.get(location, headers={"Range": "bytes=100-"})
            assert (tail.status_code, tail.content) == (206, whole.content[100:])
            unsigned = await outside.get(location.split("?", 1)[0])
            assert unsigned.status_code == 403
