"""``make dev`` then ``make seed`` from an empty directory: the whole system, in database mode,
answers an SDK call with the seeded key, ``make smoke`` passes against it (twice), and SIGTERM
leaves nothing running. Nothing is typed:
``make dev`` makes the control plane's admin token under ``.dev/`` and ``make seed`` finds it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from fleet_testing.ports import free_block
from fleet_testing.waiting import eventually_blocking

START_TIMEOUT_S = 90
REPO = Path(__file__).resolve().parents[2]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except urllib.error.HTTPError as exc:
        # It holds the response's socket, and the traceback's cycle keeps it alive until the
        # session's last garbage collection, which then fails the run on an unclosed socket.
        exc.close()
        return False
    except OSError:
        return False


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A checkout-like directory others may traverse: as root, make dev's Postgres runs as
    ``nobody``, which cannot enter pytest's private tmp_path."""
    path = Path(tempfile.mkdtemp(prefix="fleet-make-dev-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def dev(workdir: Path) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, str]]]:
    base = free_block(7)
    ports = {
        "FLEET_DEV_PORT": base,
        "FLEET_DEV_ENGINE_PORT": base + 1,  # + 2, + 3
        "FLEET_DEV_API_PORT": base + 4,
        "FLEET_DEV_PG_PORT": base + 5,
        "FLEET_DEV_REDIS_PORT": base + 6,
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update({k: str(v) for k, v in ports.items()})
    process = subprocess.Popen(
        [sys.executable, "-m", "fleet_core.devtools.devrun"],
        cwd=workdir,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield process, env
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_make_dev_then_make_seed_serves_a_key_and_stops_cleanly(
    dev: tuple[subprocess.Popen[bytes], dict[str, str]], workdir: Path
) -> None:
    process, env = dev
    gateway = f"http://127.0.0.1:{env['FLEET_DEV_PORT']}"
    api = f"http://127.0.0.1:{env['FLEET_DEV_API_PORT']}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _answers(f"{gateway}/healthz"):
        assert process.poll() is None, "make dev exited while starting"
        assert time.monotonic() < deadline, "make dev did not come up"
        time.sleep(0.2)

    token_file = workdir / ".dev" / "admin-token"
    assert token_file.stat().st_mode & 0o077 == 0, "the admin token is readable by others"
    token = token_file.read_text().strip()
    with pytest.raises(urllib.error.HTTPError, match="401") as anonymous:
        _get(f"{api}/api/v1/tenants", token=None)  # the control plane is closed without it
    anonymous.value.close()  # it holds the response's socket
    seeded = subprocess.run(
        [sys.executable, "-m", "fleet_core.devtools.seed"],
        cwd=workdir,  # as `make seed` runs, in the checkout `make dev` runs in
        env={**env, "FLEET_SEED_API": api},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    key = next(
        line.split("=", 1)[1] for line in seeded.stdout.splitlines() if "export KEY=" in line
    )
    _until_served(f"{gateway}/v1/models", key)
    with openai.OpenAI(base_url=f"{gateway}/v1", api_key=key, max_retries=0) as client:
        reply = client.chat.completions.create(
            model="qwen", messages=[{"role": "user", "content": "hello"}]
        )
        assert reply.choices[0].message.content
    # Closed here: an unclosed client's pooled socket, kept alive by the error's traceback cycle,
    # is only collected at the session's end, where it failed whole runs as an unclosed socket.
    wrong = openai.OpenAI(base_url=f"{gateway}/v1", api_key="fk_wrong", max_retries=0)
    with wrong, pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    # /metrics: the admin token reads it (database mode checks the control plane's credentials);
    # the tenant's key is refused.
    assert b"fleet_requests_total" in _read(f"{gateway}/metrics", token)
    with pytest.raises(urllib.error.HTTPError, match="403") as refused:
        _read(f"{gateway}/metrics", key)
    refused.value.close()

    # The registry pulls from the synthetic hub the control plane serves in dev.
    registered = _post(
        f"{api}/api/v1/models", {"source": {"huggingface": {"repo": "fleet/tiny-gguf"}}}, token
    )
    model_id = registered["id"]
    _post(f"{api}/api/v1/models/{model_id}/pull", {}, token)
    while (status := _get(f"{api}/api/v1/models/{model_id}", token)["status"]) not in (
        "Ready",
        "Failed",
    ):
        assert time.monotonic() < deadline + 60, f"the pull is still {status}"
        time.sleep(0.2)
    assert status == "Ready"
    assert any((workdir / ".dev" / "models").rglob("*.gguf"))

    _make_smoke_twice(env, token_file, api, token)

    assert (workdir / ".dev" / "postgres" / "data" / "PG_VERSION").is_file()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
    for port in ("FLEET_DEV_PG_PORT", "FLEET_DEV_REDIS_PORT", "FLEET_DEV_API_PORT"):
        assert not _answers_tcp(int(env[port])), f"{port} still served after SIGTERM"


def _until_served(url: str, key: str) -> None:
    """A new key reaches the gateway with its next catalog poll (a second; longer on a loaded
    machine, where a full `make test` run saw the first call refused)."""

    def served() -> bool:
        try:
            _get(url, key)
            return True
        except urllib.error.HTTPError as exc:
            exc.close()  # it holds the response's socket
            code = exc.code
        assert code == 401, f"the seeded key met {code}"
        return False

    eventually_blocking(served, within=20, what="the gateway accepting the seeded key")


def _make_smoke_twice(env: dict[str, str], token_file: Path, api: str, token: str) -> None:
    """``make smoke`` against this make dev passes, and again (it is safe to re-run); the
    throwaway tenants it made are all deactivated afterwards."""
    make = ["make", "--no-print-directory", "-C", str(REPO), "smoke"]
    for _ in range(2):
        smoked = subprocess.run(
            [*make, f"SMOKE_ADMIN_TOKEN={token_file}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert smoked.returncode == 0, smoked.stdout + smoked.stderr
        summary = smoked.stdout.strip().splitlines()[-1]
        assert " 0 failed" in summary, summary
        assert "FAIL " not in smoked.stdout
    tenants = _get(f"{api}/api/v1/tenants", token)["data"]
    made = [t for t in tenants if t["id"].startswith("smoke-")]
    assert made, "make smoke made no throwaway tenant"
    assert not [t["id"] for t in made if t["active"]], "a throwaway tenant is still active"


def _post(url: str, body: dict[str, Any], token: str) -> dict[str, Any]:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        found: dict[str, Any] = json.load(response)
        return found


def _read(url: str, token: str) -> bytes:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        body: bytes = response.read()
        return body


def _get(url: str, token: str | None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        found: dict[str, Any] = json.load(response)
        return found


def _answers_tcp(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False
