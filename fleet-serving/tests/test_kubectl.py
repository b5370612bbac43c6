"""The real kubectl applies the generated CRD and a FleetModel to the API the operator watches.

kmock's core-group discovery is malformed for kubectl (WORKAROUND(discovery) in kube_emulator),
so kubectl is used for custom resources only, with ``--validate=false``.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
import yaml

from fleet_serving import crd

from .conftest import NODES, Api, StartOperator, eventually, fleetmodel, gpu_node
from .kube_emulator import FleetKubernetes
from .test_operator_e2e import live

KUBECTL = shutil.which("kubectl")
pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed"),
]


async def kubectl(kubeconfig: Path, cache: Path, *args: str) -> str:
    assert KUBECTL is not None
    process = await asyncio.create_subprocess_exec(
        KUBECTL, f"--kubeconfig={kubeconfig}", f"--cache-dir={cache}", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await process.communicate()
    assert process.returncode == 0, out.decode()
    return out.decode()


async def test_kubectl_applies_the_crd_and_a_fleetmodel(
    kube: FleetKubernetes,
    api: Api,
    kubeconfig: Path,
    tmp_path: Path,
    start_operator: StartOperator,
) -> None:
    crd_file = tmp_path / "crd.yaml"
    crd_file.write_text(crd.render_yaml())
    cache = tmp_path / "kubectl-cache"
    await kubectl(kubeconfig, cache, "apply", "--validate=false", "-f", str(crd_file))
    assert live(kube, "customresourcedefinitions", "fleetmodels.serving.fleet.dev")

    await api.create(NODES, gpu_node("gpu-1"))
    await start_operator("http://127.0.0.1:9", "--report-interval=30s")
    fm_file = tmp_path / "fm.yaml"
    fm_file.write_text(yaml.safe_dump(fleetmodel("qwen", replicas=2)))
    out = await kubectl(kubeconfig, cache, "apply", "--validate=false", "-f", str(fm_file))
    assert "fleetmodel.serving.fleet.dev/qwen" in out
    deployment = await eventually(lambda: live(kube, "deployments", "qwen"))
    assert deployment["spec"]["replicas"] == 2
