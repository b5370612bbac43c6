"""ADR 0010's acceptance test: the gateway serves a chat through a discovered, operator-rendered
engine, by sharing the namespace's ``fleet-engine-key`` Secret with it.

The engine's Deployment is rendered by the operator's own code; its engine container's key
variable is resolved from the Secret as the kubelet would, and the stub engine (which, like vLLM
and llama-server, requires that variable's key on ``/v1``) runs with it on loopback. The operator's
own ``ClusterView`` builds the inventory report, PUT with an ``operator`` credential to a real
control plane on Postgres. A real gateway in discovery mode then serves the model to the official
``openai`` SDK — with ``FLEET_ENGINE_KEY_FILE``, the same Secret's file; without it, the engine's
401 is what a client gets (the failure before ADR 0010).

fleet-core runs as subprocesses, started by module name; nothing of it is imported (P7).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from fleet_contract import encode_report
from fleet_serving import profiles, rendering
from fleet_serving.spec import decode_spec
from fleet_serving.view import ClusterView
from fleet_testing import processes
from fleet_testing.bindings import bind_cluster, cluster_engine_key
from fleet_testing.processes import Processes
from fleet_testing.waiting import eventually

from .conftest import cpu_node, fleetmodel, issue_credential
from .test_control_plane_e2e import operator_credential

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

MODEL = "gemma"
NAMESPACE = "models"


def rendered_engine(model: dict[str, Any]) -> dict[str, Any]:
    """The engine container of the Deployment the operator renders for ``model``."""
    spec = decode_spec(model["spec"])
    owner = rendering.Owner(name=MODEL, namespace=NAMESPACE, uid="uid-1")
    deployment = rendering.deployment(owner, spec, profiles.profile_for(spec.engine))
    (container,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "engine"
    ]
    return dict(container)


def kubelet_env(container: dict[str, Any], secrets_: dict[str, dict[str, str]]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: every ``secretKeyRef`` resolved
    from the namespace's Secrets (a missing one is CreateContainerConfigError)."""
    env: dict[str, str] = {}
    for var in container["env"]:
        ref = (var.get("valueFrom") or {}).get("secretKeyRef")
        if ref is not None:
            env[var["name"]] = secrets_[ref["name"]][ref["key"]]
        elif "value" in var:
            env[var["name"]] = var["value"]
    return env


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    """The processes this test starts (engine, control plane, gateways), stopped at its end."""
    with processes.processes(tmp_path) as started:
        yield started


async def report_as_the_operator(control_plane: str, token: str, model: dict[str, Any],
                                 engine_port: int) -> None:  # fmt: skip
    """The operator's view of the cluster — the FleetModel, its ready Deployment and the
    EndpointSlice naming the engine pod (here on loopback) — PUT as its inventory report."""
    view = ClusterView()
    view.put_node(cpu_node("cpu-1"), deleted=False)
    view.put_model(model, deleted=False)
    key = (NAMESPACE, MODEL)
    status = {"observedGeneration": 1, "updatedReplicas": 1, "readyReplicas": 1}
    deployment = {"metadata": {"generation": 1}, "spec": {"replicas": 1}, "status": status}
    view.put_deployment(key, deployment, deleted=False)
    pod = {"addresses": ["127.0.0.1"], "conditions": {"ready": True}}
    endpoint_slice = {"ports": [{"name": "http", "port": engine_port}], "endpoints": [pod]}
    view.put_slice((NAMESPACE, f"{MODEL}-abcde"), MODEL, endpoint_slice, deleted=False)
    report = view.report(cluster_id="test", now=datetime.now(UTC))
    assert report.deployments[0].endpoints[0].ready
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession(headers=headers) as session,
        session.put(f"{control_plane}/api/v1/inventory", data=encode_report(report)) as response,
    ):
        assert response.status < 300, await response.text()


@asynccontextmanager
async def discovered_engine(
    procs: Processes, postgres_url: str, admin_token: str, fleet_secret: str
) -> AsyncIterator[tuple[str, str, dict[str, Any]]]:
    """A rendered engine running with its Secret's key — cluster ``test``'s key, derived from
    the fleet engine secret (ADR 0020) — reported to a control plane on Postgres that binds the
    cluster to it; yields the control plane's URL, a gateway credential and the engine
    container."""
    model = fleetmodel(MODEL, engine="llamacpp", weightFormat="gguf", gpusPerReplica=0)
    model["metadata"] = {"name": MODEL, "namespace": NAMESPACE, "generation": 1}
    container = rendered_engine(model)
    cluster_key = cluster_engine_key(fleet_secret, "test")
    env = kubelet_env(container, {"fleet-engine-key": {"api-key": cluster_key}})
    args = ["--model", MODEL, "--profile", "llamacpp"]
    engine = await asyncio.to_thread(processes.stub_engine, procs, args, env=env)
    engine_port = int(engine.rsplit(":", 1)[1])
    plane = {"FLEET_DATABASE_URL": postgres_url, "FLEET_ADMIN_TOKEN": admin_token}
    control_plane = await asyncio.to_thread(processes.control_plane, procs, plane)
    operator = await operator_credential(control_plane, admin_token, "test")
    await asyncio.to_thread(bind_cluster, control_plane, admin_token, "test", [MODEL])
    await report_as_the_operator(control_plane, operator, model, engine_port)
    gateway = await issue_credential(control_plane, admin_token, {"role": "gateway", "label": "gw"})
    yield control_plane, gateway, container


async def gateway_client(
    procs: Processes, env: dict[str, str], name: str
) -> tuple[openai.AsyncOpenAI, Path]:
    url = await asyncio.to_thread(processes.gateway, procs, env, name=name)
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=20)

    async def discovered() -> bool:  # discovery polls the control plane every second
        return [m.id async for m in client.models.list()] == [MODEL]

    await eventually(discovered, within=20, what=f"the gateway {name} discovering {MODEL}")
    return client, procs.logs / f"{name}.log"


def chat(client: openai.AsyncOpenAI) -> Awaitable[Any]:
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=8
    )


async def test_the_gateway_serves_a_discovered_operator_rendered_engine_with_the_namespace_key(
    procs: Processes, postgres_url: str, admin_token: str, tmp_path: Path
) -> None:
    engine_key = secrets.token_hex(32)
    async with discovered_engine(procs, postgres_url, admin_token, engine_key) as found:
        control_plane, token, container = found
        # The operator's default: the namespace's fleet-engine-key Secret, key api-key.
        (key_var,) = [v for v in container["env"] if v["name"] == "LLAMA_API_KEY"]
        assert key_var["valueFrom"]["secretKeyRef"] == {
            "name": "fleet-engine-key",
            "key": "api-key",
        }
        mounted = tmp_path / "fleet-engine-key" / "api-key"  # the gateway's, mounted read-only
        mounted.parent.mkdir()
        mounted.write_text(engine_key)
        discovery = {"FLEET_CONTROL_PLANE_URL": control_plane, "FLEET_CONTROL_PLANE_TOKEN": token}
        keyed = discovery | {"FLEET_ENGINE_KEY_FILE": str(mounted)}
        client, log = await gateway_client(procs, keyed, "gateway")
        reply = await chat(client)
        assert reply.choices[0].message.content
        assert reply.usage is not None
        assert reply.usage.completion_tokens > 0
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
        )
        assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        await client.close()

        # Today's main: the same discovered engine, no key file — the engine's 401 reaches the
        # client although /v1/models lists the model (health needs no key).
        keyless, keyless_log = await gateway_client(procs, discovery, "gateway-keyless")
        with pytest.raises(openai.APIStatusError) as refused:
            await chat(keyless)
        await keyless.close()
    assert refused.value.status_code == 401, refused.value
    assert "engine's key" in str(refused.value.body)  # the stub engine's answer, passed through
    for text in (log.read_text(), keyless_log.read_text()):
        assert engine_key not in text  # the key never reaches a log line


@pytest.mark.parametrize("content", [None, ""])
def test_a_named_but_unusable_engine_key_file_refuses_to_start(
    tmp_path: Path, content: str | None
) -> None:
    path = tmp_path / "api-key"
    if content is not None:
        path.write_text(content)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env |= {"FLEET_ENGINE_KEY_FILE": str(path)}
    argv = [sys.executable, "-m", "fleet_core.gateway", "--demo", "--listen", "127.0.0.1:0"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "FLEET_ENGINE_KEY_FILE" in line
    assert str(path) in line
