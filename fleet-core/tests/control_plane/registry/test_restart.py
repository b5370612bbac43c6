"""A pull interrupted by a control-plane restart resumes (finished files are not fetched again; the
unfinished one continues with a Range request where the store kept its bytes) or, with resume off,
is Failed with the reason — never left Pulling."""

from __future__ import annotations

import httpx

from fleet_core.control_plane.registry.objects import DirectoryStore, ObjectStore

from .conftest import ControlPlaneFactory, HubUnderTest, events

SMALL_FILES = 171 + 599  # config.json + tokenizer.json of the slow repository


async def interrupt_a_pull(start_control_plane: ControlPlaneFactory) -> int:
    """Pulls ``fleet/slow`` until over 1 MiB of its weights arrived, then stops the control plane;
    returns the bytes done it last reported."""
    plane = await start_control_plane()
    async with httpx.AsyncClient(base_url=plane.url, headers=plane.headers, timeout=30) as http:
        body = {"id": "slow", "source": {"uri": "hf://fleet/slow"}}
        assert (await http.post("/api/v1/models", json=body)).status_code == 201
        assert (await http.post("/api/v1/models/slow/pull")).status_code == 202
        done = 0
        async for progress in events(http, "slow"):
            done = progress["bytesDone"]
            if done > SMALL_FILES + (1 << 20):
                break
    await plane.stop()
    return done


async def test_a_pull_interrupted_by_a_restart_resumes(
    start_control_plane: ControlPlaneFactory, hub: HubUnderTest, objects: ObjectStore
) -> None:
    await interrupt_a_pull(start_control_plane)
    plane = await start_control_plane()
    async with httpx.AsyncClient(base_url=plane.url, headers=plane.headers, timeout=30) as http:
        resumed = await http.get("/api/v1/models/slow")
        assert resumed.json()["status"] == "Pulling"
        async for _ in events(http, "slow"):
            pass
        model = (await http.get("/api/v1/models/slow")).json()
    assert model["status"] == "Ready", model["reason"]
    asked = [(r.file, r.range) for r in hub.hub.requests if r.repo == "fleet/slow"]
    assert asked.count(("config.json", None)) == 1
    assert asked.count(("tokenizer.json", None)) == 1
    weights = [rng for name, rng in asked if name == "model.safetensors"]
    assert len(weights) == 2
    assert weights[0] is None
    if isinstance(objects, DirectoryStore):  # kept the partial file: only the rest is fetched
        assert weights[1] is not None
        assert int(weights[1].split("=")[1].rstrip("-")) > 1 << 20
    else:  # a multipart upload cannot be resumed through the SDK: the file starts again
        assert weights[1] is None
    assert await objects.keys(".partial/") == []


async def test_with_resume_off_an_interrupted_pull_is_failed_with_the_reason(
    start_control_plane: ControlPlaneFactory, objects: ObjectStore
) -> None:
    await interrupt_a_pull(start_control_plane)
    plane = await start_control_plane(resume_on_start=False)
    async with httpx.AsyncClient(base_url=plane.url, headers=plane.headers, timeout=30) as http:
        model = (await http.get("/api/v1/models/slow")).json()
        assert model["status"] == "Failed"
        assert "interrupted by a control-plane restart" in model["reason"]
        assert await objects.keys("models/slow/") == []
        again = await http.post("/api/v1/models/slow/pull")  # Failed → a new pull may start
        assert again.json()["status"] == "Pulling"
