"""The inventory PUT received by a real control plane process (fleet-core's apiserver).

fleet-core runs as a subprocess, started by module name; the test imports nothing of it (P7).
Without a database the apiserver keeps inventory in memory, validating with the contract. The
operator reports with an ``operator`` credential for its cluster, issued by the control plane's
admin as a deployment would (docs/security.md), and handed to it in a file. Each test runs against
kmock and against a real API server (``cluster``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fleet_testing import processes
from fleet_testing.bindings import bind_cluster
from fleet_testing.waiting import eventually

from .cluster import Cluster
from .conftest import FM, NODES, StartOperator, cpu_node, fleetmodel, issue_credential
from .conftest import gpu_node as a_gpu_node

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


@pytest.fixture
async def control_plane(tmp_path: Path, admin_token: str) -> AsyncIterator[str]:
    """A control plane process without a database: it keeps inventory in memory."""
    with processes.processes(tmp_path) as procs:
        env = {"FLEET_ADMIN_TOKEN": admin_token}
        yield await asyncio.to_thread(processes.control_plane, procs, env)


async def operator_credential(control_plane: str, admin_token: str, cluster: str) -> str:
    """What an admin does once per cluster: ``POST /api/v1/credentials`` for its operator."""
    body = {"role": "operator", "label": f"operator of {cluster}", "clusterId": cluster}
    return await issue_credential(control_plane, admin_token, body)


async def until_reported(url: str, token: str, *, within: float = 20.0) -> dict[str, Any]:
    """GET the cluster from the control plane until its report lists a deployment."""
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session:

        async def reported() -> dict[str, Any] | None:
            async with session.get(url) as response:
                body = await response.json() if response.status == 200 else {}
            return dict(body["report"]) if body.get("report", {}).get("deployments") else None

        return await eventually(
            reported, within=within, what=f"a report with a deployment at {url}"
        )


async def test_a_real_control_plane_accepts_the_report(
    cluster: Cluster, control_plane: str, start_operator: StartOperator, admin_token: str
) -> None:
    await cluster.create(NODES, a_gpu_node("gpu-1", gpus=4))
    await cluster.create(NODES, cpu_node("cpu-1"))
    token = await operator_credential(control_plane, admin_token, "test")
    await asyncio.to_thread(bind_cluster, control_plane, admin_token, "test", ["gemma"])
    await start_operator(control_plane, "--report-interval=30s", token=token)
    await cluster.create(FM, fleetmodel("gemma", engine="llamacpp", weightFormat="gguf",
                                    gpusPerReplica=0))  # fmt: skip
    report = await until_reported(f"{control_plane}/api/v1/clusters/test", admin_token)
    assert sorted(n["name"] for n in report["nodes"]) == ["cpu-1", "gpu-1"]
    (gpu_node,) = [n for n in report["nodes"] if n["name"] == "gpu-1"]
    assert gpu_node["gpus"][0]["count"] == 4
    (model,) = report["deployments"]
    assert (model["servedModelName"], model["engine"], model["weightFormat"]) == (
        "gemma", "llamacpp", "gguf"
    )  # fmt: skip


async def test_an_operator_without_a_valid_credential_changes_nothing(
    cluster: Cluster, control_plane: str, start_operator: StartOperator, admin_token: str
) -> None:
    """Another cluster's credential, or a made-up one, is refused (403, 401 in the apiserver's
    tests): both operators keep retrying, and nothing lands."""
    await cluster.create(NODES, cpu_node("cpu-1"))
    other = await operator_credential(control_plane, admin_token, "elsewhere")
    first = await start_operator(control_plane, "--report-interval=1s", token=other)
    second = await start_operator(control_plane, "--report-interval=1s", token="fsc_made_up")
    await cluster.create(FM, fleetmodel("gemma", engine="llamacpp", weightFormat="gguf",
                                    gpusPerReplica=0))  # fmt: skip
    for operator in (first, second):
        for _ in range(300):
            if "inventory PUT failed" in operator.output():
                break
            await asyncio.sleep(0.05)
        assert "inventory PUT failed" in operator.output()
        assert "fsc_" not in operator.output()  # no credential reaches a log line
    headers = {"Authorization": f"Bearer {admin_token}"}
    async with (
        aiohttp.ClientSession(headers=headers) as session,
        session.get(f"{control_plane}/api/v1/inventory") as response,
    ):
        assert (await response.json())["data"] == []


def mig_node(name: str) -> dict[str, Any]:
    """An H100 node under the device plugin's mixed strategy: one whole card, one cut in seven."""
    node = a_gpu_node(name, gpus=1, major=9, minor=0)
    node["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-H100-80GB-HBM3"
    node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] = "7"
    node["status"]["capacity"] = node["status"]["allocatable"]
    return node


async def test_a_mig_fleet_is_reported_and_priced_by_the_card(
    cluster: Cluster, control_plane: str, start_operator: StartOperator, admin_token: str
) -> None:
    await cluster.create(NODES, mig_node("h100-1"))
    token = await operator_credential(control_plane, admin_token, "test")
    await asyncio.to_thread(bind_cluster, control_plane, admin_token, "test", ["qwen"])
    await start_operator(control_plane, "--report-interval=30s", token=token)
    await cluster.create(FM, fleetmodel("qwen", accelerator={"migProfile": "1g.10gb"}))
    url = f"{control_plane}/api/v1/clusters/test"
    report = await until_reported(url, admin_token)
    (model,) = report["deployments"]
    assert model["accelerator"] == "nvidia.com/mig-1g.10gb"
    assert model["gpuShare"] == {"numerator": 1, "denominator": 7}
    (gpu,) = report["nodes"][0]["gpus"]
    assert gpu["migSlices"] == [
        {"profile": "1g.10gb", "count": 7, "share": {"numerator": 1, "denominator": 7}}
    ]
    auth = {"Authorization": f"Bearer {admin_token}"}
    async with aiohttp.ClientSession(headers=auth) as http, http.get(url) as response:
        summary = (await response.json())["summary"]
    assert summary["cards"] == "2"  # the whole card, and seven sevenths of the other
