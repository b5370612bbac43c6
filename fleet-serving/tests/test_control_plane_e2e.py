"""The inventory PUT received by a real control plane process (fleet-core's apiserver).

fleet-core runs as a subprocess, started by module name; the test imports nothing of it (P7).
Without a database the apiserver keeps inventory in memory, validating with the contract.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from .conftest import FM, NODES, Api, StartOperator, cpu_node, fleetmodel, free_port
from .conftest import gpu_node as a_gpu_node

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def control_plane(tmp_path: Path) -> AsyncIterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "apiserver.log").open("wb")
    argv = [sys.executable, "-m", "fleet_core.apiserver", "--listen", f"127.0.0.1:{port}"]
    # No database: the apiserver keeps inventory in memory (whatever FLEET_* this shell has).
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=log, stderr=subprocess.STDOUT, env=env
    )
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(400):
                assert process.returncode is None, (tmp_path / "apiserver.log").read_text()
                try:
                    async with session.get(f"{url}/healthz") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.05)
        yield url
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), timeout=10)
        log.close()


async def until_reported(url: str, *, within: float = 20.0) -> dict[str, Any]:
    """GET the cluster from the control plane until its report lists a deployment."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    async with aiohttp.ClientSession() as session:
        while loop.time() < deadline:
            async with session.get(url) as response:
                body = await response.json() if response.status == 200 else {}
            if body.get("report", {}).get("deployments"):
                return dict(body["report"])
            await asyncio.sleep(0.05)
    raise AssertionError(f"no report with a deployment at {url} within {within}s")


async def test_a_real_control_plane_accepts_the_report(
    api: Api, control_plane: str, start_operator: StartOperator
) -> None:
    await api.create(NODES, a_gpu_node("gpu-1", gpus=4))
    await api.create(NODES, cpu_node("cpu-1"))
    await start_operator(control_plane, "--report-interval=30s")
    await api.create(FM, fleetmodel("gemma", engine="llamacpp", weightFormat="gguf",
                                    gpusPerReplica=0))  # fmt: skip
    report = await until_reported(f"{control_plane}/api/v1/clusters/test")
    assert sorted(n["name"] for n in report["nodes"]) == ["cpu-1", "gpu-1"]
    (gpu_node,) = [n for n in report["nodes"] if n["name"] == "gpu-1"]
    assert gpu_node["gpus"][0]["count"] == 4
    (model,) = report["deployments"]
    assert (model["servedModelName"], model["engine"], model["weightFormat"]) == (
        "gemma", "llamacpp", "gguf"
    )  # fmt: skip
