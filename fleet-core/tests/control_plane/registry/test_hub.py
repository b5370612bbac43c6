"""The synthetic hub speaks the hub API the client uses, and its files are real formats."""

from __future__ import annotations

import hashlib
import json
import logging

import httpx
import pytest
from tokenizers import Tokenizer

from fleet_core.devtools.hub import files

from .conftest import ControlPlaneFactory, HubUnderTest, pull_to_end, register

directory_only = pytest.mark.parametrize("object_store", ["directory"], indirect=True)


async def test_model_info_lists_files_with_sizes_and_hashes(hub: HubUnderTest) -> None:
    async with httpx.AsyncClient(base_url=hub.url) as http:
        info = (await http.get("/api/models/fleet/tiny-safetensors/revision/main")).json()
        pinned = await http.get(f"/api/models/fleet/tiny-safetensors/revision/{info['sha']}")
        missing = await http.get("/api/models/fleet/tiny-safetensors/revision/nope")
    assert pinned.json() == info
    assert missing.status_code == 404
    siblings = {s["rfilename"]: s for s in info["siblings"]}
    weights = siblings["model.safetensors"]
    repo = hub.hub.repos["fleet/tiny-safetensors"]
    content = repo.file("model.safetensors")
    assert content is not None
    assert weights["lfs"]["sha256"] == hashlib.sha256(content.content).hexdigest()
    assert weights["size"] == content.size
    config = siblings["config.json"]
    assert "lfs" not in config
    raw = files.config_json()
    assert config["blobId"] == hashlib.sha1(b"blob %d\0" % len(raw) + raw).hexdigest()


async def test_resolve_serves_ranges_with_etag_and_commit(hub: HubUnderTest) -> None:
    repo = hub.hub.repos["fleet/tiny-gguf"]
    content = files.gguf_bytes()
    url = "/fleet/tiny-gguf/resolve/main/tiny-q8_0.gguf"
    async with httpx.AsyncClient(base_url=hub.url) as http:
        whole = await http.get(url)
        part = await http.get(url, headers={"Range": "bytes=100-199"})
        rest = await http.get(url, headers={"Range": "bytes=4000-"})
        beyond = await http.get(url, headers={"Range": f"bytes={len(content)}-"})
        head = await http.head(url)
    assert whole.content == content
    assert whole.headers["etag"] == f'"{hashlib.sha256(content).hexdigest()}"'
    assert whole.headers["x-repo-commit"] == repo.commit()
    assert (part.status_code, part.content) == (206, content[100:200])
    assert part.headers["content-range"] == f"bytes 100-199/{len(content)}"
    assert (rest.status_code, rest.content) == (206, content[4000:])
    assert beyond.status_code == 416
    assert head.headers["content-length"] == str(len(content))
    assert head.content == b""


def test_generated_files_are_their_formats() -> None:
    tokenizer = Tokenizer.from_str(files.tokenizer_json().decode())
    assert tokenizer.encode("fleet token zebra").ids == [3, 5, 0]
    assert json.loads(files.config_json())["architectures"] == ["LlamaForCausalLM"]
    assert files.gguf_bytes()[:4] == b"GGUF"


@directory_only
async def test_the_token_is_sent_and_never_logged(
    control_plane_client: httpx.AsyncClient, hub: HubUnderTest, caplog: pytest.LogCaptureFixture
) -> None:
    hub.hub.token = "hf_sekrit_token_value"
    caplog.set_level(logging.DEBUG)
    await register(control_plane_client, "fleet/tiny-gguf", id="anonymous")
    refused = await pull_to_end(control_plane_client, "anonymous")
    assert refused["status"] == "Failed"
    assert "refused access" in refused["reason"]
    assert "FLEET_HF_TOKEN" in refused["reason"]
    assert "hf_sekrit" not in caplog.text


@directory_only
async def test_with_the_token_the_pull_is_authorized(
    start_control_plane: ControlPlaneFactory,
    hub: HubUnderTest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    hub.hub.token = "hf_sekrit_token_value"
    caplog.set_level(logging.DEBUG)
    plane = await start_control_plane(hf_token="hf_sekrit_token_value")
    async with httpx.AsyncClient(base_url=plane.url, headers=plane.headers, timeout=30) as http:
        await register(http, "fleet/tiny-gguf", id="private")
        model = await pull_to_end(http, "private")
    assert model["status"] == "Ready", model["reason"]
    assert hub.hub.requests
    assert all(r.authorized for r in hub.hub.requests)
    assert "hf_sekrit" not in caplog.text
