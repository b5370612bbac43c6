"""The cache fetch script, run for real: ``sh`` with the machine's curl and sha256sum against a
loopback HTTP server serving weights, as the init container runs it (there with busybox).

``FLEET_TEST_SCRIPT_PATH`` replaces the runs' ``PATH``: a folder of busybox applets (and curl) runs
the script with the fetch image's own tools.

Each run is one pod: its own ``MODEL_DIR`` (the pod's emptyDir) and ``POD_NAME``, and a
``CACHE_DIR`` shared by every pod of the claim.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from fleet_contract import ModelWeights, WeightFile
from fleet_serving import caching, sources
from fleet_serving.sources import RegistryWeights

from .conftest import serving

TOKEN = "fsc_engine-credential-as-its-secret-holds-it"
FILES = {"model.gguf": b"GGUF" + bytes(range(256)) * 256, "extra/tokenizer.json": b"{}\n"}


def weights(stored: dict[str, bytes]) -> ModelWeights:
    listed = tuple(WeightFile(path=n, size=len(b), sha256=hashlib.sha256(b).hexdigest())
                   for n, b in stored.items())  # fmt: skip
    return ModelWeights(model_id="tiny/one", status="Ready", format="gguf", files=listed)


class Weights:
    """A control plane's file route: records each download, and can hold the answers for a
    file until ``hold`` requests for it are in flight (to make two pods race for real)."""

    def __init__(self) -> None:
        self.files = dict(FILES)
        self.requested: list[str] = []
        self.hold = 0
        self.arrived: dict[str, asyncio.Event] = {}

    async def serve(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.Response(status=401)
        name = request.match_info["name"]
        self.requested.append(name)
        arrived = self.arrived.setdefault(name, asyncio.Event())
        if self.requested.count(name) >= self.hold:
            arrived.set()
        await asyncio.wait_for(arrived.wait(), timeout=10)
        if name not in self.files:
            return web.Response(status=404)
        return web.Response(body=self.files[name])


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, Weights]]:
    state = Weights()
    app = web.Application()
    app.router.add_get("/api/v1/models/{model}/files/{name:.+}", state.serve)
    async with serving(app) as url:
        yield url, state


def made(folder: Path) -> Path:
    folder.mkdir(exist_ok=True)
    return folder


async def fetch(args: list[str], cache: Path, pod: Path) -> tuple[int, str]:
    """Run the cache script as the init container of pod ``pod.name`` does (its emptyDir is
    ``pod``)."""
    env = {"MODEL_DIR": str(pod), "CACHE_DIR": str(cache), "POD_NAME": pod.name,
           "FLEET_ENGINE_TOKEN": TOKEN,
           "PATH": os.environ.get("FLEET_TEST_SCRIPT_PATH", "/usr/bin:/bin")}  # fmt: skip
    process = await asyncio.create_subprocess_exec(
        "sh", "-c", caching.CACHE_SCRIPT, "fetch-weights", *args, cwd=made(pod),
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await process.communicate()
    return process.returncode or 0, out.decode()


def read_model(pod: Path) -> dict[str, bytes]:
    """What the engine reads through the pod's links."""
    return {str(p.relative_to(pod)): p.read_bytes() for p in pod.rglob("*") if p.is_file()}


def stored(cache: Path) -> list[str]:
    """Every file under the cache, partial ones included."""
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file())


def args_for(url: str, files: dict[str, bytes] = FILES) -> list[str]:
    return sources.fetch_args(RegistryWeights(control_plane=url, weights=weights(files)))


def blobs(files: dict[str, bytes] = FILES) -> list[str]:
    return sorted(f"sha256/{hashlib.sha256(b).hexdigest()}" for b in files.values())


async def first_pod(url: str, tmp_path: Path) -> Path:
    """The first pod on an empty cache, ``pod-a``, fetched without error; the cache's path."""
    cache = tmp_path / "cache"
    code, out = await fetch(args_for(url), cache, tmp_path / "pod-a")
    assert code == 0, out
    return cache


async def test_a_second_pod_on_the_cache_downloads_nothing(
    server: tuple[str, Weights], tmp_path: Path
) -> None:
    url, state = server
    cache = await first_pod(url, tmp_path)
    assert sorted(state.requested) == sorted(FILES)
    assert read_model(tmp_path / "pod-a") == FILES
    assert stored(cache) == blobs()  # one file per sha256, no partial left

    state.requested.clear()
    code, out = await fetch(args_for(url), cache, tmp_path / "pod-b")
    assert code == 0, out
    assert state.requested == []
    assert "cached model.gguf" in out
    assert read_model(tmp_path / "pod-b") == FILES
    link = tmp_path / "pod-b" / "extra" / "tokenizer.json"
    assert link.is_symlink()
    sha = hashlib.sha256(FILES["extra/tokenizer.json"]).hexdigest()
    assert os.readlink(link) == str(cache / "sha256" / sha)


async def test_two_pods_racing_on_a_cold_cache_end_with_one_verified_copy(
    server: tuple[str, Weights], tmp_path: Path
) -> None:
    url, state = server
    state.hold = 2  # no answer for a file until both pods have asked for it
    cache = tmp_path / "cache"
    a, b = await asyncio.gather(
        fetch(args_for(url), cache, tmp_path / "pod-a"),
        fetch(args_for(url), cache, tmp_path / "pod-b"),
    )
    assert a[0] == 0, a[1]
    assert b[0] == 0, b[1]
    assert sorted(state.requested) == sorted([*FILES, *FILES])  # no lock (ADR 0027)
    assert stored(cache) == blobs()  # and one copy remains
    for name in ("pod-a", "pod-b"):
        assert read_model(tmp_path / name) == FILES
    for blob in blobs():
        data = (cache / blob).read_bytes()
        assert hashlib.sha256(data).hexdigest() == blob.removeprefix("sha256/")


async def test_a_file_whose_hash_differs_never_enters_the_cache(
    server: tuple[str, Weights], tmp_path: Path
) -> None:
    url, state = server
    cache = tmp_path / "cache"
    state.files["model.gguf"] = b"GGUF tampered"
    code, out = await fetch(args_for(url), cache, tmp_path / "pod-a")
    assert code == 1
    assert "sha256 mismatch for model.gguf" in out
    assert not any(name.endswith(hashlib.sha256(FILES["model.gguf"]).hexdigest())
                   for name in stored(cache))  # fmt: skip
    assert not (tmp_path / "pod-a" / "model.gguf").exists()


async def test_models_sharing_a_file_share_its_copy(
    server: tuple[str, Weights], tmp_path: Path
) -> None:
    url, state = server
    cache = await first_pod(url, tmp_path)
    state.requested.clear()
    state.files["other.gguf"] = b"GGUF another quantization"
    other = {"other.gguf": state.files["other.gguf"], "extra/tokenizer.json": b"{}\n"}
    code, out = await fetch(args_for(url, other), cache, tmp_path / "pod-b")
    assert code == 0, out
    assert state.requested == ["other.gguf"]  # the tokenizer came from the cache
    assert read_model(tmp_path / "pod-b") == other


async def test_a_restarted_pod_resumes_its_own_partial_and_stale_ones_are_dropped(
    server: tuple[str, Weights], tmp_path: Path
) -> None:
    url, state = server
    cache = tmp_path / "cache"
    sha = hashlib.sha256(FILES["model.gguf"]).hexdigest()
    (cache / "partial").mkdir(parents=True)
    mine = cache / "partial" / f"{sha}.pod-a"
    mine.write_bytes(FILES["model.gguf"])  # complete but not yet renamed: a crash in between
    abandoned = cache / "partial" / f"{sha}.pod-gone"
    abandoned.write_bytes(b"GG")
    day_and_a_bit = os.stat(abandoned).st_mtime - 25 * 3600
    os.utime(abandoned, (day_and_a_bit, day_and_a_bit))
    code, out = await fetch(args_for(url), cache, tmp_path / "pod-a")
    assert code == 0, out
    assert "model.gguf" not in state.requested  # checked and kept
    assert stored(cache) == blobs()
