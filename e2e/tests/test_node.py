"""A real node (``fleet_testing.node``): containerd, kubelet, kube-proxy, kube-scheduler and
CoreDNS on the test control plane, in a network namespace of their own.

The image is ``e2e/node/testapp`` (one static Go program) imported into the node's containerd
from an archive; pods name it with ``imagePullPolicy: Never``. Marked ``e2e``: it needs root.
The first test takes a second node through a whole start/teardown cycle and compares the host
before and after; the session's node, when an earlier module started it, is idle by then (each
test's namespace is gone with its pods), so it changes nothing meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from fleet_serving.profiles import LLAMACPP
from fleet_testing import engines
from fleet_testing.fix_kube import KubeCluster
from fleet_testing.node import KubeNode, host, images, running_node
from fleet_testing.waiting import eventually_blocking

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

NODE_PROGRAMS = ("containerd", "containerd-shim", "kubelet", "kube-proxy", "kube-scheduler",
                 "coredns", "pause", "testapp", "runc")  # fmt: skip


@pytest.fixture(scope="module")
def image(kube_node: KubeNode) -> str:
    tag, archive = images.testapp_image()
    kube_node.import_image(archive)
    return tag


def _container(image: str, **extra: Any) -> dict[str, Any]:
    return {"name": "app", "image": image, "imagePullPolicy": "Never",
            "ports": [{"name": "http", "containerPort": 8080}], **extra}  # fmt: skip


def _pod(name: str, *containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"containers": list(containers), "terminationGracePeriodSeconds": 1,
                 "automountServiceAccountToken": False, **spec},
    }  # fmt: skip


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return str(answer.read().decode())


def _status(cluster: KubeCluster, namespace: str, name: str) -> dict[str, Any]:
    pod = cluster.get(f"/api/v1/namespaces/{namespace}/pods/{name}") or {}
    return dict(pod.get("status") or {})


def _ready(cluster: KubeCluster, namespace: str, name: str) -> dict[str, Any] | None:
    status = _status(cluster, namespace, name)
    ready = any(
        c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])
    )
    return status if ready else None


def _run(node: KubeNode, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    name = pod["metadata"]["name"]
    node.cluster.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    return eventually_blocking(
        lambda: _ready(node.cluster, namespace, name),
        within=90,
        what=lambda: f"pod {name} Ready: {_status(node.cluster, namespace, name)}\n{node.logs()}",
        interval=0.2,
    )


def _container_status(cluster: KubeCluster, namespace: str, name: str) -> dict[str, Any]:
    statuses = _status(cluster, namespace, name).get("containerStatuses") or [{}]
    return dict(statuses[0])


def test_a_node_cycle_leaves_the_host_as_it_was(kube_cluster: KubeCluster) -> None:
    before = host.snapshot(NODE_PROGRAMS)
    namespace = f"cycle-{secrets.token_hex(3)}"
    with running_node(kube_cluster) as node:
        assert host.snapshot(NODE_PROGRAMS) != before  # the snapshot sees a node
        tag, archive = images.testapp_image()
        node.import_image(archive)
        kube_cluster.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
        # on this node, not on the session's if that one runs (it has no such image imported)
        on_this_node = {"kubernetes.io/hostname": node.name}
        _run(node, namespace, _pod("cycle", _container(tag), nodeSelector=on_this_node))
    kube_cluster.delete(f"/api/v1/namespaces/{namespace}")
    # The session's node, when one runs, may be starting or stopping a container of an earlier
    # test's pod (a shim comes and goes): wait for the host to settle back, then compare.
    with contextlib.suppress(AssertionError):
        eventually_blocking(lambda: host.snapshot(NODE_PROGRAMS) == before, within=60,
                            what="the host as it was")  # fmt: skip
    assert host.snapshot(NODE_PROGRAMS) == before


def test_the_node_is_ready_with_its_own_address(kube_node: KubeNode) -> None:
    node = kube_node.cluster.request("GET", f"/api/v1/nodes/{kube_node.name}")
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.37.2"
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == kube_node.network.node_ip
    assert not node["spec"].get("taints")
    assert "Ready" in kube_node.kubectl("get", "node", kube_node.name)


def test_a_pod_runs_with_probes_logs_and_restarts(
    kube_node: KubeNode, kube_namespace: str, image: str
) -> None:
    probe = {"periodSeconds": 1, "failureThreshold": 3}
    app = _container(
        image,
        env=[{"name": "GREETING", "value": "x"}],
        startupProbe={"tcpSocket": {"port": "http"}, **probe},
        readinessProbe={"httpGet": {"path": "/healthz", "port": "http"}, **probe},
        livenessProbe={
            "exec": {"command": ["/testapp", "get", "http://127.0.0.1:8080/healthz"]},
            **probe,
        },
    )
    status = _run(kube_node, kube_namespace, _pod("web", app))
    ip = status["podIP"]
    assert ip.startswith(kube_node.network.pod_cidr.rsplit(".", 1)[0])
    assert _get(f"http://{ip}:8080/") == "hello from web\n"  # the host reaches the pod
    logs = kube_node.kubectl("logs", "-n", kube_namespace, "web")
    assert "listening on :8080 as uid 0" in logs
    assert "request GET /" in logs

    _get(f"http://{ip}:8080/exit?code=3")
    restarted = eventually_blocking(
        lambda: (s := _container_status(kube_node.cluster, kube_namespace, "web"))
        .get("restartCount") == 1 and s.get("ready") and s,
        within=60, what="the container restarted and Ready again",
    )  # fmt: skip
    assert restarted["lastState"]["terminated"]["exitCode"] == 3
    previous = kube_node.kubectl("logs", "-n", kube_namespace, "web", "--previous")
    assert "exiting with 3" in previous


def test_a_memory_limit_is_oomkilled(kube_node: KubeNode, kube_namespace: str, image: str) -> None:
    limits = {"memory": "32Mi", "cpu": "500m"}
    app = _container(image, resources={"limits": limits, "requests": limits})
    status = _run(kube_node, kube_namespace, _pod("hog", app))
    assert status["qosClass"] == "Guaranteed"
    with contextlib.suppress(OSError):  # killed mid-answer
        _get(f"http://{status['podIP']}:8080/alloc?mb=64")
    killed = eventually_blocking(
        lambda: _container_status(kube_node.cluster, kube_namespace, "hog")
        .get("lastState", {}).get("terminated"),
        within=90,
        what=lambda: f"the container killed: {_status(kube_node.cluster, kube_namespace, 'hog')}",
    )  # fmt: skip
    assert killed["reason"] == "OOMKilled", killed
    assert killed["exitCode"] == 137


def test_non_root_with_a_read_only_root(
    kube_node: KubeNode, kube_namespace: str, image: str
) -> None:
    hardened = {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]}}  # fmt: skip
    app = _container(image, securityContext=hardened,
                     volumeMounts=[{"name": "scratch", "mountPath": "/tmp"}])  # fmt: skip
    pod = _pod("locked", app, volumes=[{"name": "scratch", "emptyDir": {}}])
    ip = _run(kube_node, kube_namespace, pod)["podIP"]
    assert _get(f"http://{ip}:8080/whoami") == "uid=65532 gid=65532\n"
    assert "read-only file system" in _get(f"http://{ip}:8080/write?path=/x")
    assert _get(f"http://{ip}:8080/write?path=/tmp/x") == "written\n"

    # The image's user is root: runAsNonRoot without a user is refused by the kubelet.
    refused = _container(image, securityContext={"runAsNonRoot": True})
    kube_node.cluster.create(f"/api/v1/namespaces/{kube_namespace}/pods", _pod("root", refused))
    waiting = eventually_blocking(
        lambda: _container_status(kube_node.cluster, kube_namespace, "root")
        .get("state", {}).get("waiting", {}).get("reason") == "CreateContainerConfigError"
        and _container_status(kube_node.cluster, kube_namespace, "root")["state"]["waiting"],
        within=60, what="the root container refused",
    )  # fmt: skip
    assert "runAsNonRoot and image will run as root" in waiting["message"]


@pytest.fixture
def service(kube_node: KubeNode, kube_namespace: str, image: str) -> Iterator[dict[str, Any]]:
    """A Deployment of two pods behind a ClusterIP Service ``web`` (port 80)."""
    template = _pod("web", _container(image, readinessProbe={
        "httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 1}))  # fmt: skip
    template["metadata"].pop("name")
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": template["metadata"], "spec": template["spec"]}},
    }  # fmt: skip
    cluster = kube_node.cluster
    cluster.create(f"/apis/apps/v1/namespaces/{kube_namespace}/deployments", deployment)
    svc = cluster.create(f"/api/v1/namespaces/{kube_namespace}/services", {
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]},
    })  # fmt: skip

    def available() -> bool:
        got = cluster.get(f"/apis/apps/v1/namespaces/{kube_namespace}/deployments/web") or {}
        return bool(got.get("status", {}).get("readyReplicas") == 2)

    eventually_blocking(available, within=90, what=lambda: f"2 ready replicas\n{kube_node.logs()}")
    return svc


def test_a_cluster_ip_answers_through_kube_proxy(service: dict[str, Any]) -> None:
    url = f"http://{service['spec']['clusterIP']}/"
    seen: set[str] = set()

    def both_pods_answered() -> bool:
        with contextlib.suppress(OSError):
            seen.add(_get(url))
        return len(seen) == 2

    eventually_blocking(both_pods_answered, within=60, what=lambda: f"both pods; saw {seen}")
    assert all(answer.startswith("hello from web-") for answer in seen)


def test_cluster_dns_resolves_a_service(
    kube_node: KubeNode, kube_namespace: str, service: dict[str, Any], image: str
) -> None:
    _run(kube_node, kube_namespace, _pod("client", _container(image)))
    name = f"web.{kube_namespace}.svc.cluster.local"
    answer = kube_node.kubectl("exec", "-n", kube_namespace, "client", "--",
                               "/testapp", "lookup", name)  # fmt: skip
    assert answer.split() == [service["spec"]["clusterIP"]]
    through_dns = kube_node.kubectl("exec", "-n", kube_namespace, "client", "--",
                                    "/testapp", "get", "http://web/")  # fmt: skip
    assert through_dns.startswith("hello from web-")


def test_the_engine_image_serves_a_model_as_non_root(
    kube_node: KubeNode, kube_namespace: str
) -> None:
    kube_node.import_image(engines.engine_image_archive())
    model = engines.gemma_gguf()
    engine = {
        "name": "engine",
        "image": LLAMACPP.image,
        "imagePullPolicy": "Never",
        "args": ["--model", f"/models/{model.name}", "--host", "0.0.0.0", "--port", "8080",
                 "--threads", "1", "--ctx-size", "512", "--no-webui"],
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1},
        "securityContext": {"runAsNonRoot": True, "readOnlyRootFilesystem": True,
                            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
    }  # fmt: skip
    volumes = [{"name": "models", "hostPath": {"path": str(model.parent), "type": "Directory"}}]
    status = _run(kube_node, kube_namespace, _pod("engine", engine, volumes=volumes))
    models = json.loads(_get(f"http://{status['podIP']}:8080/v1/models"))
    assert [m["id"] for m in models["data"]] == [f"/models/{model.name}"]
