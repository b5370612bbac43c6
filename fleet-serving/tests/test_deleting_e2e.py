"""Deleting a FleetModel never waits for the operator, and the resync still corrects drift.

The operator puts no finalizer on a FleetModel: what it made carries owner references, so the real
garbage collector (kube-controller-manager) removes it with the model, operator or not. The
finalizer an earlier release put on every model (``serving.fleet.dev/resync``) is removed by the
operator when it sees it, deleted or not. These run on a real API server, whose deletion and
garbage collection they test; the resync's isolation of a failing model runs on kmock too.
"""

from __future__ import annotations

import asyncio

import pytest

from fleet_testing.waiting import eventually

from .cluster import Cluster, RealCluster
from .conftest import DEPLOYMENTS, FM, NODES, SERVICES, Sink, StartOperator, fleetmodel, gpu_node
from .test_applying_e2e import foreign_service

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

OLD_FINALIZER = "serving.fleet.dev/resync"


async def test_a_delete_completes_with_the_operator_stopped(
    real_cluster: RealCluster, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    cluster = real_cluster
    await cluster.create(NODES, gpu_node("gpu-1"))
    operator = await start_operator(sink[1], "--resync=1s", "--report-interval=30s")
    await cluster.create(FM, fleetmodel("qwen"))
    await eventually(lambda: cluster.live("deployments", "qwen"), within=20)
    await eventually(lambda: cluster.live("services", "qwen"), within=20)
    await eventually(lambda: cluster.phase_of("qwen", "Pending"), within=20)
    await asyncio.sleep(2)  # a resync pass or two, had one wanted a finalizer
    fm = cluster.live("fleetmodels", "qwen")
    assert fm is not None
    assert fm["metadata"].get("finalizers") is None

    operator.process.kill()  # down, as after a crash or while it is being upgraded
    await operator.process.wait()
    await cluster.delete(f"{FM}/qwen")
    # At once: nothing holds the object for an operator that is not there.
    await eventually(lambda: cluster.live("fleetmodels", "qwen") is None, within=3)
    # A real garbage collector learns a new CRD's kind at its next discovery (every 30 s), so
    # the first cascade of a session can take that long.
    await eventually(lambda: cluster.live("deployments", "qwen") is None, within=60)
    await eventually(lambda: cluster.live("services", "qwen") is None, within=60)


async def test_the_operator_removes_the_finalizer_of_an_earlier_release(
    real_cluster: RealCluster, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    cluster = real_cluster
    await cluster.create(NODES, gpu_node("gpu-1"))
    for name in ("kept", "doomed"):
        model = fleetmodel(name)
        model["metadata"]["finalizers"] = [OLD_FINALIZER]
        await cluster.create(FM, model)
    await cluster.delete(f"{FM}/doomed")
    doomed = cluster.live("fleetmodels", "doomed")
    assert doomed is not None  # held by the old finalizer, as a delete was before an upgrade
    assert doomed["metadata"]["deletionTimestamp"]

    await start_operator(sink[1], "--resync=1s", "--report-interval=30s")
    await eventually(lambda: cluster.live("fleetmodels", "doomed") is None, within=20)
    await eventually(
        lambda: (
            (fm := cluster.live("fleetmodels", "kept")) and not fm["metadata"].get("finalizers")
        ),
        within=20,
    )
    # The model it let go of is still reconciled, and deleting it now waits for nothing.
    await eventually(lambda: cluster.live("deployments", "kept"), within=20)
    await cluster.delete(f"{FM}/kept")
    await eventually(lambda: cluster.live("fleetmodels", "kept") is None, within=3)


async def test_a_model_that_fails_to_reconcile_does_not_stop_the_resync(
    cluster: Cluster, sink: tuple[Sink, str], start_operator: StartOperator
) -> None:
    await cluster.create(SERVICES, foreign_service("blocked"))
    await cluster.create(NODES, gpu_node("gpu-1"))
    operator = await start_operator(sink[1], "--resync=1s", "--report-interval=30s")
    await cluster.create(FM, fleetmodel("blocked"))  # first in the resync's order
    await eventually(lambda: cluster.phase_of("blocked", "Failed"), within=20)
    await cluster.create(FM, fleetmodel("qwen"))
    await eventually(lambda: cluster.live("deployments", "qwen"), within=20)

    failing = f"[{cluster.namespace}/blocked] Resync failed"
    await eventually(lambda: failing in operator.output(), within=20)
    # The create handler is done with qwen: only the resync puts a hand edit back.
    drift = {"spec": {"template": {"spec": {"containers": [{"name": "engine", "image": "evil"}]}}}}
    await cluster.patch(f"{DEPLOYMENTS}/qwen", drift)
    await eventually(
        lambda: (
            (d := cluster.live("deployments", "qwen"))
            and d["spec"]["template"]["spec"]["containers"][0]["image"].startswith("vllm/")
        ),
        within=20,
    )
    # and it goes on failing, pass after pass
    await eventually(lambda: operator.output().count(failing) >= 2, within=20)
    assert operator.process.returncode is None
