"""A compromised cluster steers only its own cluster (ADR 0020), on the real Kubernetes path.

Two clusters report to one control plane on Postgres. ``c1`` is honest: bound to ``gemma`` on
loopback, its engine runs with c1's engine key. ``test`` is compromised: whoever holds it runs the
real operator against a real kube-apiserver and creates FleetModels claiming c1's model name and
Qwen, served from an address of their choosing — a trap that records every request it gets —
then uses the operator's credential directly to try every field of the inventory report. A real
gateway in discovery mode, holding the fleet engine secret, serves tenants meanwhile.

Nothing outside ``test``'s binding lands: its reports are refused naming the field and audited,
the endpoints document lists c1's engine only, the gateway never sends the trap a request or a
key, and the chat goes to c1's engine, which accepts c1's key.

fleet-core runs as subprocesses, started by module name; nothing of it is imported (P7).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from fleet_testing import processes
from fleet_testing.bindings import bind_cluster, cluster_engine_key
from fleet_testing.processes import Processes
from fleet_testing.waiting import eventually

from .cluster import Cluster
from .conftest import FM, NODES, StartOperator, cpu_node, fleetmodel, issue_credential
from .test_control_plane_e2e import operator_credential

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

QWEN = "Qwen/Qwen2.5-7B-Instruct"
TRAP_IP = "127.0.0.77"  # the pods the attacker "serves" run here; port 8000 (the vLLM profile)


class Trap:
    """An HTTP server that answers like an engine and records whatever reaches it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append((request.path, request.headers.get("Authorization", "")))
        return web.json_response({"object": "list", "data": [{"id": QWEN}]})


@pytest.fixture
async def trap() -> AsyncIterator[Trap]:
    found = Trap()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", found.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, TRAP_IP, 8000).start()
    yield found
    await runner.cleanup()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    with processes.processes(tmp_path) as started:
        yield started


def report(cluster: str, *, at: datetime | None = None, **deployment: Any) -> dict[str, Any]:
    """A report of one CPU node and one ready deployment (``deployment`` overrides fields)."""
    base = {"name": "gemma", "namespace": "default", "servedModelName": "gemma",
            "engine": "llamacpp", "weightFormat": "gguf", "gpusPerReplica": 0,
            "desiredReplicas": 1, "readyReplicas": 1, "phase": "Ready",
            "endpoints": []}  # fmt: skip
    return {
        "schemaVersion": 1,
        "clusterId": cluster,
        "observedAt": (at or datetime.now(UTC)).isoformat(),
        "reporterVersion": "test",
        "nodes": [{"name": "cpu-1", "ready": True, "schedulable": True, "gpus": []}],
        "deployments": [base | deployment],
    }


async def put(session: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, dict[str, Any]]:
    async with session.put(f"{url}/api/v1/inventory", json=body) as response:
        return response.status, await response.json()


def trap_url(path: str = "") -> str:
    return f"http://{TRAP_IP}:8000{path}"


HOSTILE = [
    # (what the attacker changes, the report's body, the status, the field named)
    ("another cluster's id", {"clusterId": "c1"}, 403, "clusterId"),
    ("c1's model name", {"servedModelName": "gemma", "endpoints": [trap_url()]}, 403,
     "deployments[0].servedModelName"),
    ("an unbound model name", {"servedModelName": QWEN}, 403, "deployments[0].servedModelName"),
    ("its own model at the trap", {"servedModelName": "tiny", "endpoints": [trap_url()]}, 403,
     "deployments[0].endpoints[0].url"),
    ("credentials in the URL", {"servedModelName": "tiny",
                                "endpoints": [f"http://10.99.0.5@{TRAP_IP}:8000"]}, 403,
     "deployments[0].endpoints[0].url"),
    ("a path in the URL", {"servedModelName": "tiny",
                           "endpoints": ["http://10.99.0.5:8000/../x"]}, 403,
     "deployments[0].endpoints[0].url"),
    ("a year ahead", {"servedModelName": "tiny", "at": timedelta(days=365)}, 400, "observedAt"),
    ("an hour back", {"servedModelName": "tiny", "at": timedelta(hours=-1)}, 400, "observedAt"),
    ("a million GPUs per replica", {"servedModelName": "tiny", "gpusPerReplica": 2**31}, 400,
     "deployments[0].gpusPerReplica"),
]  # fmt: skip


def hostile_body(change: dict[str, Any]) -> dict[str, Any]:
    change = dict(change)
    cluster = change.pop("clusterId", "test")
    at = datetime.now(UTC) + change.pop("at", timedelta())
    urls = change.pop("endpoints", [])
    endpoints = [{"url": u, "ready": True} for u in urls]
    return report(cluster, at=at, endpoints=endpoints, **change)


async def test_a_compromised_cluster_steers_nothing_outside_its_binding(
    real_cluster: Cluster,
    start_operator: StartOperator,
    procs: Processes,
    postgres_url: str,
    admin_token: str,
    trap: Trap,
    tmp_path: Path,
) -> None:
    plane = {"FLEET_DATABASE_URL": postgres_url, "FLEET_ADMIN_TOKEN": admin_token}
    control_plane = await asyncio.to_thread(processes.control_plane, procs, plane)
    fleet_secret = secrets.token_hex(32)

    # c1, honest: bound to gemma on loopback; its engine holds c1's key.
    c1_key = cluster_engine_key(fleet_secret, "c1")
    engine = await asyncio.to_thread(
        processes.stub_engine, procs, ["--model", "gemma", "--profile", "llamacpp"],
        env={"LLAMA_API_KEY": c1_key},
    )  # fmt: skip
    await asyncio.to_thread(bind_cluster, control_plane, admin_token, "c1", ["gemma"],
                            ["127.0.0.1/32"])  # fmt: skip
    c1 = await operator_credential(control_plane, admin_token, "c1")
    honest = report("c1", endpoints=[{"url": engine, "ready": True}])
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {c1}"}) as session:
        assert (await put(session, control_plane, honest))[0] == 200

    # test, compromised: bound to "tiny" in 10.99.0.0/16 only.
    await asyncio.to_thread(bind_cluster, control_plane, admin_token, "test", ["tiny"],
                            ["10.99.0.0/16"])  # fmt: skip
    stolen = await operator_credential(control_plane, admin_token, "test")

    # A gateway in discovery mode, with the fleet engine secret.
    key_file = tmp_path / "engine-secret"
    key_file.write_text(fleet_secret)
    gateway_token = await issue_credential(control_plane, admin_token,
                                           {"role": "gateway", "label": "gw"})  # fmt: skip
    env = {"FLEET_CONTROL_PLANE_URL": control_plane, "FLEET_CONTROL_PLANE_TOKEN": gateway_token,
           "FLEET_ENGINE_KEY_FILE": str(key_file)}  # fmt: skip
    url = await asyncio.to_thread(processes.gateway, procs, env)
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=20)

    async def gemma_discovered() -> bool:
        return [m.id async for m in client.models.list()] == ["gemma"]

    await eventually(gemma_discovered, within=20, what="the gateway discovering c1's gemma")

    # 1. The real operator, on a real kube-apiserver the attacker controls: FleetModels claiming
    # c1's name and Qwen, their pods "running" at the trap.
    await real_cluster.create(NODES, cpu_node("cpu-1"))
    operator = await start_operator(control_plane, "--report-interval=1s", token=stolen)
    for name, served in (("takeover", QWEN), ("gemma", "gemma")):
        await real_cluster.create(FM, fleetmodel(name, servedModelName=served))
        await eventually(lambda n=name: real_cluster.live("deployments", n), within=20)
        await real_cluster.serve(name, [TRAP_IP])

    def refused() -> bool:
        return "inventory PUT failed" in operator.output()

    await eventually(refused, within=20, what="the operator's report refused")

    # 2. The stolen credential by hand, field by field; and the admin's routes.
    headers = {"Authorization": f"Bearer {stolen}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        inside = hostile_body({"servedModelName": "tiny"})  # what it may do: lands
        assert (await put(session, control_plane, inside))[0] == 200
        for what, change, status, param in HOSTILE:
            got, body = await put(session, control_plane, hostile_body(change))
            assert got == status, (what, body)
            assert body["error"]["param"] == param, what
        binding = f"{control_plane}/api/v1/clusters/test/binding"
        grant = {"servedModels": [QWEN], "endpoints": ["0.0.0.0/0"]}
        async with session.put(binding, json=grant) as response:
            assert response.status == 403
        async with session.delete(f"{control_plane}/api/v1/clusters/c1") as response:
            assert response.status == 403

    # Several discovery polls and health rounds later: the trap saw nothing, chat goes to c1.
    await asyncio.sleep(3)
    assert sorted([m.id async for m in client.models.list()]) == ["gemma", "tiny"]
    reply = await client.chat.completions.create(
        model="gemma", messages=[{"role": "user", "content": "hello"}], max_tokens=4
    )
    assert reply.choices[0].message.content
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(
            model=QWEN, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    await client.close()
    assert trap.seen == []

    admin = {"Authorization": f"Bearer {admin_token}"}
    async with aiohttp.ClientSession(headers=admin) as session:
        async with session.get(f"{control_plane}/api/v1/endpoints") as response:
            document = await response.json()
        async with session.get(f"{control_plane}/api/v1/audit-events?limit=500") as response:
            trail = (await response.json())["data"]
        async with session.get(f"{control_plane}/api/v1/clusters/test") as response:
            landed = (await response.json())["report"]
    # Of the compromised cluster, only what its binding allows ever landed.
    assert [(d["servedModelName"], d["endpoints"]) for d in landed["deployments"]] == [("tiny", [])]
    offered = [(m["servedModelName"], m["clusterId"], [e["url"] for e in m["endpoints"]])
               for m in document["models"]]  # fmt: skip
    assert offered == [("gemma", "c1", [engine]), ("tiny", "test", [])]
    refusals = [e for e in trail if e["target"] == "/api/v1/clusters/test"
                and "refused" in e["action"]]  # fmt: skip
    assert len(refusals) >= len(HOSTILE) - 1  # all but clusterId=c1 (audited against c1)
    assert any(e["target"] == "/api/v1/clusters/c1" and "other_cluster" in e["action"]
               for e in trail)  # fmt: skip
    for text in (operator.output(), (procs.logs / "gateway.log").read_text()):
        assert fleet_secret not in text
        assert c1_key not in text
