"""The whole of Fleet on one machine, for the end-to-end test from ``kubectl apply`` to a token.

Every part is a real process, started from code and stopped by its PID: ``fleet-apiserver``
(the control plane, on the test Postgres, with a directory object store), ``fleet-serving run``
(the operator, on the real API server of :mod:`fleet_testing.fix_kube`, watching one namespace),
``fleet-gateway`` in database mode (keys and ledger in Postgres, buckets in Redis, endpoints
discovered from the control plane, the engine key from a file as the mounted Secret), and a real
node (:mod:`fleet_testing.node`: kubelet, containerd, kube-proxy, the scheduler) running the
operator's pods from imported images — the registry fetch init container (curl) and llama.cpp's
``llama-server`` (``make engine-image``). The control plane listens on the host's loopback; pods
reach it through a relay on the node's address, the URL the operator renders for them.
Credentials are issued through the control plane's API as an administrator would. Nothing of
fleet-core is imported (P7 holds here too).
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import psycopg

from fleet_testing import databases, processes, servers
from fleet_testing.bindings import binding_body, cluster_engine_key
from fleet_testing.fix_kube import KubeCluster
from fleet_testing.node import KubeNode
from fleet_testing.ports import free_port
from fleet_testing.processes import Processes, clean_env
from fleet_testing.waiting import eventually_blocking, until_answers

__all__ = ["FM_NAME", "MODEL", "Api", "Fleet", "running_fleet"]

BIN = Path(sys.executable).parent
MODEL = "gemma-3-270m"
"""The registry id and served name of the model."""
FM_NAME = "gemma"
"""The FleetModel's name (its Service's too)."""
CLUSTER = "e2e"
"""The operator's cluster id (its credential's, its binding's and its engine key's)."""
CRD = Path(__file__).resolve().parents[2] / "deploy" / "base" / "crd.yaml"
KUBECTL = shutil.which("kubectl") or "kubectl"


@dataclass(frozen=True)
class Api:
    """The control plane's HTTP API with one credential."""

    url: str
    token: str = field(repr=False)

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as exc:
            with exc:
                raise AssertionError(f"{method} {path}: {exc.code} {exc.read()!r}") from None

    def credential(self, role: str, **fields: str) -> str:
        issued = self.call("POST", "/api/v1/credentials", {"role": role, "label": role, **fields})
        return str(issued["secret"])

    def api_key(self, tenant: str) -> str:
        """A tenant, its default project and a key of it (what a client sends the gateway)."""
        self.call("POST", "/api/v1/tenants", {"id": tenant, "name": tenant})
        self.call("POST", "/api/v1/projects", {"tenantId": tenant, "name": "default"})
        issued = self.call(
            "POST", "/api/v1/keys", {"projectId": f"{tenant}/default", "label": "e2e"}
        )
        return str(issued["secret"])


def token_file(directory: Path, name: str, value: str) -> Path:
    """A secret handed over in a file (owner-only), as a mounted Secret would be."""
    path = directory / name
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def random_token() -> str:
    return secrets.token_hex(32)


@dataclass
class Fleet:
    """A running system, and what a test reads from it (kubectl, the API, the ledger, logs)."""

    cluster: KubeCluster
    namespace: str
    node: KubeNode
    procs: Processes
    admin: Api
    database_url: str
    gateway: str
    api_key: str
    engine_key: str
    kubeconfig: Path
    workdir: Path

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        argv = [
            KUBECTL,
            f"--kubeconfig={self.kubeconfig}",
            f"--namespace={self.namespace}",
            f"--cache-dir={self.workdir / 'kubectl-cache'}",
            *args,
        ]
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.gateway}/v1", api_key=self.api_key, max_retries=0, timeout=120
        )

    def fleetmodel(self) -> dict[str, Any] | None:
        path = f"/apis/serving.fleet.dev/v1alpha1/namespaces/{self.namespace}/fleetmodels/{FM_NAME}"
        return self.cluster.get(path)

    def pods(self) -> list[dict[str, Any]]:
        selector = f"labelSelector=serving.fleet.dev/model={FM_NAME}"
        path = f"/api/v1/namespaces/{self.namespace}/pods?{selector}"
        items = self.cluster.request("GET", path)["items"]
        return sorted(items, key=lambda p: str(p["metadata"]["name"]))

    def endpoints(self) -> list[str]:
        """The ready URLs the control plane gives the gateway for the model."""
        document = self.admin.call("GET", "/api/v1/endpoints")
        return sorted(
            e["url"]
            for m in document["models"]
            if m["servedModelName"] == MODEL
            for e in m["endpoints"]
            if e["ready"]
        )

    def ledger(self) -> list[dict[str, Any]]:
        with psycopg.connect(self.database_url, row_factory=psycopg.rows.dict_row) as conn:
            return conn.execute(
                "SELECT * FROM ledger WHERE served_model = %s ORDER BY received_at", (MODEL,)
            ).fetchall()

    def logs(self) -> str:
        """The tail of every process's log: the services', and each container's of each pod."""
        parts = [f"--- {name} ---\n{self.procs.log(name)[-4000:]}" for name in self.procs.started]
        for pod in self.pods():
            name, status = pod["metadata"]["name"], pod.get("status", {})
            states = [(c["name"], c.get("state"), c.get("lastState"), c.get("restartCount"))
                      for c in status.get("initContainerStatuses", [])
                      + status.get("containerStatuses", [])]  # fmt: skip
            parts.append(f"--- pod {name}: {status.get('phase')} {states}")
        for name, text in self.node.pod_logs(self.namespace).items():
            parts.append(f"--- {name} ---\n{text[-3000:]}")
        return "\n".join(parts)


def database(server: servers.Server) -> contextlib.AbstractContextManager[str]:
    return databases.scratch_database(server.url)


@contextlib.contextmanager
def namespace(cluster: KubeCluster) -> Iterator[str]:
    name = f"e2e-{random_token()[:8]}"
    cluster.create("/api/v1/namespaces", {"metadata": {"name": name}})
    eventually_blocking(
        lambda: cluster.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"), within=60
    )
    try:
        yield name
    finally:
        path = f"/apis/serving.fleet.dev/v1alpha1/namespaces/{name}/fleetmodels"
        with contextlib.suppress(Exception):
            for fm in cluster.request("GET", path)["items"]:  # the operator is gone by now
                cluster.patch(
                    f"{path}/{fm['metadata']['name']}", {"metadata": {"finalizers": None}}
                )
        cluster.delete(f"/api/v1/namespaces/{name}")
        # Its pods stop on the node before the next test (the node's own host check among them).
        eventually_blocking(
            lambda: not cluster.request("GET", f"/api/v1/namespaces/{name}/pods")["items"],
            within=90,
            what=f"the pods of {name} gone",
        )


def secret(cluster: KubeCluster, namespace: str, name: str, key: str, value: str) -> None:
    body = {"metadata": {"name": name}, "data": {key: base64.b64encode(value.encode()).decode()}}
    cluster.create(f"/api/v1/namespaces/{namespace}/secrets", body)


def start_control_plane(procs: Processes, database_url: str, admin_token: str, store: Path) -> Api:
    env = {
        "FLEET_DATABASE_URL": database_url,
        "FLEET_MODELS_DIR": str(store),
        "FLEET_ADMIN_TOKEN": admin_token,
    }
    return Api(processes.control_plane(procs, env), admin_token)


def import_model(admin: Api, gguf: Path, model_id: str = MODEL) -> None:
    """``fleet models import`` as a user without hub access: hashes, uploads, parses."""
    started = time.monotonic()
    argv = [str(BIN / "fleet"), "--api", admin.url, "models", "import", str(gguf), "--id", model_id]
    done = subprocess.run(
        argv,
        env=clean_env(FLEET_TOKEN=admin.token),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    print(f"fleet models import: {time.monotonic() - started:.1f} s")
    assert admin.call("GET", f"/api/v1/models/{model_id}")["status"] == "Ready"


def start_operator(
    procs: Processes, admin: Api, kubeconfig: Path, namespace: str, workdir: Path, pods_url: str
) -> None:
    """The operator, reporting to (and rendering for pods) the control plane at ``pods_url``."""
    credential = admin.credential("operator", clusterId=CLUSTER)
    token = token_file(workdir, "operator-token", credential)
    liveness = f"http://127.0.0.1:{free_port()}/healthz"
    argv = [
        str(BIN / "fleet-serving"),
        "run",
        f"--report-to={pods_url}",
        f"--cluster={CLUSTER}",
        f"--report-token-file={token}",
        f"--namespace={namespace}",
        f"--liveness={liveness}",
        "--log-format=plain",
        "--resync=10s",
    ]
    process = procs.start("operator", argv, clean_env(KUBECONFIG=str(kubeconfig)))
    until_answers(liveness, process, what="fleet-serving run")


def start_gateway(
    procs: Processes,
    admin: Api,
    database_url: str,
    redis_url: str,
    engine_key_file: Path,
    workdir: Path,
) -> str:
    env = {
        "FLEET_DATABASE_URL": database_url,
        "FLEET_REDIS_URL": redis_url,
        "FLEET_REDIS_PREFIX": f"e2e-{random_token()[:8]}:",
        "FLEET_CONTROL_PLANE_URL": admin.url,
        "FLEET_CONTROL_PLANE_TOKEN": admin.credential("gateway"),
        "FLEET_ENGINE_KEY_FILE": str(engine_key_file),
        "FLEET_LEDGER_SPOOL": str(workdir / "ledger-spool.jsonl"),
    }
    return processes.gateway(procs, env)


@contextlib.contextmanager
def running_fleet(
    node: KubeNode,
    postgres: servers.Server,
    redis_url: str,
    workdir: Path,
    *,
    images: list[Path],
    gguf: Path,
) -> Iterator[Fleet]:
    """Everything of Fleet running against ``node``'s cluster (``images``, archives, imported
    into the node), ``gguf`` imported as :data:`MODEL`, in a namespace of its own watched by the
    operator; all stopped (and printed logs) at the end."""
    cluster = node.cluster
    with contextlib.ExitStack() as stack:
        database_url = stack.enter_context(database(postgres))
        ns = stack.enter_context(namespace(cluster))
        apply_crd(cluster)
        for archive in images:
            node.import_image(archive)
        procs = stack.enter_context(processes.processes(workdir))
        admin = start_control_plane(procs, database_url, random_token(), workdir / "objects")
        import_model(admin, gguf)
        # ADR 0020: the gateway holds the fleet secret; the cluster's Secret holds its own key.
        fleet_secret = random_token()
        engine_key = cluster_engine_key(fleet_secret, CLUSTER)
        secret(cluster, ns, "fleet-engine-key", "api-key", engine_key)
        secret(cluster, ns, "fleet-engine-token", "token", admin.credential("engine"))
        # The cluster may serve the model from its node's pod addresses only.
        admin.call("PUT", f"/api/v1/clusters/{CLUSTER}/binding",
                   binding_body([MODEL], [node.network.pod_cidr]))  # fmt: skip
        pods_url = node.expose(int(admin.url.rsplit(":", 1)[1].rstrip("/")))
        start_operator(procs, admin, cluster.kubeconfig, ns, workdir, pods_url)
        key_file = token_file(workdir, "engine-key", fleet_secret)
        gateway = start_gateway(procs, admin, database_url, redis_url, key_file, workdir)
        fleet = Fleet(
            cluster,
            ns,
            node,
            procs,
            admin,
            database_url,
            gateway,
            admin.api_key("e2e"),
            engine_key,
            cluster.kubeconfig,
            workdir,
        )
        try:
            yield fleet
        finally:
            print(fleet.logs())  # pytest shows it when a test failed


def apply_crd(cluster: KubeCluster) -> None:
    """The FleetModel CRD as shipped, applied by kubectl with server-side validation."""
    base = [KUBECTL, f"--kubeconfig={cluster.kubeconfig}"]
    subprocess.run(
        [*base, "apply", "--server-side", "-f", str(CRD)], check=True, capture_output=True
    )
    established = [
        "wait",
        "--for=condition=Established",
        "--timeout=30s",
        "crd/fleetmodels.serving.fleet.dev",
    ]
    subprocess.run([*base, *established], check=True, capture_output=True)
