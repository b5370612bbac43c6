"""The kubelet stand-in (``fleet_testing.kubelet``) on the real API server.

A Deployment is made the way the operator makes one; the real kube-controller-manager makes its
ReplicaSet and pods, the stand-in binds and runs them as processes, and the real EndpointSlice
controller lists them. The "image" is this Python with a small HTTP server: it answers ``/health``
once it has read the file its init container wrote into the shared ``emptyDir``, and serves the
value of a Secret-sourced variable. Marked ``e2e``: it adds addresses to ``lo`` (root).
"""

from __future__ import annotations

import base64
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_testing.fix_kube import KubeCluster
from fleet_testing.kubelet import Image, Kubelet, running_kubelet
from fleet_testing.waiting import eventually_blocking

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PYTHON_IMAGE = "fleet.test/python:3.11"
SERVER = """
import http.server, os, sys, pathlib
host, port, greeting_file = sys.argv[1], int(sys.argv[2]), pathlib.Path(sys.argv[3])
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = greeting_file.exists()
        body = (greeting_file.read_text() + " " + os.environ["SECRET_WORD"]).encode() if ok else b""
        self.send_response(200 if ok else 503); self.end_headers(); self.wfile.write(body)
    def log_message(self, *args): pass
http.server.ThreadingHTTPServer((host, port), Handler).serve_forever()
"""


@pytest.fixture
def kubelet(kube_cluster: KubeCluster, kube_namespace: str, tmp_path: Path) -> Iterator[Kubelet]:
    images = {PYTHON_IMAGE: Image(entrypoint=(sys.executable,))}
    with running_kubelet(kube_cluster, [kube_namespace], images=images, workdir=tmp_path) as k:
        yield k
    assert k.errors == []


def deployment(name: str, *, replicas: int = 1, image: str = PYTHON_IMAGE,
               gpus: int = 0) -> dict[str, Any]:  # fmt: skip
    labels = {"app": name}
    mount = [{"name": "data", "mountPath": "/data"}]
    init = {"name": "write", "image": PYTHON_IMAGE, "volumeMounts": mount,
            "args": ["-c", "import sys, pathlib; pathlib.Path(sys.argv[1]).write_text('hello')",
                     "/data/greeting"]}  # fmt: skip
    probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5}
    main = {
        "name": "server", "image": image,
        "args": ["-c", SERVER, "0.0.0.0", "8080", "/data/greeting"],
        "ports": [{"name": "http", "containerPort": 8080}], "volumeMounts": mount,
        "env": [{"name": "SECRET_WORD",
                 "valueFrom": {"secretKeyRef": {"name": "word", "key": "w"}}}],
        "readinessProbe": probe, "startupProbe": probe | {"failureThreshold": 30},
    }  # fmt: skip
    if gpus:
        main["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    pod = {"initContainers": [init], "containers": [main], "automountServiceAccountToken": False,
           "volumes": [{"name": "data", "emptyDir": {}}]}  # fmt: skip
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": pod}},
    }  # fmt: skip


def setup(
    cluster: KubeCluster, namespace: str, name: str, *, secret: bool = True, **kwargs: Any
) -> None:
    """The Deployment ``name`` behind a Service of that name, and the Secret it reads (unless
    ``secret`` is false)."""
    word = {"metadata": {"name": "word"}, "data": {"w": base64.b64encode(b"world").decode()}}
    if secret and cluster.get(f"/api/v1/namespaces/{namespace}/secrets/word") is None:
        cluster.create(f"/api/v1/namespaces/{namespace}/secrets", word)
    service = {"metadata": {"name": name}, "spec": {"selector": {"app": name},
               "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}  # fmt: skip
    cluster.create(f"/api/v1/namespaces/{namespace}/services", service)
    cluster.create(f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment(name, **kwargs))


def pods(cluster: KubeCluster, namespace: str, app: str) -> list[dict[str, Any]]:
    found = cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector=app={app}")
    return sorted(found["items"], key=lambda p: str(p["metadata"]["name"]))


def ready_ips(cluster: KubeCluster, namespace: str, service: str) -> set[str]:
    path = f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
    slices = cluster.request("GET", f"{path}?labelSelector=kubernetes.io/service-name={service}")
    return {
        address
        for s in slices["items"]
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready")
        for address in e["addresses"]
    }


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return str(answer.read().decode())


def container(pod: dict[str, Any], name: str, *, init: bool = False) -> dict[str, Any]:
    key = "initContainerStatuses" if init else "containerStatuses"
    (found,) = [c for c in pod["status"].get(key) or [] if c["name"] == name]
    return dict(found)


def waiting(found: list[dict[str, Any]]) -> dict[str, Any]:
    """The waiting state of the first pod's first container ({} while it has none)."""
    statuses = found[0]["status"].get("containerStatuses") if found else None
    return dict((statuses or [{}])[0].get("state", {}).get("waiting", {}))


def serving_one(
    cluster: KubeCluster, namespace: str, kubelet: Kubelet, name: str
) -> tuple[str, dict[str, Any], subprocess.Popen[bytes]]:
    """Set up ``name`` with one replica and wait until it is ready: its address, pod and process."""
    setup(cluster, namespace, name)
    (ip,) = eventually_blocking(lambda: ready_ips(cluster, namespace, name), within=30)
    (pod,) = pods(cluster, namespace, name)
    process = kubelet.process(namespace, pod["metadata"]["name"], "server")
    assert process is not None
    return ip, pod, process


def test_pods_run_as_processes_with_their_init_containers_secrets_volumes_and_probes(
    kube_cluster: KubeCluster, kube_namespace: str, kubelet: Kubelet
) -> None:
    setup(kube_cluster, kube_namespace, "web", replicas=2)

    def both_ready() -> set[str] | None:
        ips = ready_ips(kube_cluster, kube_namespace, "web")
        return ips if len(ips) == 2 else None

    ips = eventually_blocking(both_ready, within=30)
    assert all(ip.startswith(kubelet.prefix) for ip in ips)
    for ip in ips:  # the EndpointSlice controller's address answers: the pod's own process
        assert get(f"http://{ip}:8080/") == "hello world"
    running = pods(kube_cluster, kube_namespace, "web")
    # Spread over both nodes; the init container completed before the server started.
    assert {p["spec"]["nodeName"] for p in running} == {kubelet.gpu_node, kubelet.cpu_node}
    for pod in running:
        assert pod["status"]["phase"] == "Running"
        assert container(pod, "write", init=True)["state"]["terminated"]["reason"] == "Completed"
        assert container(pod, "server")["ready"] is True
        assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"] == "True"


def test_a_killed_process_is_restarted_with_its_restart_count_and_back_in_the_endpoints(
    kube_cluster: KubeCluster, kube_namespace: str, kubelet: Kubelet
) -> None:
    ip, pod, process = serving_one(kube_cluster, kube_namespace, kubelet, "web")
    assert container(pod, "server")["containerID"] == f"process://{process.pid}"
    process.kill()
    eventually_blocking(
        lambda: not ready_ips(kube_cluster, kube_namespace, "web"), within=30
    )  # out of rotation
    restarted = eventually_blocking(lambda: (p := pods(kube_cluster, kube_namespace, "web")[0]) and
                           container(p, "server")["ready"] and p, within=30)  # fmt: skip
    status = container(restarted, "server")
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 137  # SIGKILL
    assert eventually_blocking(
        lambda: ready_ips(kube_cluster, kube_namespace, "web"), within=30
    ) == {ip}
    assert get(f"http://{ip}:8080/") == "hello world"


def test_an_unknown_image_is_image_pull_back_off(
    kube_cluster: KubeCluster, kube_namespace: str, kubelet: Kubelet
) -> None:
    setup(kube_cluster, kube_namespace, "ghost", image="registry.invalid/ghost:1")

    def pulling() -> dict[str, Any] | None:
        found = pods(kube_cluster, kube_namespace, "ghost")
        return found[0] if waiting(found).get("reason") == "ImagePullBackOff" else None

    pod = eventually_blocking(
        pulling, within=30
    )  # once its init container (a known image) has completed
    state = container(pod, "server")["state"]["waiting"]
    assert "registry.invalid/ghost:1" in state["message"]
    assert pod["status"]["phase"] == "Pending"


def test_a_missing_secret_is_create_container_config_error_until_it_exists(
    kube_cluster: KubeCluster, kube_namespace: str, kubelet: Kubelet
) -> None:
    setup(kube_cluster, kube_namespace, "web", secret=False)

    def config_error() -> dict[str, Any] | None:
        state = waiting(pods(kube_cluster, kube_namespace, "web"))
        return state if state.get("reason") == "CreateContainerConfigError" else None

    assert eventually_blocking(config_error, within=30)["message"] == 'secret "word" not found'
    setup_secret = {"metadata": {"name": "word"}, "data": {"w": base64.b64encode(b"you").decode()}}
    kube_cluster.create(f"/api/v1/namespaces/{kube_namespace}/secrets", setup_secret)
    (ip,) = eventually_blocking(lambda: ready_ips(kube_cluster, kube_namespace, "web"), within=30)
    assert get(f"http://{ip}:8080/") == "hello you"


def test_a_pod_no_node_fits_is_unschedulable_with_the_schedulers_message(
    kube_cluster: KubeCluster, kube_namespace: str, kubelet: Kubelet
) -> None:
    setup(kube_cluster, kube_namespace, "big", gpus=4)

    def unschedulable() -> dict[str, Any] | None:
        found = pods(kube_cluster, kube_namespace, "big")
        for condition in (found[0].get("status") or {}).get("conditions") or [] if found else []:
            if condition["type"] == "PodScheduled" and condition["status"] == "False":
                return dict(condition)
        return None

    condition = eventually_blocking(unschedulable, within=30)
    assert condition["reason"] == "Unschedulable"
    assert condition["message"] == "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    setup_small = deployment("small", gpus=2)
    kube_cluster.create(f"/apis/apps/v1/namespaces/{kube_namespace}/deployments", setup_small)
    small = eventually_blocking(lambda: (p := pods(kube_cluster, kube_namespace, "small")) and
                       p[0]["spec"].get("nodeName") and p[0], within=30)  # fmt: skip
    assert small["spec"]["nodeName"] == kubelet.gpu_node


def test_a_deleted_deployment_stops_its_processes_and_its_pods_go(
    kube_cluster: KubeCluster, kube_namespace: str, kubelet: Kubelet
) -> None:
    ip, _, process = serving_one(kube_cluster, kube_namespace, kubelet, "web")
    kube_cluster.request("DELETE", f"/apis/apps/v1/namespaces/{kube_namespace}/deployments/web",
                         {"propagationPolicy": "Foreground"})  # fmt: skip
    eventually_blocking(lambda: not pods(kube_cluster, kube_namespace, "web"), within=30)
    assert process.poll() is not None
    with pytest.raises(OSError, match="Connection refused"):
        get(f"http://{ip}:8080/")
