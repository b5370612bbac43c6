"""The real kubectl applies the generated CRD and a FleetModel to the API the operator watches.

On kmock, whose core-group discovery is malformed for kubectl (WORKAROUND(discovery) in
kube_emulator), kubectl is used for custom resources only, with ``--validate=false``. On the real
API server kubectl validates server-side (``--validate=strict``), so the CRD's schema and CEL
rules are enforced, and ``kubectl get fm`` shows the CRD's printer columns.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
import yaml

from fleet_serving import crd
from fleet_testing.fix_kube import KubeCluster
from fleet_testing.waiting import eventually

from .cluster import Cluster, RealCluster
from .conftest import NODES, StartOperator, fleetmodel, gpu_node

KUBECTL = shutil.which("kubectl")
pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed"),
]


async def kubectl(kubeconfig: Path, cache: Path, *args: str, ok: bool = True) -> str:
    assert KUBECTL is not None
    process = await asyncio.create_subprocess_exec(
        KUBECTL, f"--kubeconfig={kubeconfig}", f"--cache-dir={cache}", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await process.communicate()
    assert (process.returncode == 0) == ok, out.decode()
    return out.decode()


async def test_kubectl_applies_the_crd_and_a_fleetmodel(
    cluster: Cluster, tmp_path: Path, start_operator: StartOperator
) -> None:
    crd_file = tmp_path / "crd.yaml"
    crd_file.write_text(crd.render_yaml())
    cache = tmp_path / "kubectl-cache"
    validate = "--validate=strict" if cluster.real else "--validate=false"
    namespace = f"--namespace={cluster.namespace}"
    await kubectl(cluster.kubeconfig, cache, "apply", validate, "-f", str(crd_file))
    assert cluster.live("customresourcedefinitions", "fleetmodels.serving.fleet.dev")

    await cluster.create(NODES, gpu_node("gpu-1"))
    await start_operator("http://127.0.0.1:9", "--report-interval=30s")
    fm_file = tmp_path / "fm.yaml"
    model = fleetmodel("qwen", replicas=2)
    model["metadata"]["namespace"] = cluster.namespace
    fm_file.write_text(yaml.safe_dump(model))
    out = await kubectl(cluster.kubeconfig, cache, "apply", validate, namespace, "-f", str(fm_file))
    assert "fleetmodel.serving.fleet.dev/qwen" in out
    deployment = await eventually(lambda: cluster.live("deployments", "qwen"), within=20)
    assert deployment["spec"]["replicas"] == 2
    if not cluster.real:
        return
    await eventually(lambda: cluster.phase_of("qwen", "Pending"), within=20)
    table = await kubectl(cluster.kubeconfig, cache, "get", "fm", namespace)
    header, row = table.splitlines()
    assert header.split() == ["NAME", "MODEL", "ENGINE", "REPLICAS", "READY", "PHASE", "AGE"]
    assert row.split()[:6] == ["qwen", "qwen", "vllm", "2", "0", "Pending"]


async def test_the_api_server_enforces_the_crd_rules(
    fleet_crd: KubeCluster, kube_namespace: str, tmp_path: Path
) -> None:
    """The source rule (exactly one of registry, huggingFace, uri) is a CEL rule: only a real API
    server evaluates it (kmock evaluates no schema), and kubectl reports its message."""
    cluster = RealCluster(fleet_crd, kube_namespace)
    cache = tmp_path / "kubectl-cache"
    model = fleetmodel("both", source={"registry": "a", "uri": "s3://b/c"})
    model["metadata"]["namespace"] = cluster.namespace
    fm_file = tmp_path / "fm.yaml"
    fm_file.write_text(yaml.safe_dump(model))
    out = await kubectl(cluster.kubeconfig, cache, "apply", "-f", str(fm_file), ok=False)
    assert "give exactly one of registry, huggingFace or uri" in out
    model["spec"] |= {"source": {"uri": "s3://b/c"}, "modelVolume": {"cacheClaim": "cache"}}
    fm_file.write_text(yaml.safe_dump(model))
    out = await kubectl(cluster.kubeconfig, cache, "apply", "-f", str(fm_file), ok=False)
    assert "modelVolume.cacheClaim needs a registry: source" in out
    del model["spec"]["modelVolume"]
    model["spec"] |= {"source": {"uri": "s3://b/c"}, "unknownField": 1}
    fm_file.write_text(yaml.safe_dump(model))
    out = await kubectl(cluster.kubeconfig, cache, "apply", "--validate=strict", "-f",
                        str(fm_file), ok=False)  # fmt: skip
    assert 'unknown field "spec.unknownField"' in out
