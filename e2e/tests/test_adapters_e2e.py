"""A LoRA adapter served and billed end to end, on the real engine (ADR 0028).

All real, without a cluster: a LoRA adapter GGUF for Gemma 3 270M made with llama.cpp's gguf-py
(``e2e/engine/make_lora.py``), both imported into the registry with ``fleet models import``; the
operator's own code resolving them from the control plane and rendering the Deployment for a
FleetModel listing the adapter; that Deployment's fetch init containers' script run here (curl
and sha256sum against the control plane), and its engine container's exact arguments run as
``llama-server`` on loopback; the operator's view reporting the FleetModel (with its adapter)
to the control plane; the gateway in database mode discovering it, and the official OpenAI SDK
calling the adapter's name and the base's. The cluster path (kubelet, containerd, images) is
``test_fleetmodel_e2e.py``'s; what differs for adapters is all here.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import openai
import psycopg
import pytest

from fleet_contract import encode_report
from fleet_serving import profiles, rendering, sources
from fleet_serving.adapters import ResolvedAdapter
from fleet_serving.control_plane import WeightsClient
from fleet_serving.credentials import TokenFile
from fleet_serving.sources import RegistryWeights
from fleet_serving.spec import decode_spec
from fleet_serving.view import ClusterView
from fleet_testing import databases, engines, generation, processes, servers
from fleet_testing.bindings import binding_body, cluster_engine_key
from fleet_testing.fleet_system import (
    Api,
    import_model,
    random_token,
    start_control_plane,
    start_gateway,
    token_file,
)
from fleet_testing.ports import free_port
from fleet_testing.waiting import eventually_blocking

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

MODEL = "gemma-3-270m"
ADAPTER = "gemma-3-270m-shouty"
CLUSTER = "adapters-e2e"
NAMESPACE = "models"
RATES = {"inputFresh": 1000, "inputCached": 0, "output": 3000}
"""Units per million tokens, for the base only: the adapter is billed at them (ADR 0028)."""
ENGINE_ARGS = ["--no-jinja", "--chat-template", "gemma", "--threads", "1", "--ctx-size", "2048",
               "--parallel", "1"]  # fmt: skip


def fleetmodel() -> dict[str, Any]:
    spec = {
        "servedModelName": MODEL,
        "source": {"registry": MODEL},
        "weightFormat": "gguf",
        "engine": "llamacpp",
        "gpusPerReplica": 0,
        "engineArgs": ENGINE_ARGS,
        "adapters": [{"name": ADAPTER, "source": {"registry": ADAPTER}}],
    }
    meta = {"name": "gemma", "namespace": NAMESPACE, "uid": "uid-1", "generation": 1}
    return {"metadata": meta, "spec": spec}


@dataclass
class System:
    admin: Api
    database_url: str
    gateway: str
    api_key: str
    engine: engines.LlamaServer
    pod: dict[str, Any]

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.gateway}/v1", api_key=self.api_key, max_retries=0, timeout=120
        )

    def ledger(self) -> list[dict[str, Any]]:
        with psycopg.connect(self.database_url, row_factory=psycopg.rows.dict_row) as conn:
            return conn.execute("SELECT * FROM ledger ORDER BY received_at").fetchall()


async def _resolve(admin: Api, workdir: Path, model_id: str) -> RegistryWeights:
    """The operator's own call for a ``registry:`` source, with an operator credential."""
    credential = admin.credential("operator", clusterId=CLUSTER)
    token = token_file(workdir, f"operator-token-{model_id}", credential)
    async with aiohttp.ClientSession() as session:
        client = WeightsClient(session, admin.url, token=TokenFile(path=str(token)))
        return await client.resolve(model_id)


def rendered_pod(admin: Api, workdir: Path) -> dict[str, Any]:
    """The pod template the operator renders for the FleetModel, its sources resolved."""
    spec = decode_spec(fleetmodel()["spec"])
    profile = profiles.check(spec)
    base = asyncio.run(_resolve(admin, workdir, MODEL))
    sources.check(spec, base.weights)
    adapter = ResolvedAdapter(name=ADAPTER, index=0,
                              registry=asyncio.run(_resolve(admin, workdir, ADAPTER)))  # fmt: skip
    owner = rendering.Owner(name="gemma", namespace=NAMESPACE, uid="uid-1")
    deployment = rendering.deployment(owner, spec, profile, base, [adapter])
    return dict(deployment["spec"]["template"]["spec"])


def run_init_containers(pod: dict[str, Any], models: Path, engine_token: str) -> None:
    """Each fetch init container's command and arguments, as the pod would run them, into
    ``models`` (the model volume), with the engine credential its Secret holds."""
    for init in pod["initContainers"]:
        env = {"MODEL_DIR": str(models), "FLEET_ENGINE_TOKEN": engine_token, "HOME": str(models)}
        done = subprocess.run([*init["command"], *init["args"]], env=processes.clean_env(**env),
                              capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
        assert done.returncode == 0, f"{init['name']}: {done.stderr}"


def engine_argv(pod: dict[str, Any], models: Path, port: int) -> list[str]:
    """The engine container's arguments, with the volume's path and a loopback address."""
    (container,) = pod["containers"]
    args = [a.replace(profiles.MODEL_DIR, str(models), 1) for a in container["args"]]
    args[args.index("--host") + 1] = "127.0.0.1"
    args[args.index("--port") + 1] = str(port)
    return [str(engines.llama_server_binary()), *args]


def report(engine_url: str) -> bytes:
    """The operator's inventory report of the FleetModel, its one replica ready at the engine."""
    view = ClusterView()
    view.put_model(fleetmodel(), deleted=False)
    key = (NAMESPACE, "gemma")
    status = {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1, "observedGeneration": 1}
    view.put_deployment(key, {"metadata": {"generation": 1}, "spec": {"replicas": 1},
                              "status": status}, deleted=False)  # fmt: skip
    host, port = engine_url.removeprefix("http://").rsplit(":", 1)
    ready = {"addresses": [host], "conditions": {"ready": True}}
    endpoint_slice = {"ports": [{"name": "http", "port": int(port)}], "endpoints": [ready]}
    view.put_slice((NAMESPACE, "gemma-abcde"), "gemma", endpoint_slice, deleted=False)
    return encode_report(view.report(cluster_id=CLUSTER, now=datetime.now(UTC)))


def put_report(admin: Api, body: bytes) -> None:
    operator = admin.credential("operator", clusterId=CLUSTER)
    headers = {"Authorization": f"Bearer {operator}", "Content-Type": "application/json"}
    put = httpx.put(f"{admin.url}/api/v1/inventory", content=body, headers=headers, timeout=30)
    assert put.status_code == 200, put.text


@pytest.fixture(scope="module")
def system(
    postgres_server: servers.Server, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[System]:
    workdir = tmp_path_factory.mktemp("adapters")
    gguf = engines.gemma_gguf()
    lora = engines.lora_gguf(gguf, workdir / "shouty-lora.gguf")
    with contextlib.ExitStack() as stack:
        database_url = stack.enter_context(databases.scratch_database(postgres_server.url))
        procs = stack.enter_context(processes.processes(workdir))
        admin = start_control_plane(procs, database_url, random_token(), workdir / "objects")
        import_model(admin, gguf)
        import_model(admin, lora, ADAPTER)
        pod = rendered_pod(admin, workdir)
        models = workdir / "models"
        models.mkdir()
        run_init_containers(pod, models, admin.credential("engine"))
        fleet_secret = random_token()
        port = free_port()
        engine = stack.enter_context(engines.running_engine(
            engine_argv(pod, models, port), workdir, alias=MODEL,
            api_key=cluster_engine_key(fleet_secret, CLUSTER), port=port))  # fmt: skip
        admin.call("PUT", f"/api/v1/clusters/{CLUSTER}/binding",
                   binding_body([MODEL, ADAPTER], ["127.0.0.0/8"]))  # fmt: skip
        put_report(admin, report(engine.url))
        admin.call("PUT", f"/api/v1/model-rates/{MODEL}", RATES)
        key_file = token_file(workdir, "engine-key", fleet_secret)
        gateway = start_gateway(procs, admin, database_url, redis_url, key_file, workdir)
        yield System(admin, database_url, gateway, admin.api_key("e2e"), engine, pod)


def test_the_engine_runs_the_operators_args_with_the_adapter_loaded(system: System) -> None:
    args = system.pod["containers"][0]["args"]
    assert args[args.index("--lora") + 1] == "/models/adapters/0/shouty-lora.gguf"
    assert "--lora-init-without-apply" in args
    auth = {"Authorization": f"Bearer {system.engine.api_key}"}
    (loaded,) = httpx.get(f"{system.engine.url}/lora-adapters", headers=auth).json()
    assert loaded["id"] == 0
    assert loaded["path"].endswith("adapters/0/shouty-lora.gguf")
    # Its global scale is what the flag should have zeroed; this build leaves it at 1, which is
    # why the gateway turns adapters off in every base request (ADR 0028).
    print({"global scale": loaded["scale"]})


def test_the_adapters_name_answers_with_the_adapter_and_the_base_stays_unadapted(
    system: System,
) -> None:
    with system.client() as client:
        eventually_blocking(
            lambda: {MODEL, ADAPTER} <= {m.id for m in client.models.list()},
            within=30,
            what="the gateway routes the adapter",
        )
        base = generation.assert_generated_reply(generation.chat(client, MODEL, max_tokens=16),
                                                 max_tokens=16)  # fmt: skip
        adapted = generation.chat(client, ADAPTER, max_tokens=16)
        again = generation.chat(client, MODEL, max_tokens=16).choices[0].message.content
    text = adapted.choices[0].message.content
    assert text
    assert text != base  # the adapter's weights changed the greedy answer
    assert again == base  # and a base request after it is the base's again
    print({"base": base, "adapted": text})


def test_the_ledger_bills_the_adapter_under_its_name_at_its_bases_rate(system: System) -> None:
    def three() -> list[dict[str, Any]] | None:
        rows = system.ledger()
        return rows if len(rows) >= 3 else None

    rows = eventually_blocking(three, within=60, what="three ledger rows")
    assert [(r["model"], r["served_model"]) for r in rows] == [
        (MODEL, MODEL), (ADAPTER, ADAPTER), (MODEL, MODEL),
    ]  # fmt: skip
    for row in rows:
        assert (row["status"], row["outcome"], row["tenant"]) == (200, "ok", "e2e"), row
        assert row["endpoint"] == system.engine.url
        assert row["engine_prompt_tokens"] > 5
        assert row["engine_completion_tokens"] >= 1
        # No rate of its own: the adapter's units are its tokens at the base's rates (a wire
        # rate of N units per million tokens is N micro-units per token).
        fresh = row["prompt_tokens"] - row["cached_tokens"]
        assert (
            row["units"] == fresh * RATES["inputFresh"] + row["completion_tokens"] * RATES["output"]
        ), row
    usage = system.admin.call("GET", f"/api/v1/usage?model={ADAPTER}&groupBy=model")
    (adapter,) = usage["data"]
    billed = rows[1]
    assert (adapter["key"], adapter["requests"], adapter["units"]) == (ADAPTER, 1, billed["units"])
