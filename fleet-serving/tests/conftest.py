"""Fixtures for the operator's tests: a Kubernetes API, an inventory sink, the operator.

The operator runs as a real ``fleet-serving run`` process, pointed by a kubeconfig at kmock on
loopback or, through the ``cluster`` fixture, at a real API server as well (each end-to-end test
written against ``cluster`` runs on both); it reports to a loopback HTTP server that decodes
every PUT with fleet_contract.
Workarounds for kmock's gaps live in :mod:`kube_emulator` and are named there.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import pytest
import yaml
from aiohttp import web

import fleet_contract
from fleet_contract import InventoryReport
from fleet_serving import crd
from fleet_testing import plugins
from fleet_testing.fix_kube import KubeCluster
from fleet_testing.ports import free_port
from fleet_testing.waiting import eventually

from .cluster import Cluster, KmockCluster, RealCluster
from .kube_emulator import FleetKubernetes, declare_resources

KUBECTL = shutil.which("kubectl")


def pytest_configure(config: pytest.Config) -> None:
    """The harness fixtures these tests use (see :mod:`fleet_testing.plugins`)."""
    plugins.load(config, "fix_auth", "fix_postgres", "fix_s3", "fix_kube")


@pytest.fixture
async def kube() -> AsyncIterator[FleetKubernetes]:
    """kmock's Kubernetes emulator on a loopback port, with our resources declared."""
    async with FleetKubernetes() as k, kmock.Server(k):
        declare_resources(k)
        yield k


@pytest.fixture
def kube_url(kube: FleetKubernetes) -> str:
    return str(kube.servers[0].url).rstrip("/")


@pytest.fixture
def kubeconfig(tmp_path: Path, kube_url: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kmock", "cluster": {"server": kube_url}}],
        "users": [{"name": "test", "user": {"token": "test-token"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test"}}],
        "current-context": "kmock",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


class Sink:
    """A stand-in control plane: accepts PUT /api/v1/inventory, decoding with the contract."""

    def __init__(self) -> None:
        self.reports: list[InventoryReport] = []
        self.failures = 0
        """Answer the next this-many PUTs with 503, to exercise retries."""

    async def put(self, request: web.Request) -> web.Response:
        body = await request.read()
        report = fleet_contract.decode_report(body)  # raises (→ 500) on a contract violation
        if self.failures:
            self.failures -= 1
            return web.json_response({"error": {"message": "down"}}, status=503)
        self.reports.append(report)
        return web.json_response({"ok": True})

    def latest(self) -> InventoryReport | None:
        return self.reports[-1] if self.reports else None


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` on a free loopback port for the block; its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def receiving_inventory(
    put: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> AsyncIterator[str]:
    """A control plane answering only ``PUT /api/v1/inventory``, with ``put``; its base URL."""
    app = web.Application()
    app.router.add_put("/api/v1/inventory", put)
    async with serving(app) as url:
        yield url


@pytest.fixture
async def sink() -> AsyncIterator[tuple[Sink, str]]:
    state = Sink()
    async with receiving_inventory(state.put) as url:
        yield state, url


async def issue_credential(control_plane: str, admin_token: str, body: dict[str, str]) -> str:
    """``POST /api/v1/credentials`` as the admin; the new credential's secret."""
    headers = {"Authorization": f"Bearer {admin_token}"}
    async with (
        aiohttp.ClientSession(headers=headers) as session,
        session.post(f"{control_plane}/api/v1/credentials", json=body) as response,
    ):
        assert response.status == 201, await response.text()
        return str((await response.json())["secret"])


class Operator:
    """A running ``fleet-serving run`` process."""

    def __init__(self, process: asyncio.subprocess.Process, log: Path, liveness: str) -> None:
        self.process = process
        self.log = log
        self.liveness = liveness

    def output(self) -> str:
        return self.log.read_text(errors="replace")


StartOperator = Callable[..., Awaitable[Operator]]


@pytest.fixture
async def start_operator(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[StartOperator]:
    """Start the operator process against the test's API (the ``cluster`` if the test uses one,
    else kmock); stops it (SIGTERM) at teardown."""
    started: list[Operator] = []
    scope: list[str] = []
    chosen = [name for name in ("cluster", "real_cluster") if name in request.fixturenames]
    if chosen:
        target: Cluster = request.getfixturevalue(chosen[0])
        kubeconfig = target.kubeconfig
        scope = [f"--namespace={target.namespace}"] if target.real else []
    else:
        kubeconfig = request.getfixturevalue("kubeconfig")

    async def start(
        report_to: str,
        *extra: str,
        token: str = "stand-in-token",
        credentials: Path | None = None,
        scoped: bool = True,
    ) -> Operator:
        """``token``: the operator credential, handed over in a file as a Secret would be;
        ``credentials``: a kubeconfig of the operator's own (its ServiceAccount), instead of the
        admin's; ``scoped=False``: cluster-wide even on the real API server."""
        port = free_port()
        liveness = f"http://127.0.0.1:{port}/healthz"
        log = tmp_path / f"operator-{len(started)}.log"
        token_file = tmp_path / f"operator-{len(started)}.token"
        token_file.write_text(token + "\n")
        argv = [sys.executable, "-m", "fleet_serving", "run", f"--report-to={report_to}"]
        argv += ["--cluster=test", f"--liveness={liveness}", "--log-format=plain"]
        argv += [f"--report-token-file={token_file}", *(scope if scoped else []), *extra]
        env = os.environ | {"KUBECONFIG": str(credentials or kubeconfig)}
        with log.open("wb") as out:
            process = await asyncio.create_subprocess_exec(
                *argv, stdout=out, stderr=subprocess.STDOUT, env=env
            )
        operator = Operator(process, log, liveness)
        started.append(operator)
        await _wait_alive(operator)
        return operator

    yield start
    for operator in started:
        with contextlib.suppress(ProcessLookupError):  # it may have exited already
            operator.process.terminate()
    for operator in started:
        try:  # kopf's graceful stop waits for handlers; the tests need not
            await asyncio.wait_for(operator.process.wait(), timeout=3)
        except TimeoutError:
            operator.process.kill()
            await operator.process.wait()
        print(
            f"--- operator log ({operator.log.name}) ---\n{operator.output()}"
        )  # shown on failure


async def _wait_alive(operator: Operator, *, within: float = 60.0) -> None:
    """Poll the liveness endpoint; a loaded 2-core machine can take tens of seconds to import."""
    async with aiohttp.ClientSession() as session:

        async def alive() -> bool:
            if operator.process.returncode is not None:
                raise AssertionError(f"operator exited:\n{operator.output()}")
            try:
                async with session.get(operator.liveness) as response:
                    return response.status == 200
            except aiohttp.ClientError:
                return False

        await eventually(alive, within=within, what=f"the operator alive at {operator.liveness}")


class KubeApi:
    """A plain HTTP client for the fake API, playing kubectl and the cluster's controllers."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base

    async def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        async with self.session.post(self.base + path, json=obj) as response:
            assert response.status < 300, await response.text()
            return dict(await response.json())

    async def patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/merge-patch+json"}
        async with self.session.patch(self.base + path, json=patch, headers=headers) as response:
            assert response.status < 300, await response.text()
            return dict(await response.json())

    async def delete(self, path: str) -> None:
        async with self.session.delete(self.base + path) as response:
            assert response.status < 300, await response.text()


@pytest.fixture
async def kube_api(kube_url: str) -> AsyncIterator[KubeApi]:
    async with aiohttp.ClientSession() as session:
        yield KubeApi(session, kube_url)


def live(kube: FleetKubernetes, plural: str, name: str) -> dict[str, Any] | None:
    """An object in kmock by plural and name (any namespace), unless deleted."""
    for (resource, _ns, obj_name), obj in kube.objects.items():
        if obj_name == name and resource.plural == plural and not obj.deleted:
            return dict(obj.raw)
    return None


def phase_of(kube: FleetKubernetes, name: str, phase: str) -> dict[str, Any] | None:
    obj = live(kube, "fleetmodels", name)
    status = (obj or {}).get("status") or {}
    return status if status.get("phase") == phase else None


FM = "/apis/serving.fleet.dev/v1alpha1/namespaces/default/fleetmodels"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
SERVICES = "/api/v1/namespaces/default/services"
PDBS = "/apis/policy/v1/namespaces/default/poddisruptionbudgets"
SLICES = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"
PODS = "/api/v1/namespaces/default/pods"
NODES = "/api/v1/nodes"


def fleetmodel(name: str, **spec: Any) -> dict[str, Any]:
    """A FleetModel object (camelCase spec) with sensible defaults for tests."""
    base: dict[str, Any] = {
        "servedModelName": name,
        "source": {"huggingFace": {"repo": "Qwen/Qwen3-0.6B"}},
        "weightFormat": "safetensors",
        "engine": "vllm",
        "replicas": 1,
        "gpusPerReplica": 1,
    }
    return {
        "apiVersion": "serving.fleet.dev/v1alpha1",
        "kind": "FleetModel",
        "metadata": {"name": name, "namespace": "default"},
        "spec": base | spec,
    }


def gpu_node(name: str, *, gpus: int = 8, major: int = 8, minor: int = 0) -> dict[str, Any]:
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/gpu.compute.major": str(major),
        "nvidia.com/gpu.compute.minor": str(minor),
        "topology.kubernetes.io/zone": "eu-west-1a",
    }
    return _node(name, labels, {"nvidia.com/gpu": str(gpus), "cpu": "64"})


def cpu_node(name: str) -> dict[str, Any]:
    return _node(name, {"node.kubernetes.io/instance-type": "c6i.large"}, {"cpu": "2"})


def _node(name: str, labels: dict[str, str], allocatable: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {
            "capacity": allocatable,
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


@pytest.fixture(scope="session")
def fleet_crd(kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> KubeCluster:
    """The FleetModel CRD, applied once to the real API server by the real kubectl with
    server-side field validation (so its schema and CEL rules are the server's), Established."""
    assert KUBECTL is not None, "kubectl is needed to apply the CRD to the real API server"
    crd_file = tmp_path_factory.mktemp("crd") / "crd.yaml"
    crd_file.write_text(crd.render_yaml())
    base = [KUBECTL, f"--kubeconfig={kube_cluster.kubeconfig}"]
    apply = [*base, "apply", "--server-side", "--validate=strict", "-f", str(crd_file)]
    subprocess.run(apply, check=True, capture_output=True)
    established = "--for=condition=Established"
    wait = [*base, "wait", established, "--timeout=30s", "crd/fleetmodels.serving.fleet.dev"]
    subprocess.run(wait, check=True, capture_output=True)
    return kube_cluster


@pytest.fixture
def account_namespace(kube_cluster: KubeCluster) -> Iterator[str]:
    """A second namespace of the test's own on the real API server, standing for
    ``fleet-system``: where the operator's ServiceAccount lives (``shipped_rbac``)."""
    name = f"s-{secrets.token_hex(4)}"
    kube_cluster.create("/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    kube_cluster.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture(params=["kmock", "real"])
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The API an end-to-end test runs against: kmock, then a real API server."""
    if request.param == "kmock":
        kube = request.getfixturevalue("kube")
        kube_api = request.getfixturevalue("kube_api")
        yield KmockCluster(kube, kube_api, request.getfixturevalue("kubeconfig"))
        return
    yield request.getfixturevalue("real_cluster")


@pytest.fixture
def real_cluster(fleet_crd: KubeCluster, kube_namespace: str) -> Iterator[RealCluster]:
    """The real API server (with the CRD), in a namespace of the test's own."""
    real = RealCluster(fleet_crd, kube_namespace)
    yield real
    real.clean()
