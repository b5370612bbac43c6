"""``fleet models pull|list|show`` as a real process against a real control plane; Ctrl-C (SIGINT)
during a pull cancels it on the control plane."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import httpx
import pytest

from .conftest import ControlPlane, ControlPlaneFactory, HubUnderTest, events

directory_only = pytest.mark.parametrize("object_store", ["directory"], indirect=True)


async def fleet(plane: ControlPlane, *args: str) -> asyncio.subprocess.Process:
    """The CLI, with its token in FLEET_TOKEN (as ``make dev``'s .dev/admin-token would be)."""
    token = plane.headers["Authorization"].removeprefix("Bearer ")
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fleet_core.cli.models", "--api", plane.url, "models", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "FLEET_TOKEN": token},
    )  # fmt: skip


async def output(process: asyncio.subprocess.Process) -> tuple[int, str]:
    out, _ = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode()


@directory_only
async def test_pull_list_and_show(start_control_plane: ControlPlaneFactory) -> None:
    plane = await start_control_plane()
    code, text = await output(await fleet(plane, "pull", "hf://fleet/tiny-safetensors"))
    assert code == 0, text
    assert "tiny-safetensors: Ready" in text
    code, text = await output(await fleet(plane, "pull", "hf://fleet/tiny-safetensors"))
    assert (code, "already Ready" in text) == (0, True)
    code, text = await output(await fleet(plane, "list"))
    assert code == 0
    assert "tiny-safetensors" in text
    assert "Ready" in text
    code, text = await output(await fleet(plane, "show", "tiny-safetensors"))
    assert code == 0
    assert '"architecture": "LlamaForCausalLM"' in text
    code, text = await output(await fleet(plane, "show", "nope"))
    assert code == 1
    assert "no model 'nope'" in text


@directory_only
async def test_ctrl_c_cancels_the_pull(
    start_control_plane: ControlPlaneFactory, hub: HubUnderTest
) -> None:
    plane = await start_control_plane()
    async with httpx.AsyncClient(base_url=plane.url, headers=plane.headers, timeout=30) as http:
        body = {"id": "slow", "source": {"uri": "hf://fleet/slow"}}
        assert (await http.post("/api/v1/models", json=body)).status_code == 201
        process = await fleet(plane, "pull", "hf://fleet/slow")
        await hub.hub.requested.wait()  # the CLI's pull has started
        async for progress in events(http, "slow"):
            if progress["bytesDone"] > 800:
                break
        process.send_signal(signal.SIGINT)
        code, text = await output(process)
        assert code == 1, text
        assert "slow: Cancelled" in text
        model = (await http.get("/api/v1/models/slow")).json()
        assert model["status"] == "Cancelled"
