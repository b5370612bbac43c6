"""``fleet models import``: a user's own files become a Ready model without any hub.

The client announces the files (path, size, sha256), then uploads each one as a streamed PUT; the
control plane hashes the bytes as they arrive, stores them, and parses the whole set after the
last file exactly as after a pull. Every test runs against a real control plane on a real Postgres,
on the directory store and then on SeaweedFS; the CLI runs as a real process.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest

from fleet_core.control_plane.registry.objects import ObjectStore
from fleet_core.devtools.hub import files
from fleet_testing.waiting import eventually

from .conftest import ControlPlane, ControlPlaneFactory
from .test_cli import fleet, output
from .test_files import assert_error, download

OCTETS = {"Content-Type": "application/octet-stream"}

GGUF = files.gguf_bytes()
SAFETENSORS = files.safetensors_bytes([("w", "F32", (4, 8))])


def entry(path: str, data: bytes) -> dict[str, Any]:
    return {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


async def register_local(http: httpx.AsyncClient, model_id: str, **fields: Any) -> None:
    body = {"id": model_id, "source": {"local": {"origin": f"{model_id}.gguf"}}, **fields}
    response = await http.post("/api/v1/models", json=body)
    assert response.status_code == 201, response.text


async def start_import(http: httpx.AsyncClient, model_id: str, *planned: dict[str, Any]) -> None:
    await register_local(http, model_id)
    response = await http.post(f"/api/v1/models/{model_id}/import", json={"files": planned})
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "Pulling"


async def put(http: httpx.AsyncClient, model_id: str, path: str, data: bytes) -> httpx.Response:
    url = f"/api/v1/models/{model_id}/import/{path}"
    return await http.put(url, content=data, headers=OCTETS)


async def fleet_import(plane: ControlPlane, *args: str) -> tuple[int, str]:
    """``fleet models import ARGS`` as a process, with the admin token in FLEET_TOKEN."""
    return await output(await fleet(plane, "import", *args))


async def assert_failed_and_empty(
    http: httpx.AsyncClient, objects: ObjectStore, model_id: str, reason: str
) -> None:
    model = (await http.get(f"/api/v1/models/{model_id}")).json()
    assert model["status"] == "Failed"
    assert reason in model["reason"]
    assert await objects.keys(f"models/{model_id}/") == []


async def test_the_cli_imports_a_gguf_file_and_it_serves_like_a_pulled_one(
    start_control_plane: ControlPlaneFactory, objects: ObjectStore, tmp_path: Path
) -> None:
    weights = tmp_path / "Tiny-Q8_0.gguf"
    weights.write_bytes(GGUF)
    plane = await start_control_plane()
    code, text = await fleet_import(plane, str(weights), "--id", "tiny", "--format", "gguf")
    assert code == 0, text
    assert "tiny: Ready" in text
    assert "hashing" in text
    assert "uploading" in text
    async with httpx.AsyncClient(base_url=plane.url, headers=plane.headers, timeout=30) as http:
        model = (await http.get("/api/v1/models/tiny")).json()
        assert model["source"] == {"local": {"origin": "Tiny-Q8_0.gguf"}}
        assert model["facts"]["format"] == "gguf"
        assert model["facts"]["architecture"] == "llama"
        assert model["facts"]["quantization"] == "Q8_0"
        assert model["facts"]["files"] == [entry("Tiny-Q8_0.gguf", GGUF)]
        response, sha256 = await download(http, "tiny", "Tiny-Q8_0.gguf")
        assert (response.status_code, sha256) == (200, hashlib.sha256(GGUF).hexdigest())
        fit = await http.get("/api/v1/models/tiny/fit", params={"engine": "llamacpp"})
        assert fit.status_code == 200
        weights_doc = (await http.get("/api/v1/models/tiny/weights")).json()
        assert weights_doc["status"] == "Ready"
    assert await objects.keys("models/tiny/") == ["models/tiny/Tiny-Q8_0.gguf"]
    code, text = await fleet_import(plane, str(weights), "--id", "tiny")
    assert (code, "already Ready" in text) == (0, True), text


async def test_the_cli_imports_a_directory_with_its_tokenizer_and_skips_hidden_files(
    start_control_plane: ControlPlaneFactory, tmp_path: Path
) -> None:
    model_dir = tmp_path / "Tiny-Llama"
    (model_dir / "extra").mkdir(parents=True)
    (model_dir / ".git").mkdir()
    (model_dir / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (model_dir / "config.json").write_bytes(files.config_json())
    (model_dir / "tokenizer.json").write_bytes(files.tokenizer_json())
    (model_dir / "extra" / "model.safetensors").write_bytes(SAFETENSORS)
    plane = await start_control_plane()
    code, text = await fleet_import(plane, str(model_dir))
    assert code == 0, text
    assert "tiny-llama: Ready" in text  # the id defaults to the directory's name
    async with httpx.AsyncClient(base_url=plane.url, headers=plane.headers, timeout=30) as http:
        model = (await http.get("/api/v1/models/tiny-llama")).json()
        paths = {f["path"] for f in model["facts"]["files"]}
        assert paths == {"config.json", "tokenizer.json", "extra/model.safetensors"}
        assert model["facts"]["architecture"] == "LlamaForCausalLM"
        tokenizer = await http.get("/api/v1/models/tiny-llama/tokenizer")
        assert tokenizer.content == files.tokenizer_json()
        code, text = await fleet_import(plane, str(tmp_path / "missing"))
        assert code == 2
        assert "neither a file nor a directory" in text


async def test_progress_is_reported_file_by_file(control_plane_client: httpx.AsyncClient) -> None:
    config, weights = files.config_json(), SAFETENSORS
    await start_import(
        control_plane_client, "two", entry("config.json", config), entry("m.safetensors", weights)
    )
    as_json = await control_plane_client.put(
        "/api/v1/models/two/import/config.json", content=config
    )
    assert_error(as_json, 415, "unsupported_media_type")
    first = await put(control_plane_client, "two", "config.json", config)
    assert first.status_code == 200, first.text
    assert first.json()["filesDone"] == 1
    assert first.json()["status"] == "Pulling"
    progress = (await control_plane_client.get("/api/v1/models/two/pull")).json()
    assert (progress["filesDone"], progress["filesTotal"]) == (1, 2)
    assert progress["bytesTotal"] == len(config) + len(weights)
    again = await put(control_plane_client, "two", "config.json", config)
    assert_error(again, 409, "file_stored")
    last = await put(control_plane_client, "two", "m.safetensors", weights)
    assert last.status_code == 200, last.text
    assert last.json()["status"] == "Ready"
    assert last.json()["bytesDone"] == len(config) + len(weights)


@pytest.mark.parametrize(
    ("sent", "reason"),
    [
        (GGUF[:-1] + b"\x00", "sha256 mismatch for m.gguf: the import's plan says"),
        (GGUF + b"more", "more than the"),
        (GGUF[:-7], "bytes arrived; the plan says"),
    ],
    ids=["other-bytes", "too-long", "too-short"],
)
async def test_bytes_that_are_not_the_planned_ones_fail_the_import(
    control_plane_client: httpx.AsyncClient, objects: ObjectStore, sent: bytes, reason: str
) -> None:
    await start_import(control_plane_client, "m", entry("m.gguf", GGUF))
    error = assert_error(await put(control_plane_client, "m", "m.gguf", sent), 400, "import_failed")
    assert reason in error["message"]
    await assert_failed_and_empty(control_plane_client, objects, "m", reason)
    again = await control_plane_client.post(
        "/api/v1/models/m/import", json={"files": [entry("m.gguf", GGUF)]}
    )
    assert again.status_code == 202  # a Failed import starts afresh
    assert (await put(control_plane_client, "m", "m.gguf", GGUF)).json()["status"] == "Ready"


async def test_files_that_hash_right_but_do_not_parse_fail_at_the_last_file(
    control_plane_client: httpx.AsyncClient, objects: ObjectStore
) -> None:
    fake = b"GGUF" + b"\xff" * 60
    await start_import(control_plane_client, "fake", entry("fake.gguf", fake))
    error = assert_error(
        await put(control_plane_client, "fake", "fake.gguf", fake), 400, "import_failed"
    )
    assert "fake.gguf" in error["message"]
    await assert_failed_and_empty(control_plane_client, objects, "fake", "fake.gguf")


@pytest.mark.parametrize(
    ("plan", "param"),
    [
        ([entry("../escape.gguf", GGUF)], "files[0].path"),
        ([entry("/abs.gguf", GGUF)], "files[0].path"),
        ([entry(".hidden/x.gguf", GGUF)], "files[0].path"),
        ([{**entry("m.gguf", GGUF), "sha256": "nothex"}], "files[0].sha256"),
        ([{**entry("m.gguf", GGUF), "size": -1}], "files[0].size"),
        ([], "files"),
        ([entry("m.gguf", GGUF), entry("m.gguf", GGUF)], "files"),
    ],
)
async def test_a_bad_plan_is_refused_before_any_byte(
    control_plane_client: httpx.AsyncClient, plan: list[dict[str, Any]], param: str
) -> None:
    await register_local(control_plane_client, "m")
    response = await control_plane_client.post("/api/v1/models/m/import", json={"files": plan})
    assert assert_error(response, 400, response.json()["error"]["code"])["param"] == param
    assert (await control_plane_client.get("/api/v1/models/m")).json()["status"] == "Registered"


async def test_imports_and_pulls_keep_to_their_own_models(
    control_plane_client: httpx.AsyncClient,
) -> None:
    hf = {"id": "hubbed", "source": {"uri": "hf://fleet/tiny-gguf"}}
    assert (await control_plane_client.post("/api/v1/models", json=hf)).status_code == 201
    refused = await control_plane_client.post(
        "/api/v1/models/hubbed/import", json={"files": [entry("m", GGUF)]}
    )
    assert_error(refused, 409, "not_an_import")
    await register_local(control_plane_client, "local")
    assert_error(
        await control_plane_client.post("/api/v1/models/local/pull"), 409, "imported_model"
    )
    assert_error(await put(control_plane_client, "local", "m.gguf", GGUF), 409, "no_import")
    await start_import(control_plane_client, "other", entry("m.gguf", GGUF))
    assert_error(await put(control_plane_client, "other", "nope.gguf", GGUF), 404, "file_not_found")
    assert (await put(control_plane_client, "other", "m.gguf", GGUF)).json()["status"] == "Ready"
    again = await control_plane_client.post(
        "/api/v1/models/other/import", json={"files": [entry("m.gguf", GGUF)]}
    )
    assert_error(again, 409, "model_busy")


def half_sent(
    control_plane_client: httpx.AsyncClient, path: str, data: bytes, sent: int
) -> socket.socket:
    """A connection that sent the PUT's headers and the first ``sent`` bytes of its body."""
    address = urlsplit(str(control_plane_client.base_url))
    raw = socket.create_connection((address.hostname, address.port))
    head = (
        f"PUT {path} HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: {control_plane_client.headers['authorization']}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    raw.sendall(head.encode() + data[:sent])
    return raw


async def test_a_cancel_stops_an_upload_mid_file_and_leaves_nothing(
    control_plane_client: httpx.AsyncClient, objects: ObjectStore
) -> None:
    half = len(GGUF) // 2
    await start_import(control_plane_client, "m", entry("m.gguf", GGUF))
    with half_sent(control_plane_client, "/api/v1/models/m/import/m.gguf", GGUF, half) as raw:
        await _until(control_plane_client, "m", lambda p: p["bytesDone"] >= half)
        busy = await put(control_plane_client, "m", "m.gguf", GGUF)
        assert_error(busy, 409, "import_busy")
        cancelled = await control_plane_client.delete("/api/v1/models/m/pull")
        assert cancelled.json()["status"] == "Cancelled"
        answer = await asyncio.to_thread(raw.recv, 65536)
    assert answer.startswith(b"HTTP/1.1 409")
    assert b'"code":"import_stopped"' in answer
    assert await objects.keys("models/m/") == []
    assert await objects.keys(".partial/") == []


async def test_a_client_that_disconnects_mid_file_fails_the_import(
    control_plane_client: httpx.AsyncClient, objects: ObjectStore
) -> None:
    await start_import(control_plane_client, "m", entry("m.gguf", GGUF))
    with half_sent(control_plane_client, "/api/v1/models/m/import/m.gguf", GGUF, 100):
        await _until(control_plane_client, "m", lambda p: p["bytesDone"] >= 100)
    final = await _until(control_plane_client, "m", lambda p: p["status"] != "Pulling")
    assert "the upload of m.gguf stopped after 100 of" in final["reason"]
    await assert_failed_and_empty(control_plane_client, objects, "m", "client disconnected")


async def test_an_import_does_not_survive_its_control_plane(
    start_control_plane: ControlPlaneFactory, objects: ObjectStore, postgres_url: str
) -> None:
    plane = await start_control_plane()
    config = files.config_json()
    async with httpx.AsyncClient(base_url=plane.url, headers=plane.headers, timeout=30) as http:
        await start_import(http, "m", entry("config.json", config), entry("m.gguf", GGUF))
        assert (await put(http, "m", "config.json", config)).status_code == 200
    await plane.stop()
    plane = await start_control_plane()
    async with httpx.AsyncClient(base_url=plane.url, headers=plane.headers, timeout=30) as http:
        await assert_failed_and_empty(http, objects, "m", "stopped during the import")
    await plane.stop()
    with psycopg.connect(postgres_url) as conn:  # as if the process had been killed mid-import
        conn.execute("UPDATE registry_models SET status = 'Pulling' WHERE id = 'm'")
    plane = await start_control_plane()
    async with httpx.AsyncClient(base_url=plane.url, headers=plane.headers, timeout=30) as http:
        await assert_failed_and_empty(http, objects, "m", "restart; import the files again")


async def _until(http: httpx.AsyncClient, model_id: str, done: Any) -> dict[str, Any]:
    seen: list[dict[str, Any]] = [{}]

    async def reached() -> dict[str, Any] | None:
        seen[0] = (await http.get(f"/api/v1/models/{model_id}/pull")).json()
        return seen[0] if done(seen[0]) else None

    return await eventually(reached, within=10, what=lambda: f"never reached: {seen[0]}")
