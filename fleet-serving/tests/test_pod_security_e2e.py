"""Rendered engine pods are admitted by a real API server enforcing Pod Security ``restricted``.

The kube-apiserver's PodSecurity admission is built in and on by default; a namespace labelled
``pod-security.kubernetes.io/enforce: restricted`` has it refuse, with 403, any pod below that
level. A bare Pod made from each rendered pod template (vLLM, llama.cpp from ``s3://``, and a
``registry:`` source with its fetch init container) must be admitted: with no scheduler it stays
Pending, which is all admission needs. The same template without its securityContext must be
refused, so the test is known to fail when the hardening goes.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from fleet_serving import applying, profiles, rendering
from fleet_serving.sources import RegistryWeights
from fleet_serving.spec import decode_spec
from fleet_testing.fix_kube import KubeCluster, KubeError
from fleet_testing.waiting import eventually_blocking

from .test_rendering import REGISTRY

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

ENFORCE = "pod-security.kubernetes.io/enforce"
GGUF = {"engine": "llamacpp", "weightFormat": "gguf", "gpusPerReplica": 0}
MODELS: dict[str, tuple[dict[str, Any], RegistryWeights | None]] = {
    "vllm": ({"source": {"huggingFace": {"repo": "Qwen/Qwen3-0.6B"}},
              "weightFormat": "safetensors", "engine": "vllm"}, None),
    "llamacpp": (GGUF | {"source": {"uri": "s3://models/m.gguf"}}, None),
    "registry": (GGUF | {"source": {"registry": "gemma"}}, REGISTRY),
    "cached": (GGUF | {"source": {"registry": "gemma"},
                       "modelVolume": {"cacheClaim": "model-cache"}}, REGISTRY),
}  # fmt: skip
CLAIM = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "model-cache"},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                  "resources": {"requests": {"storage": "1Gi"}}}}  # fmt: skip


def rendered_pod(name: str, namespace: str) -> dict[str, Any]:
    """A bare Pod from the pod template of the Deployment rendered for model ``name``."""
    fields, registry = MODELS[name]
    spec = decode_spec({"servedModelName": name} | fields)
    owner = rendering.Owner(name=name, namespace=namespace, uid="uid-1")
    template = rendering.deployment(owner, spec, profiles.check(spec), registry)["spec"]["template"]
    metadata = {"name": name, "namespace": namespace, "labels": template["metadata"]["labels"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}


def unhardened(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` with every securityContext, the pod's and its containers', removed."""
    bare = copy.deepcopy(pod)
    bare["metadata"]["name"] += "-bare"
    bare["spec"].pop("securityContext")
    for container in bare["spec"]["containers"] + bare["spec"].get("initContainers", []):
        container.pop("securityContext")
    return bare


def refusal(cluster: KubeCluster, pods: str, pod: dict[str, Any], *, dry_run: bool) -> str | None:
    """The API server's 403 message for creating ``pod``, or None if it was admitted."""
    try:
        cluster.create(pods + ("?dryRun=All" if dry_run else ""), pod)
    except KubeError as exc:
        if exc.status == 403:
            return str(json.loads(exc.body)["message"])
        raise
    return None


@pytest.fixture
def restricted(kube_cluster: KubeCluster, kube_namespace: str) -> str:
    """The test's namespace, enforcing ``restricted`` once the API server's admission sees it (its
    namespace cache follows a watch: until then a pod would be judged by the old labels)."""
    labels = {ENFORCE: "restricted", f"{ENFORCE}-version": "latest"}
    kube_cluster.patch(f"/api/v1/namespaces/{kube_namespace}", {"metadata": {"labels": labels}})
    pods = f"/api/v1/namespaces/{kube_namespace}/pods"
    probe = unhardened(rendered_pod("vllm", kube_namespace))
    eventually_blocking(
        lambda: refusal(kube_cluster, pods, probe, dry_run=True),
        within=30,
        what="the namespace's restricted label enforced",
    )
    return kube_namespace


@pytest.mark.parametrize("model", sorted(MODELS))
def test_rendered_pods_are_admitted_under_restricted(
    kube_cluster: KubeCluster, restricted: str, model: str
) -> None:
    pods = f"/api/v1/namespaces/{restricted}/pods"
    pod = rendered_pod(model, restricted)
    assert len(pod["spec"].get("initContainers", [])) == (model != "vllm")
    if model == "cached":  # a PVC volume is allowed under restricted; a hostPath is not
        kube_cluster.create(f"/api/v1/namespaces/{restricted}/persistentvolumeclaims", CLAIM)
        host = copy.deepcopy(pod)
        host["metadata"]["name"] += "-host"
        host["spec"]["volumes"][1] = {"name": "model-cache", "hostPath": {"path": "/models"}}
        message = refusal(kube_cluster, pods, host, dry_run=True)
        assert message is not None, "a pod with a hostPath cache was admitted"
        assert "restricted volume types" in message, message
    assert refusal(kube_cluster, pods, pod, dry_run=False) is None
    created = kube_cluster.request("GET", f"{pods}/{model}")
    assert created["status"]["phase"] == "Pending"  # admitted; no scheduler places it
    assert created["spec"]["securityContext"]["runAsUser"] == rendering.RUN_AS
    # The server's own spelling of sizes and volumes: no drift at every resync.
    assert not applying.drifted(pod["spec"]["volumes"], created["spec"]["volumes"])

    message = refusal(kube_cluster, pods, unhardened(pod), dry_run=False)
    assert message is not None, "a pod without the securityContext was admitted"
    assert 'violates PodSecurity "restricted:latest"' in message
    for check in ("allowPrivilegeEscalation != false", "unrestricted capabilities",
                  "runAsNonRoot != true", "seccompProfile"):  # fmt: skip
        assert check in message, message
