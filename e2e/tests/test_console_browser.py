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
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleet_core.gateway.console.settings import BUILT_DIR
from fleet_testing import fleet_system, processes, servers
from fleet_testing.fix_auth import bearer
from fleet_testing.ports import free_ports
from fleet_testing.processes import Processes
from fleet_testing.waiting import eventually_blocking

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "web"
SCRIPT = WEB / "tests" / "browser" / "console.mjs"
ARTIFACTS = WEB / "artifacts" / "screenshots"
CHROMIUM = os.environ.get("FLEET_CHROMIUM", "/usr/bin/chromium")
REPLY = " ".join(f"word{n}" for n in range(600))  # 600 tokens at 20 ms: a 12 s stream to stop
STUB_FLAGS = ("--token-delay-ms", "20", "--reply", REPLY)
LLAMA_SLOTS = 4
"""The llama.cpp stub's sequence slots (``--max-num-seqs``), which its ``/props`` tells."""
GATEWAY_SLOTS = 8
"""The vLLM upstream's ``slots`` in the gateway's config (vLLM does not publish its own)."""
LOOPBACK = "127.0.0.1"
INVENTORY = ROOT / "contract" / "tests" / "fixtures" / "v1-full.json"


@dataclass(frozen=True)
class Stack:
    gateway: str
    api: str
    demo: str
    admin_token: str
    tenant_key: str
    finance_token: str
    budget_key: str
    """globex's: the budget-rule scenario's own tenant, so no other scenario meets its rule."""
    limits_key: str
    """initech's: the rate-limit scenario's own tenant."""
    logs: Path


@pytest.fixture(scope="module")
def database(postgres_server: servers.Server) -> Iterator[str]:
    with fleet_system.database(postgres_server) as url:
        yield url


def _config(logs: Path, engine: int, llama: int) -> Path:
    """Two pools: vLLM's stub with the gateway's own slot limit, llama.cpp's telling its slots."""
    config = logs / "fleet.yaml"
    config.write_text(
        "health:\n  interval_s: 0.5\nupstreams:\n"
        f"  - {{id: m, model: m, base_url: 'http://127.0.0.1:{engine}', slots: {GATEWAY_SLOTS}}}\n"
        f"  - {{id: lcpp, model: lcpp, engine: llamacpp, base_url: 'http://127.0.0.1:{llama}'}}\n"
    )
    return config


def _engines(procs: Processes, engine: int, llama: int) -> None:
    vllm = ["--kv-capacity-tokens", "65536", *STUB_FLAGS]
    processes.stub_engine(procs, ["--model", "m", *vllm], name="engine", port=engine)
    lcpp = ["--profile", "llamacpp", "--max-num-seqs", str(LLAMA_SLOTS), *STUB_FLAGS]
    processes.stub_engine(procs, ["--model", "lcpp", *lcpp], name="llama", port=llama)


@pytest.fixture(scope="module")
def stack(database: str, redis_url: str) -> Iterator[Stack]:
    """The whole system as processes, seeded with tenants, traffic, a pulled model, an
    inventory report and a cost rate, so every page has data."""
    if not (BUILT_DIR / "index.html").is_file():
        pytest.fail("the console is not built: run `make web` (make test builds it first)")
    logs = Path(tempfile.mkdtemp(prefix="fleet-console-"))
    admin = "test-admin-" + secrets.token_urlsafe(24)
    engine, llama, api, gateway, demo, hub = free_ports(6)
    try:
        with processes.processes(logs) as procs:
            _engines(procs, engine, llama)
            processes.hub(procs, port=hub)
            api_env = {
                "FLEET_DATABASE_URL": database,
                "FLEET_ADMIN_TOKEN": admin,
                "FLEET_HUB_URL": f"http://127.0.0.1:{hub}",
                "FLEET_MODELS_DIR": str(logs / "models"),
                "FLEET_ACCESS_LOG": "false",
                # the admin closes last month: without a grace it is closable even in the first
                # hour of a month (the default 1 h grace refuses it then, for another reason)
                "FLEET_COST_CLOSE_GRACE": "0",
            }
            processes.control_plane(procs, api_env, port=api)
            gateway_env = {
                "FLEET_DATABASE_URL": database,
                "FLEET_REDIS_URL": redis_url,
                "FLEET_REDIS_PREFIX": f"console{secrets.token_hex(3)}:",
                "FLEET_LEDGER_SPOOL": str(logs / "spool.jsonl"),
                "FLEET_CONSOLE_API_URL": f"http://127.0.0.1:{api}",
                "FLEET_ACCESS_LOG": "false",
            }
            config = str(_config(logs, engine, llama))
            args = ["--config", config]
            processes.gateway(procs, gateway_env, args, host=LOOPBACK, port=gateway)
            demo_env = {"FLEET_DEMO_TOKEN_DELAY_MS": "20"}
            processes.gateway(procs, demo_env, ["--demo"], name="demo", port=demo)
            seeded = _seed(f"http://127.0.0.1:{api}", f"http://127.0.0.1:{gateway}", admin)
            yield Stack(
                gateway=f"http://127.0.0.1:{gateway}",
                api=f"http://127.0.0.1:{api}",
                demo=f"http://127.0.0.1:{demo}",
                admin_token=admin,
                tenant_key=seeded["acme"],
                finance_token=seeded["finance"],
                budget_key=seeded["globex"],
                limits_key=seeded["initech"],
                logs=logs,
            )
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def _created(response: httpx.Response) -> Any:
    assert response.status_code in (200, 201, 202), response.text
    return response.json()


def _tenant(http: httpx.Client, tenant: str, project: str) -> str:
    """A tenant with one project and a key of it: the key's secret."""
    _created(http.post("/api/v1/tenants", json={"id": tenant, "name": tenant.title()}))
    _created(http.post("/api/v1/projects", json={"tenantId": tenant, "name": project}))
    body = {"projectId": f"{tenant}/{project}", "label": "seed"}
    return str(_created(http.post("/api/v1/keys", json=body))["secret"])


def _inventory(http: httpx.Client) -> None:
    body = {"role": "operator", "label": "op", "clusterId": "gpu-east"}
    operator = _created(http.post("/api/v1/credentials", json=body))
    report = json.loads(INVENTORY.read_text())
    models = [d["servedModelName"] for d in report["deployments"]]  # the admin binds it first
    binding = {"servedModels": models, "endpoints": ["10.42.0.0/16"]}
    _created(http.put("/api/v1/clusters/gpu-east/binding", json=binding))
    report["observedAt"] = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    pushed = http.put("/api/v1/inventory", json=report, headers=bearer(operator["secret"]))
    assert pushed.status_code < 300, pushed.text


def _pulled_model(http: httpx.Client) -> None:
    model = _created(http.post("/api/v1/models", json={"source": {"uri": "hf://fleet/tiny-gguf"}}))
    _created(http.post(f"/api/v1/models/{model['id']}/pull"))
    eventually_blocking(
        lambda: http.get(f"/api/v1/models/{model['id']}").json()["status"] == "Ready",
        within=30,
        what="the seed model's pull finished",
    )


def _traffic(gateway: str, secret: str) -> None:
    with httpx.Client(base_url=gateway, headers=bearer(secret)) as chat:
        for n in range(3):
            body = {"model": "m", "messages": [{"role": "user", "content": f"hi {n}"}]}
            answered = chat.post("/v1/chat/completions", json={**body, "max_tokens": 5 + n})
            assert answered.status_code == 200, answered.text


def _seed(api: str, gateway: str, admin: str) -> dict[str, str]:
    with httpx.Client(base_url=api, headers=bearer(admin)) as http:
        keys = {
            "acme": _tenant(http, "acme", "research"),
            "globex": _tenant(http, "globex", "ops"),
            "initech": _tenant(http, "initech", "reports"),
        }
        rule = {"scopeKind": "tenant", "scopeId": "acme", "dimension": "tokens_total"}
        _created(http.post("/api/v1/budget-rules", json={**rule, "limit": 100000, "window": "1d"}))
        rate = {"cluster": "gpu-east", "gpuHourMicro": 2_500_000, "currency": "USD"}
        _created(http.post("/api/v1/cost-rates", json=rate))
        finance = {"role": "finance", "label": "books"}
        keys["finance"] = str(_created(http.post("/api/v1/credentials", json=finance))["secret"])
        _inventory(http)
        _pulled_model(http)
    _traffic(gateway, keys["acme"])
    _traffic(gateway, keys["globex"])
    return keys


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
        "FLEET_FINANCE": stack.finance_token,
        "FLEET_BUDGET_KEY": stack.budget_key,
        "FLEET_LIMITS_KEY": stack.limits_key,
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


def test_the_fleet_page_shows_engine_slots_queue_and_kv_live(stack: Stack) -> None:
    _drive(stack, "slots")


def test_a_budget_rule_is_created_edited_in_place_and_deleted(stack: Stack) -> None:
    _drive(stack, "budgets")


def test_an_edited_rate_limit_applies_and_a_bad_one_is_shown_in_the_form(stack: Stack) -> None:
    _drive(stack, "limits")


def test_finance_closes_a_month_downloads_the_csv_and_is_offered_no_admin_page(
    stack: Stack,
) -> None:
    _drive(stack, "finance")
