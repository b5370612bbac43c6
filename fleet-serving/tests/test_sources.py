"""``registry:`` sources: what is rendered once resolved, and the fetch script run for real.

The script runs under ``sh`` with the machine's curl and sha256sum against a loopback HTTP server,
exactly as the init container runs it (there with busybox and curl from the fetch image).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from fleet_contract import ModelWeights, WeightFile
from fleet_serving import profiles, rendering, sources
from fleet_serving.errors import InvalidSpec
from fleet_serving.sources import RegistryWeights
from fleet_serving.spec import decode_spec

from .conftest import serving

OWNER = rendering.Owner(name="tiny", namespace="models", uid="uid-1")
FILES = {"model.gguf": b"GGUF" + bytes(range(256)) * 64, "extra/readme.txt": b"hello\n"}
ENGINE_TOKEN = "fsc_engine-credential-as-its-secret-holds-it"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def weights(stored: dict[str, bytes] = FILES, **fields: Any) -> ModelWeights:
    listed = tuple(WeightFile(path=n, size=len(b), sha256=sha(b)) for n, b in stored.items())
    return ModelWeights(
        **({"model_id": "tiny/one", "status": "Ready", "format": "gguf", "files": listed} | fields)
    )


def spec(**fields: Any) -> Any:
    base = {
        "servedModelName": "tiny",
        "source": {"registry": "tiny/one"},
        "weightFormat": "gguf",
        "engine": "llamacpp",
    }
    return decode_spec(base | fields)


def resolved(**fields: Any) -> RegistryWeights:
    return RegistryWeights(control_plane="http://cp:8081/", weights=weights(**fields))


QUANTS = {
    "config.json": b"{}",
    "Qwen3-8B-Q4_K_M.gguf": b"GGUF q4",
    "Qwen3-8B-Q8_0-00001-of-00002.gguf": b"GGUF q8 a",
    "Qwen3-8B-Q8_0-00002-of-00002.gguf": b"GGUF q8 b",
}


def test_a_registry_model_of_several_quantizations_needs_weight_file() -> None:
    with pytest.raises(InvalidSpec, match=r"holds 2 GGUF models .* spec\.weightFile"):
        sources.check(spec(), weights(QUANTS))
    with pytest.raises(InvalidSpec, match=r"has no file 'nope\.gguf'"):
        sources.check(spec(weightFile="nope.gguf"), weights(QUANTS))


def test_only_the_chosen_quantization_is_fetched_and_served() -> None:
    s = spec(weightFile="Qwen3-8B-Q8_0-00001-of-00002.gguf")
    sources.check(s, weights(QUANTS))
    registry = RegistryWeights(control_plane="http://cp/", weights=weights(QUANTS),
                               weight_file=s.weight_file)  # fmt: skip
    d = rendering.deployment(OWNER, s, profiles.check(s), registry)
    pod = d["spec"]["template"]["spec"]
    (fetch,) = pod["initContainers"]
    assert fetch["args"][::3] == ["Qwen3-8B-Q8_0-00001-of-00002.gguf",
                                  "Qwen3-8B-Q8_0-00002-of-00002.gguf", "config.json"]  # fmt: skip
    model = pod["containers"][0]["args"][:2]
    assert model == ["--model", "/models/Qwen3-8B-Q8_0-00001-of-00002.gguf"]


def test_llamacpp_loads_the_fetched_gguf_after_an_init_container_fetches_every_file() -> None:
    s = spec()
    d = rendering.deployment(OWNER, s, profiles.check(s), resolved())
    pod = d["spec"]["template"]["spec"]
    (fetch,) = pod["initContainers"]
    assert fetch["image"] == sources.FETCH_IMAGE
    assert fetch["command"] == ["sh", "-c", sources.FETCH_SCRIPT, "fetch-weights"]
    assert fetch["args"] == [
        "extra/readme.txt", "http://cp:8081/api/v1/models/tiny%2Fone/files/extra/readme.txt",
        sha(FILES["extra/readme.txt"]),
        "model.gguf", "http://cp:8081/api/v1/models/tiny%2Fone/files/model.gguf",
        sha(FILES["model.gguf"]),
    ]  # fmt: skip
    assert fetch["volumeMounts"] == [{"name": "models", "mountPath": "/models"},
                                     {"name": "tmp", "mountPath": "/tmp"}]  # fmt: skip
    token = {"secretKeyRef": {"name": "fleet-engine-token", "key": "token"}}
    assert {"name": "FLEET_ENGINE_TOKEN", "valueFrom": token} in fetch["env"]
    assert not any(ENGINE_TOKEN in str(value) for value in fetch.values())
    engine = pod["containers"][0]
    assert engine["args"][:2] == ["--model", "/models/model.gguf"]


def test_vllm_loads_the_fetched_folder() -> None:
    s = spec(engine="vllm", weightFormat="safetensors", gpusPerReplica=1)
    files = {"config.json": b"{}", "model.safetensors": b"\x02\x00" + b"{}"}
    d = rendering.deployment(OWNER, s, profiles.check(s), resolved(stored=files,
                                                                 format="safetensors"))  # fmt: skip
    pod = d["spec"]["template"]["spec"]
    assert pod["containers"][0]["args"][:2] == ["/models", "--served-model-name"]
    assert pod["initContainers"][0]["args"][0::3] == ["config.json", "model.safetensors"]


def test_a_registry_source_is_never_rendered_unresolved() -> None:
    s = spec()
    with pytest.raises(ValueError, match="once resolved"):
        rendering.deployment(OWNER, s, profiles.check(s))


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (
            {"format": "safetensors"},
            "holds safetensors weights, but the spec says weightFormat gguf",
        ),
        ({"files": ()}, "lists no files"),
        ({"files": (WeightFile(path="../etc/passwd", size=1, sha256="a" * 64),)}, "outside its"),
        ({"files": (WeightFile(path="/abs", size=1, sha256="a" * 64),)}, "outside its"),
        ({"files": (WeightFile(path="notes.txt", size=1, sha256="a" * 64),)}, "no .gguf file"),
    ],
)
def test_a_resolved_model_that_cannot_serve_the_spec_is_refused(
    fields: dict[str, Any], reason: str
) -> None:
    with pytest.raises(InvalidSpec, match=reason.replace(".", r"\.")):
        sources.check(spec(), weights(**fields))


# --- the fetch script, run for real ------------------------------------------------------------


@pytest.fixture
async def file_server() -> AsyncIterator[tuple[str, dict[str, bytes], list[str]]]:
    """Serves ``files`` (mutable) under /files/ as the control plane does, ``Range: bytes=N-``
    included; records each request's path and its Range header, if any."""
    files = dict(FILES)
    requested: list[str] = []

    async def serve(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {ENGINE_TOKEN}":
            return web.Response(status=401)  # as the control plane answers without it
        name = request.match_info["name"]
        ranged = request.headers.get("Range")
        requested.append(name + (f" {ranged}" if ranged else ""))
        if name not in files:
            return web.Response(status=404)
        data = files[name]
        if ranged is None:
            return web.Response(body=data)
        start = int(ranged.removeprefix("bytes=").removesuffix("-"))
        if start >= len(data):
            return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
        span = f"bytes {start}-{len(data) - 1}/{len(data)}"
        return web.Response(status=206, body=data[start:], headers={"Content-Range": span})

    app = web.Application()
    app.router.add_get("/api/v1/models/{model}/files/{name:.+}", serve)
    async with serving(app) as url:
        yield url, files, requested


def contents(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (partial ones included) by relative path."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


async def run_fetch(
    args: list[str], model_dir: Path, token: str | None = ENGINE_TOKEN
) -> tuple[int, str]:
    env = {"MODEL_DIR": str(model_dir), "PATH": "/usr/bin:/bin"}
    if token is not None:
        env["FLEET_ENGINE_TOKEN"] = token  # what the Secret gives the init container
    process = await asyncio.create_subprocess_exec(
        "sh", "-c", sources.FETCH_SCRIPT, "fetch-weights", *args,
        env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await process.communicate()
    return process.returncode or 0, out.decode()


async def test_the_fetch_script_downloads_and_checks_every_file(
    file_server: tuple[str, dict[str, bytes], list[str]], tmp_path: Path
) -> None:
    url, _, requested = file_server
    args = sources.fetch_args(RegistryWeights(control_plane=url, weights=weights()))
    code, out = await run_fetch(args, tmp_path)
    assert code == 0, out
    assert contents(tmp_path) == FILES
    # A restarted init container on the same volume keeps verified files.
    requested.clear()
    code, out = await run_fetch(args, tmp_path)
    assert code == 0, out
    assert requested == []


async def test_the_fetch_script_sends_the_engine_credential_and_needs_it(
    file_server: tuple[str, dict[str, bytes], list[str]], tmp_path: Path
) -> None:
    url, _, requested = file_server
    args = sources.fetch_args(RegistryWeights(control_plane=url, weights=weights()))
    code, out = await run_fetch(args, tmp_path, token=None)
    assert code != 0
    assert "the engine credential Secret is not mounted" in out
    code, out = await run_fetch(args, tmp_path, token="fsc_wrong")
    assert code != 0
    assert "401" in out
    assert requested == []  # the stand-in served nothing without the right token
    assert contents(tmp_path) == {}  # and the header file is gone from wherever it was


async def test_the_fetch_script_refuses_a_file_whose_hash_differs(
    file_server: tuple[str, dict[str, bytes], list[str]], tmp_path: Path
) -> None:
    url, files, _ = file_server
    args = sources.fetch_args(RegistryWeights(control_plane=url, weights=weights()))
    files["model.gguf"] = b"GGUF tampered"
    code, out = await run_fetch(args, tmp_path)
    assert code == 1
    assert "sha256 mismatch for model.gguf" in out
    assert "model.gguf" not in contents(tmp_path)  # the engine never sees it


async def test_the_fetch_script_fails_when_a_file_is_missing(
    file_server: tuple[str, dict[str, bytes], list[str]], tmp_path: Path
) -> None:
    url, files, _ = file_server
    del files["extra/readme.txt"]
    args = sources.fetch_args(RegistryWeights(control_plane=url, weights=weights()))
    code, out = await run_fetch(args, tmp_path)
    assert code != 0
    assert "404" in out
    assert "extra/readme.txt" not in contents(tmp_path)


async def test_an_interrupted_download_resumes_where_it_stopped(
    file_server: tuple[str, dict[str, bytes], list[str]], tmp_path: Path
) -> None:
    url, _, requested = file_server
    args = sources.fetch_args(RegistryWeights(control_plane=url, weights=weights()))
    (tmp_path / "model.gguf.partial").write_bytes(FILES["model.gguf"][:1000])
    code, out = await run_fetch(args, tmp_path)
    assert code == 0, out
    assert contents(tmp_path) == FILES
    assert "model.gguf bytes=1000-" in requested


async def test_a_partial_that_cannot_be_resumed_is_dropped_and_the_next_attempt_succeeds(
    file_server: tuple[str, dict[str, bytes], list[str]], tmp_path: Path
) -> None:
    url, _, _ = file_server
    args = sources.fetch_args(RegistryWeights(control_plane=url, weights=weights()))
    size = len(FILES["model.gguf"])
    for wrong in (b"x" * 1000, b"x" * size, b"x" * (size + 10)):  # bad prefix, 416 twice
        (tmp_path / "model.gguf.partial").write_bytes(wrong)
        code, out = await run_fetch(args, tmp_path)
        assert code != 0, out
        assert "model.gguf.partial" not in contents(tmp_path)
        code, out = await run_fetch(args, tmp_path)  # what the kubelet's restart does
        assert code == 0, out
        assert contents(tmp_path) == FILES
        (tmp_path / "model.gguf").unlink()


async def test_a_complete_partial_left_by_a_crash_is_checked_and_kept(
    file_server: tuple[str, dict[str, bytes], list[str]], tmp_path: Path
) -> None:
    url, _, requested = file_server
    args = sources.fetch_args(RegistryWeights(control_plane=url, weights=weights()))
    (tmp_path / "model.gguf.partial").write_bytes(FILES["model.gguf"])
    code, out = await run_fetch(args, tmp_path)
    assert code == 0, out
    assert contents(tmp_path) == FILES
    assert [r for r in requested if r.startswith("model.gguf")] == []
