"""An in-flight stream through a deleted engine pod completes, on the real node: the kubelet runs
the ``preStop`` sleep and the grace period the operator renders for ``drainSeconds``
(:mod:`fleet_serving.rollout`) before it stops the engine.

The engine is the node tests' ``testapp`` (``/stream`` writes a line a second and, like
llama-server, stops at once on SIGTERM, dropping what it was sending), in a pod carrying exactly
the rendered ``lifecycle`` and ``terminationGracePeriodSeconds``. The same pod without them (the
kubelet's defaults: SIGTERM at once) cuts the stream, so the test can tell the two apart.
"""

from __future__ import annotations

import http.client
import secrets
import time
import urllib.request
from typing import Any

import pytest

from fleet_serving import profiles, rendering
from fleet_serving.spec import decode_spec
from fleet_testing.node import KubeNode, images
from fleet_testing.waiting import eventually_blocking

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

DRAIN_S = 10
LINES = 7
"""The stream lasts about 7 s: it ends within a drain of 10 s begun after its second line."""


@pytest.fixture(scope="module")
def image(kube_node: KubeNode) -> str:
    tag, archive = images.testapp_image()
    kube_node.import_image(archive)
    return tag


def engine_pod(name: str, image: str, *, rendered: bool) -> dict[str, Any]:
    """A pod running ``image`` as the engine, with the rendered drain when ``rendered``."""
    spec = decode_spec({
        "servedModelName": "m", "source": {"uri": "s3://models/m.gguf"}, "weightFormat": "gguf",
        "engine": "llamacpp", "gpusPerReplica": 0, "drainSeconds": DRAIN_S,
    })  # fmt: skip
    owner = rendering.Owner(name=name, namespace="x", uid="u")
    pod = rendering.deployment(owner, spec, profiles.check(spec))["spec"]["template"]["spec"]
    (engine,) = pod["containers"]
    container = {
        "name": "engine",
        "image": image,
        "imagePullPolicy": "Never",
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 1},
    }
    drain: dict[str, Any] = {}
    if rendered:
        container["lifecycle"] = engine["lifecycle"]
        drain["terminationGracePeriodSeconds"] = pod["terminationGracePeriodSeconds"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [container], "automountServiceAccountToken": False, **drain},
    }


def ready_ip(node: KubeNode, path: str) -> str | None:
    status = (node.cluster.get(path) or {}).get("status") or {}
    ready = any(
        c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])
    )
    return status.get("podIP") if ready else None


def stream_through_deletion(node: KubeNode, namespace: str, pod: dict[str, Any]) -> list[str]:
    """Start the pod, open a stream, delete the pod after its second line; the lines received."""
    path = f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}"
    node.cluster.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    ip = eventually_blocking(lambda: ready_ip(node, path), within=90, what="the pod Ready")
    lines: list[str] = []
    with urllib.request.urlopen(f"http://{ip}:8080/stream?lines={LINES}", timeout=30) as answer:
        try:
            for raw in answer:
                lines.append(raw.decode().strip())
                if len(lines) == 2:
                    node.cluster.delete(path)  # graceful: the kubelet's drain starts now
        except (http.client.IncompleteRead, ConnectionError):
            pass  # the engine stopped mid-stream
    return lines


def test_a_stream_in_flight_finishes_through_the_rendered_drain(
    kube_node: KubeNode, kube_namespace: str, image: str
) -> None:
    started = time.monotonic()
    name = f"drained-{secrets.token_hex(3)}"
    lines = stream_through_deletion(kube_node, kube_namespace,
                                    engine_pod(name, image, rendered=True))  # fmt: skip
    assert lines == [f"line {i}" for i in range(LINES)] + ["done"]
    path = f"/api/v1/namespaces/{kube_namespace}/pods/{name}"
    eventually_blocking(lambda: kube_node.cluster.get(path) is None, within=DRAIN_S + 30,
                        what="the pod gone once its drain ended")  # fmt: skip
    assert time.monotonic() - started < 120


def test_without_the_drain_the_same_stream_is_cut(
    kube_node: KubeNode, kube_namespace: str, image: str
) -> None:
    name = f"undrained-{secrets.token_hex(3)}"
    lines = stream_through_deletion(kube_node, kube_namespace,
                                    engine_pod(name, image, rendered=False))  # fmt: skip
    assert "done" not in lines
    assert len(lines) < LINES
