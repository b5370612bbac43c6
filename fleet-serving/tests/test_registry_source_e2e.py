"""A FleetModel whose source is a registry model, end to end across both services.

A real ``fleet-apiserver`` process (Postgres, the synthetic hub, a directory object store) and a
real ``fleet-serving run`` process against kmock, then against a real API server (``cluster``).
The operator waits while the model is not Ready, then renders an init container whose script is
run here, for real, against the control plane: the files it fetches must be the registry's, byte
for byte. fleet-core is started by module name and read only over HTTP and the contract (P7).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fleet_testing import processes
from fleet_testing.bindings import bind_cluster
from fleet_testing.fix_s3 import S3Server
from fleet_testing.waiting import eventually

from .cluster import Cluster
from .conftest import FM, NODES, StartOperator, cpu_node, fleetmodel

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


@pytest.fixture(params=["directory", "s3"])
def store_env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """The control plane's object store: a directory (files stream through the control plane),
    or SeaweedFS with a download endpoint (downloads are redirected to presigned URLs)."""
    if request.param == "directory":
        return {"FLEET_MODELS_DIR": str(tmp_path / "objects")}
    server: S3Server = request.getfixturevalue("s3_server")
    return {
        "FLEET_S3_ENDPOINT": server.endpoint,
        "FLEET_S3_BUCKET": request.getfixturevalue("s3_bucket"),
        "FLEET_S3_ACCESS_KEY": server.access_key,
        "FLEET_S3_SECRET_KEY": server.secret_key,
        "FLEET_S3_USE_SSL": "false",
        "FLEET_S3_DOWNLOAD_ENDPOINT": server.endpoint,
    }


@pytest.fixture
async def control_plane(
    postgres_url: str, store_env: dict[str, str], tmp_path: Path, admin_token: str
) -> AsyncIterator[str]:
    """The control plane, pulling from the synthetic hub (both processes), as make dev runs them."""
    with processes.processes(tmp_path) as procs:
        hub = await asyncio.to_thread(processes.hub, procs)
        env = {"FLEET_DATABASE_URL": postgres_url, "FLEET_HUB_URL": hub}
        env |= {**store_env, "FLEET_ADMIN_TOKEN": admin_token}
        yield await asyncio.to_thread(processes.control_plane, procs, env)


async def call(method: str, url: str, body: Any = None, *, token: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession(headers=headers) as session,
        session.request(method, url, json=body) as r,
    ):
        assert r.status < 300, await r.text()
        return dict(await r.json())


async def credential(control_plane: str, admin_token: str, role: str, **fields: str) -> str:
    """A service credential an admin issues (the operator's and the engines' Secrets hold them)."""
    body = {"role": role, "label": role, **fields}
    issued = await call("POST", f"{control_plane}/api/v1/credentials", body, token=admin_token)
    return str(issued["secret"])


async def register_tiny(control_plane: str, admin_token: str) -> str:
    """Model ``tiny`` (GGUF weights on the synthetic hub) registered, not pulled; the URL of the
    registry's models."""
    models = f"{control_plane}/api/v1/models"
    body = {"id": "tiny", "source": {"uri": "hf://fleet/tiny-gguf"}}
    await call("POST", models, body, token=admin_token)
    return models


async def operate(start_operator: StartOperator, control_plane: str, admin_token: str) -> None:
    """``fleet-serving run`` for cluster ``test``, bound to the models these tests apply, on an
    operator credential of its own."""
    served = ["tiny", "ghost", "wrong"]
    await asyncio.to_thread(bind_cluster, control_plane, admin_token, "test", served)
    operator = await credential(control_plane, admin_token, "operator", clusterId="test")
    await start_operator(control_plane, "--resync=1s", "--report-interval=30s", token=operator)


async def run_fetch(
    container: dict[str, Any], model_dir: Path, secrets: dict[tuple[str, str], str]
) -> str:
    """Run the init container's command and args here, as its image would, with the values of
    the Secrets its environment refers to."""
    env = {"PATH": "/usr/bin:/bin"}
    for entry in container["env"]:
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        env[entry["name"]] = secrets[(ref["name"], ref["key"])] if ref else entry["value"]
    env["MODEL_DIR"] = str(model_dir)
    process = await asyncio.create_subprocess_exec(
        *container["command"], *container["args"], env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await process.communicate()
    assert process.returncode == 0, out.decode()
    return out.decode()


def waiting_for_weights(cluster: Cluster, name: str) -> dict[str, Any] | None:
    status = cluster.phase_of(name, "Pending")
    return status if status and status["reason"] == "WeightsNotReady" else None


def write_bytes(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_a_registry_model_is_served_once_ready_from_files_the_control_plane_sends(
    cluster: Cluster,
    control_plane: str,
    start_operator: StartOperator,
    tmp_path: Path,
    admin_token: str,
) -> None:
    models = await register_tiny(control_plane, admin_token)
    admin = {"token": admin_token}
    await cluster.create(NODES, cpu_node("cpu-1"))
    engine_token = await credential(control_plane, admin_token, "engine")
    await operate(start_operator, control_plane, admin_token)
    spec = {"engine": "llamacpp", "weightFormat": "gguf", "gpusPerReplica": 0}
    await cluster.create(FM, fleetmodel("tiny", source={"registry": "tiny"}, **spec))
    await cluster.create(FM, fleetmodel("ghost", source={"registry": "ghost"}, **spec))

    # Registered, not pulled: the model waits, and nothing is rendered.
    waiting = await eventually(lambda: waiting_for_weights(cluster, "tiny"), within=20)
    assert "registry model 'tiny' is Registered" in waiting["message"]
    ghost = await eventually(lambda: waiting_for_weights(cluster, "ghost"), within=20)
    assert "registry model 'ghost' does not exist" in ghost["message"]
    assert cluster.live("deployments", "tiny") is None

    # Pulled: the operator notices on its own (retry), and renders the fetch.
    await call("POST", f"{models}/tiny/pull", **admin)
    for _ in range(200):
        model = await call("GET", f"{models}/tiny", **admin)
        if model["status"] != "Pulling":
            break
        await asyncio.sleep(0.05)
    assert model["status"] == "Ready", model["reason"]
    deployment = await eventually(lambda: cluster.live("deployments", "tiny"), within=30)
    pod = deployment["spec"]["template"]["spec"]
    (fetch,) = pod["initContainers"]
    engine = pod["containers"][0]
    assert engine["args"][:2] == ["--model", "/models/tiny-q8_0.gguf"]
    assert all(url.startswith(f"{models}/tiny/files/") for url in fetch["args"][1::3])

    fetched = tmp_path / "pod-models"
    fetched.mkdir()
    # An earlier attempt was cut off halfway: the script resumes it (curl -C -, a Range request;
    # had the control plane ignored the Range, curl would have failed "cannot resume").
    gguf_url = f"{models}/tiny/files/tiny-q8_0.gguf"
    engine_auth = {"Authorization": f"Bearer {engine_token}"}
    async with (
        aiohttp.ClientSession() as session,
        session.get(gguf_url, headers=engine_auth) as response,
    ):
        gguf = await response.read()
    write_bytes(fetched / "tiny-q8_0.gguf.partial", gguf[: len(gguf) // 2])
    await run_fetch(fetch, fetched, {("fleet-engine-token", "token"): engine_token})
    stored = {f["path"]: f["sha256"] for f in model["facts"]["files"]}
    assert {p: sha256_of(fetched / p) for p in stored} == stored
    status = await eventually(
        lambda: (s := cluster.phase_of("tiny", "Pending")) and s["reason"] == "Starting" and s,
        within=20,
    )
    assert status["message"] == "0/1 replicas ready"

    # The report names the registry model, so the control plane refuses to delete it in use.
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            reported = await call("GET", f"{control_plane}/api/v1/clusters/test", **admin)
            report = reported["report"]
            if {d["name"]: d.get("registryModel") for d in report["deployments"]}.get("tiny"):
                break
            await asyncio.sleep(0.05)
        assert {d["name"]: d.get("registryModel") for d in report["deployments"]} == {
            "tiny": "tiny",
            "ghost": "ghost",
        }
        async with session.delete(
            f"{models}/tiny", headers={"Authorization": f"Bearer {admin_token}"}
        ) as refused:
            answer = await refused.json()
    assert refused.status == 409, answer
    assert f"test/{cluster.namespace}/tiny" in answer["error"]["message"]


async def test_a_registry_model_in_the_wrong_format_fails_with_the_reason(
    cluster: Cluster,
    control_plane: str,
    start_operator: StartOperator,
    admin_token: str,
) -> None:
    models = await register_tiny(control_plane, admin_token)
    await call("POST", f"{models}/tiny/pull", token=admin_token)
    await operate(start_operator, control_plane, admin_token)
    await cluster.create(FM, fleetmodel("wrong", source={"registry": "tiny"}))  # vLLM, safetensors
    status = await eventually(lambda: cluster.phase_of("wrong", "Failed"), within=30)
    assert status["message"] == (
        "registry model 'tiny' holds gguf weights, but the spec says weightFormat safetensors"
    )
    assert cluster.live("deployments", "wrong") is None
