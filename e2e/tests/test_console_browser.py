"""The operator console in a real browser: Debian's Chromium (headless), driven by playwright-core
from ``web/tests/browser/console.mjs``, against real processes — a gateway in database mode
serving the built console, the control plane with its synthetic hub, a stub engine, the harness's
Postgres and Redis — and ``fleet-gateway --demo`` with nothing else.

Each test runs one scenario of the script; a scenario fails with the step it was at. Screenshots
land in ``web/artifacts/screenshots`` (gitignored; docs/console/ holds a copy).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql

from fleet_core.console.settings import BUILT_DIR
from fleet_testing import servers
from fleet_testing.fix_auth import bearer

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "web"
SCRIPT = WEB / "tests" / "browser" / "console.mjs"
ARTIFACTS = WEB / "artifacts" / "screenshots"
CHROMIUM = os.environ.get("FLEET_CHROMIUM", "/usr/bin/chromium")
REPLY = " ".join(f"word{n}" for n in range(600))  # 600 tokens at 20 ms: a 12 s stream to stop
STUB_FLAGS = ("--token-delay-ms", "20", "--reply", REPLY)
LOOPBACK = "127.0.0.1"
INVENTORY = ROOT / "contract" / "tests" / "fixtures" / "v1-full.json"


@dataclass(frozen=True)
class Stack:
    gateway: str
    api: str
    demo: str
    admin_token: str
    tenant_key: str
    logs: Path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{url} exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError as exc:
            exc.close()
        except OSError:
            pass
        time.sleep(0.1)
    pytest.fail(f"{url} did not answer within 60 s: {log.read_text()[-2000:]}")


class _Processes:
    def __init__(self, logs: Path) -> None:
        self.logs, self.running = logs, list[subprocess.Popen[bytes]]()

    def start(self, name: str, argv: list[str], env: dict[str, str], ready: str) -> None:
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, *argv], env={**os.environ, **env}, stdout=out, stderr=out
            )
        self.running.append(process)
        _wait(ready, process, log)

    def stop(self) -> None:
        for process in self.running:
            process.terminate()
        for process in self.running:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(scope="module")
def database(postgres_server: servers.Server) -> Iterator[str]:
    name = f"fleet_t_console_{secrets.token_hex(4)}"
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield servers.with_database(postgres_server.url, name)
    finally:
        with psycopg.connect(postgres_server.url, autocommit=True) as conn:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            conn.execute(drop.format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def stack(database: str, redis_url: str) -> Iterator[Stack]:
    """The whole system as processes, seeded with a tenant, traffic, a pulled model, an
    inventory report and a cost rate, so every page has data."""
    if not (BUILT_DIR / "index.html").is_file():
        pytest.fail("the console is not built: run `make web` (make test builds it first)")
    logs = Path(tempfile.mkdtemp(prefix="fleet-console-"))
    processes = _Processes(logs)
    admin = "test-admin-" + secrets.token_urlsafe(24)
    engine, api, gateway, demo = (_free_port() for _ in range(4))
    try:
        processes.start(
            "engine",
            ["-m", "fleet_core.stub_engine", "--port", str(engine), "--model", "m", *STUB_FLAGS],
            {},
            f"http://127.0.0.1:{engine}/health",
        )
        processes.start(
            "apiserver",
            ["-m", "fleet_core.apiserver", "--listen", f"127.0.0.1:{api}"],
            {
                "FLEET_DATABASE_URL": database,
                "FLEET_ADMIN_TOKEN": admin,
                "FLEET_SYNTHETIC_HUB": "1",
                "FLEET_MODELS_DIR": str(logs / "models"),
                "FLEET_ACCESS_LOG": "false",
            },
            f"http://127.0.0.1:{api}/readyz",
        )
        config = logs / "fleet.yaml"
        config.write_text(
            f"upstreams:\n  - id: m\n    model: m\n    base_url: http://127.0.0.1:{engine}\n"
        )
        processes.start(
            "gateway",
            [
                "-m",
                "fleet_core.gateway",
                "--config",
                str(config),
                "--listen",
                f"{LOOPBACK}:{gateway}",
            ],
            {
                "FLEET_DATABASE_URL": database,
                "FLEET_REDIS_URL": redis_url,
                "FLEET_REDIS_PREFIX": f"console{secrets.token_hex(3)}:",
                "FLEET_LEDGER_SPOOL": str(logs / "spool.jsonl"),
                "FLEET_CONSOLE_API_URL": f"http://127.0.0.1:{api}",
                "FLEET_ACCESS_LOG": "false",
            },
            f"http://127.0.0.1:{gateway}/healthz",
        )
        processes.start(
            "demo",
            ["-m", "fleet_core.gateway", "--demo", "--listen", f"127.0.0.1:{demo}"],
            {"FLEET_DEMO_TOKEN_DELAY_MS": "20", "FLEET_ACCESS_LOG": "false"},
            f"http://127.0.0.1:{demo}/healthz",
        )
        key = _seed(f"http://127.0.0.1:{api}", f"http://127.0.0.1:{gateway}", admin)
        yield Stack(
            gateway=f"http://127.0.0.1:{gateway}",
            api=f"http://127.0.0.1:{api}",
            demo=f"http://127.0.0.1:{demo}",
            admin_token=admin,
            tenant_key=key,
            logs=logs,
        )
    finally:
        processes.stop()
        shutil.rmtree(logs, ignore_errors=True)


def _created(response: httpx.Response) -> Any:
    assert response.status_code in (200, 201, 202), response.text
    return response.json()


def _seed(api: str, gateway: str, admin: str) -> str:
    with httpx.Client(base_url=api, headers=bearer(admin)) as http:
        _created(http.post("/api/v1/tenants", json={"id": "acme", "name": "Acme"}))
        _created(http.post("/api/v1/projects", json={"tenantId": "acme", "name": "research"}))
        key = _created(
            http.post("/api/v1/keys", json={"projectId": "acme/research", "label": "seed"})
        )
        rule = {"scopeKind": "tenant", "scopeId": "acme", "dimension": "tokens_total"}
        _created(http.post("/api/v1/budget-rules", json={**rule, "limit": 100000, "window": "1d"}))
        rate = {"cluster": "gpu-east", "gpuHourMicro": 2_500_000, "currency": "USD"}
        _created(http.post("/api/v1/cost-rates", json=rate))
        operator = _created(
            http.post(
                "/api/v1/credentials",
                json={"role": "operator", "label": "op", "clusterId": "gpu-east"},
            )
        )
        report = json.loads(INVENTORY.read_text())
        report["observedAt"] = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        pushed = http.put(
            "/api/v1/inventory",
            json=report,
            headers={"Authorization": f"Bearer {operator['secret']}"},
        )
        assert pushed.status_code < 300, pushed.text
        model = _created(
            http.post("/api/v1/models", json={"source": {"uri": "hf://fleet/tiny-gguf"}})
        )
        _created(http.post(f"/api/v1/models/{model['id']}/pull"))
        deadline = time.monotonic() + 30
        while http.get(f"/api/v1/models/{model['id']}").json()["status"] != "Ready":
            assert time.monotonic() < deadline, "the seed model's pull did not finish"
            time.sleep(0.2)
    secret = str(key["secret"])
    with httpx.Client(base_url=gateway, headers={"Authorization": f"Bearer {secret}"}) as chat:
        for n in range(3):
            body = {"model": "m", "messages": [{"role": "user", "content": f"hi {n}"}]}
            answered = chat.post("/v1/chat/completions", json={**body, "max_tokens": 5 + n})
            assert answered.status_code == 200, answered.text
    return secret


def _drive(stack: Stack, scenario: str) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed: the console's browser tests need Node.js 20+")
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (or set FLEET_CHROMIUM)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "FLEET_GATEWAY": stack.gateway,
        "FLEET_API": stack.api,
        "FLEET_DEMO": stack.demo,
        "FLEET_ADMIN": stack.admin_token,
        "FLEET_TENANT_KEY": stack.tenant_key,
        "FLEET_CHROMIUM": CHROMIUM,
        "FLEET_ARTIFACTS": str(ARTIFACTS),
    }
    done = subprocess.run(
        [node, str(SCRIPT), scenario],
        cwd=WEB,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert done.returncode == 0, f"{scenario}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert f"ok {scenario}" in done.stdout


def test_every_page_loads_with_data_and_a_deep_link_survives_a_reload(stack: Stack) -> None:
    _drive(stack, "pages")


def test_the_playground_streams_and_the_stop_button_stops(stack: Stack) -> None:
    _drive(stack, "playground")


def test_the_playground_works_against_the_demo_gateway_alone(stack: Stack) -> None:
    _drive(stack, "demo")


def test_a_pull_shows_moving_progress_and_cancel_stops_it(stack: Stack) -> None:
    _drive(stack, "models")


def test_a_new_keys_secret_is_shown_once_and_works(stack: Stack) -> None:
    _drive(stack, "keys")


def test_a_month_is_closed_after_confirming_the_force_and_its_csv_downloads(stack: Stack) -> None:
    _drive(stack, "costs")


def test_a_tenant_key_is_offered_its_own_pages_only(stack: Stack) -> None:
    _drive(stack, "tenant")


def test_a_foreign_origin_is_refused_by_the_control_plane(stack: Stack) -> None:
    _drive(stack, "cors")
