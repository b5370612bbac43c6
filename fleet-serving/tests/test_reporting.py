"""The reporter against a loopback HTTP server: debounce, one PUT in flight, retry, heartbeat."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

import fleet_contract
from fleet_serving.reporting import Reporter, ReporterSettings, backoff_delay
from fleet_serving.view import ClusterView
from fleet_testing.ports import free_port

from .conftest import _node, fleetmodel, gpu_node, receiving_inventory

pytestmark = pytest.mark.timeout(30)


class ControlPlane:
    """Counts PUTs, how many overlap, and can fail or hold requests on demand."""

    def __init__(self) -> None:
        self.received: asyncio.Queue[fleet_contract.InventoryReport] = asyncio.Queue()
        self.in_flight = 0
        self.max_in_flight = 0
        self.fail_next = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()

    async def put(self, request: web.Request) -> web.Response:
        self.in_flight += 1
        self.entered.set()
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await self.gate.wait()
            report = fleet_contract.decode_report(await request.read())
            if self.fail_next:
                self.fail_next -= 1
                return web.Response(status=503)
            self.received.put_nowait(report)
            return web.json_response({})
        finally:
            self.in_flight -= 1


@pytest.fixture
async def plane() -> AsyncIterator[tuple[ControlPlane, str]]:
    state = ControlPlane()
    async with receiving_inventory(state.put) as url:
        yield state, url


@pytest.fixture
async def running(
    plane: tuple[ControlPlane, str],
) -> AsyncIterator[tuple[ControlPlane, ClusterView, Reporter]]:
    state, url = plane
    view = ClusterView()
    settings = ReporterSettings(url=url, cluster_id="c", interval=0.5, debounce=0.05,
                                backoff_initial=0.05, backoff_max=0.2)  # fmt: skip
    async with aiohttp.ClientSession() as session:
        reporter = Reporter(settings, view, session)
        task = asyncio.create_task(reporter.run())
        yield state, view, reporter
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_burst_of_changes_costs_one_put(
    running: tuple[ControlPlane, ClusterView, Reporter],
) -> None:
    state, view, _ = running
    for i in range(50):
        view.put_node(gpu_node(f"gpu-{i}"), deleted=False)
    report = await asyncio.wait_for(state.received.get(), timeout=5)
    assert len(report.nodes) == 50
    assert state.received.empty()
    # the control plane checks the heartbeat against how long a report vouches for capacity
    assert report.report_interval_seconds == 0.5


async def test_at_most_one_put_in_flight_and_the_newest_snapshot_wins(
    running: tuple[ControlPlane, ClusterView, Reporter],
) -> None:
    state, view, _ = running
    state.gate.clear()  # the control plane is slow
    view.put_node(gpu_node("gpu-1"), deleted=False)
    await asyncio.wait_for(state.entered.wait(), timeout=5)
    view.put_node(gpu_node("gpu-2"), deleted=False)
    view.put_node(gpu_node("gpu-3"), deleted=False)
    state.gate.set()
    first = await asyncio.wait_for(state.received.get(), timeout=5)
    second = await asyncio.wait_for(state.received.get(), timeout=5)
    assert [len(first.nodes), len(second.nodes)] == [1, 3]
    assert state.max_in_flight == 1


async def test_the_report_says_which_accelerator_each_model_asks_for_and_its_share(
    running: tuple[ControlPlane, ClusterView, Reporter],
) -> None:
    state, view, _ = running
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    view.put_node(_node("mig-1", h100, {"nvidia.com/mig-1g.10gb": "7"}), deleted=False)
    a30 = {"nvidia.com/gpu.product": "NVIDIA-A30"}
    view.put_node(_node("mig-2", a30, {"nvidia.com/mig-2g.12gb": "2"}), deleted=False)
    view.put_model(fleetmodel("slice", accelerator={"migProfile": "1g.10gb"}), deleted=False)
    view.put_model(fleetmodel("a30", accelerator={"migProfile": "2g.12gb"}), deleted=False)
    view.put_model(fleetmodel("mi300", accelerator={"vendor": "amd"}, gpusPerReplica=8),
                   deleted=False)  # fmt: skip
    view.put_model(fleetmodel("whole"), deleted=False)
    view.put_model(fleetmodel("cpu", engine="llamacpp", weightFormat="gguf", gpusPerReplica=0),
                   deleted=False)  # fmt: skip
    report = await asyncio.wait_for(state.received.get(), timeout=5)
    while len(report.deployments) < 5:  # a burst may be split across two PUTs
        report = await asyncio.wait_for(state.received.get(), timeout=5)
    got = {d.name: (d.accelerator, d.gpu_share) for d in report.deployments}
    share = fleet_contract.CardShare
    assert got == {
        "slice": ("nvidia.com/mig-1g.10gb", share(numerator=1, denominator=7)),
        "a30": ("nvidia.com/mig-2g.12gb", share(numerator=2, denominator=4)),
        "mi300": ("amd.com/gpu", None),
        "whole": ("nvidia.com/gpu", None),
        "cpu": (None, None),
    }
    slices = {s.profile: s.share for n in report.nodes for g in n.gpus for s in g.mig_slices}
    assert slices == {"1g.10gb": share(numerator=1, denominator=7),
                      "2g.12gb": share(numerator=2, denominator=4)}  # fmt: skip


async def test_failures_are_retried_with_backoff(
    running: tuple[ControlPlane, ClusterView, Reporter],
) -> None:
    state, view, reporter = running
    state.fail_next = 3
    view.put_node(gpu_node("gpu-1"), deleted=False)
    report = await asyncio.wait_for(state.received.get(), timeout=5)
    assert len(report.nodes) == 1
    assert state.fail_next == 0
    assert reporter.sent == 1


async def test_heartbeat_without_changes(
    running: tuple[ControlPlane, ClusterView, Reporter],
) -> None:
    state, _, _ = running
    first = await asyncio.wait_for(state.received.get(), timeout=5)
    second = await asyncio.wait_for(state.received.get(), timeout=5)
    assert second.observed_at > first.observed_at


async def test_an_unreachable_control_plane_is_retried_not_fatal() -> None:
    view = ClusterView()
    settings = ReporterSettings(url=f"http://127.0.0.1:{free_port()}", cluster_id="c",
                                interval=0.2, backoff_initial=0.01, backoff_max=0.02)  # fmt: skip
    async with aiohttp.ClientSession() as session:
        reporter = Reporter(settings, view, session)
        task = asyncio.create_task(reporter.run())
        view.put_node(gpu_node("g"), deleted=False)
        done, _ = await asyncio.wait({task}, timeout=0.5)
        assert not done  # still running, retrying
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert reporter.sent == 0


def test_backoff_doubles_and_is_capped() -> None:
    delays = [backoff_delay(n, initial=0.5, cap=30) for n in range(1, 10)]
    assert delays == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
