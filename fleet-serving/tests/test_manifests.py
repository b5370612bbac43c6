"""The CRD is generated from the code, and deploy/ builds with kustomize."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet_serving import crd, rendering
from fleet_serving.applying import drifted

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBECTL = shutil.which("kubectl")


def test_committed_crd_matches_the_code() -> None:
    committed = (DEPLOY / "base" / "crd.yaml").read_text()
    assert committed == crd.render_yaml(), (
        "deploy/base/crd.yaml is stale: run `python -m fleet_serving.crd > deploy/base/crd.yaml`"
    )


def walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, schema)]
    for name, sub in (schema.get("properties") or {}).items():
        found += walk(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += walk(schema[key], f"{path}[{key}]")
    return found


def test_the_crd_schema_is_structural_with_validation_and_columns() -> None:
    manifest = crd.crd_manifest()
    (version,) = manifest["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    for path, node in walk(schema):
        assert "type" in node, f"{path} has no type (not structural)"
        assert not {"$ref", "anyOf", "title", "$defs"} & node.keys(), path
    spec = schema["properties"]["spec"]
    assert spec["required"] == ["servedModelName", "source", "weightFormat", "engine"]
    assert spec["properties"]["engine"]["enum"] == ["llamacpp", "vllm"]
    assert spec["properties"]["weightFormat"]["enum"] == ["gguf", "safetensors"]
    assert spec["properties"]["replicas"]["minimum"] == 0
    assert schema["properties"]["status"]["properties"]["phase"]["enum"] == [
        "Failed", "Pending", "Ready", "Scheduling"]  # fmt: skip
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Model", "Engine", "Replicas", "Ready", "Phase", "Age"]  # fmt: skip
    assert manifest["spec"]["names"]["shortNames"] == ["fm"]
    assert manifest["spec"]["scope"] == "Namespaced"


def kustomize(path: Path) -> list[dict[str, Any]]:
    if KUBECTL is None:
        pytest.fail("kubectl (with kustomize) is needed to check deploy/")
    out = subprocess.run([KUBECTL, "kustomize", str(path)], capture_output=True, text=True,
                         check=True, timeout=60).stdout  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.mark.parametrize("where", ["base", "overlays/k3s"])
def test_kustomize_builds(where: str) -> None:
    objects = kustomize(DEPLOY / where)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert ("CustomResourceDefinition", "fleetmodels.serving.fleet.dev") in kinds
    for name in ("fleet-serving", "fleet-apiserver", "fleet-gateway"):
        assert ("Deployment", name) in kinds
    assert ("Service", "fleet-gateway") in kinds
    assert ("Service", "fleet-apiserver") in kinds
    assert ("ClusterRole", "fleet-serving") in kinds
    (built_crd,) = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    assert not drifted(crd.crd_manifest()["spec"], built_crd["spec"])
    gateway = next(o for o in objects if o["kind"] == "Deployment" and
                   o["metadata"]["name"] == "fleet-gateway")  # fmt: skip
    assert gateway["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] == "true"


def test_rbac_grants_only_what_the_operator_uses() -> None:
    (role,) = [o for o in kustomize(DEPLOY / "base") if o["kind"] == "ClusterRole"]
    grants = {(g, r): set(rule["verbs"]) for rule in role["rules"]
              for g in rule["apiGroups"] for r in rule["resources"]}  # fmt: skip
    assert "secrets" not in {r for _, r in grants}
    assert grants[("", "nodes")] == {"list", "watch"}
    assert grants[("apps", "deployments")] == {"get", "list", "watch", "create", "patch"}
    assert "delete" not in set().union(*grants.values())  # ownerReferences do the deleting
    # blockOwnerDeletion under OwnerReferencesPermissionEnforcement needs this.
    assert grants[("serving.fleet.dev", "fleetmodels/finalizers")] == {"update"}


def test_k3s_overlay_changes_what_it_says() -> None:
    objects = kustomize(DEPLOY / "overlays" / "k3s")
    gateway = next(o for o in objects if o["metadata"]["name"] == "fleet-gateway" and
                   o["kind"] == "Deployment")  # fmt: skip
    assert gateway["spec"]["replicas"] == 1
    assert any(o["kind"] == "Ingress" for o in objects)


def test_drift_is_a_subset_comparison() -> None:
    desired = {"spec": {"replicas": 2, "template": {"containers": [{"image": "a"}]}}}
    defaulted = {"spec": {"replicas": 2, "paused": False,
                          "template": {"containers": [{"image": "a", "tty": False}]}}}  # fmt: skip
    assert not drifted(desired, defaulted)
    assert drifted(desired, {"spec": {"replicas": 3, "template": {"containers": [{"image": "a"}]}}})
    assert drifted(desired, {"spec": {"replicas": 2, "template": {"containers": []}}})
    assert drifted(desired, {})
    assert not drifted({"spec": {"tolerations": [], "nodeSelector": {}}}, {"spec": {}})


def deployment_of(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == name
    )
    return found


@pytest.mark.parametrize("where", ["base", "overlays/k3s"])
def test_deploy_is_closed_by_default(where: str) -> None:
    """No Secret ships with a value; the gateway requires auth (an env entry, which wins over
    the fleet-core Secret's envFrom); each component reads its credential from a Secret of its
    own that must exist (not optional), so a missing one stops the pod instead of opening it."""
    objects = kustomize(DEPLOY / where)
    assert not [o for o in objects if o["kind"] == "Secret"]
    gateway = deployment_of(objects, "fleet-gateway")["spec"]["template"]["spec"]
    env = {e["name"]: e for e in gateway["containers"][0]["env"]}
    assert env["FLEET_AUTH_REQUIRED"]["value"] == "true"
    assert env["FLEET_CONTROL_PLANE_TOKEN_FILE"]["value"].startswith("/var/run/secrets/fleet/")
    wanted = {
        "fleet-apiserver": "fleet-admin-token",
        "fleet-gateway": "fleet-gateway-token",
        "fleet-serving": "fleet-operator-token",
    }
    for name, secret in wanted.items():
        pod = deployment_of(objects, name)["spec"]["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == secret]
        assert not volume["secret"].get("optional", False)
        assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]
    # ADR 0010: the engine key, mounted read-only, is the file FLEET_ENGINE_KEY_FILE names.
    (volume,) = [v for v in gateway["volumes"] if v.get("secret", {}).get("secretName") ==
                 "fleet-engine-key"]  # fmt: skip
    assert not volume["secret"].get("optional", False)
    (mount,) = [m for m in gateway["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    assert env["FLEET_ENGINE_KEY_FILE"]["value"] == mount["mountPath"] + "/api-key"
    operator = deployment_of(objects, "fleet-serving")["spec"]["template"]["spec"]
    args = operator["containers"][0]["args"]
    assert "--report-token-file=/var/run/secrets/fleet/operator/token" in args


def test_network_policies_admit_only_the_gateway_and_the_operator() -> None:
    """Their selectors are the labels the Deployments and the operator's renderer set."""
    objects = kustomize(DEPLOY / "base")
    policies = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "NetworkPolicy"}
    control = policies["fleet-apiserver"]
    apiserver = deployment_of(objects, "fleet-apiserver")["spec"]["template"]["metadata"]
    assert control["podSelector"]["matchLabels"].items() <= apiserver["labels"].items()
    (rule,) = control["ingress"]
    sources = [peer["podSelector"]["matchLabels"] for peer in rule["from"]]
    for name in ("fleet-gateway", "fleet-serving"):
        labels = deployment_of(objects, name)["spec"]["template"]["metadata"]["labels"]
        assert any(s.items() <= labels.items() for s in sources), name
    engine_labels = rendering.common_labels("m")
    assert any(s.items() <= engine_labels.items() for s in sources)  # registry weight downloads
    assert rule["ports"] == [{"port": 8081, "protocol": "TCP"}]
    engines = policies["fleet-engines"]
    # A pod label is self-assignable: no peer may be admitted by a pod label alone, from any
    # namespace; each names the namespaces it may come from.
    for peer in rule["from"]:
        assert peer.get("namespaceSelector", {}).get("matchLabels"), peer
    fleet_system = {"kubernetes.io/metadata.name": "fleet-system"}
    by_namespace = {
        tuple(sorted(p["podSelector"]["matchLabels"].items())): p["namespaceSelector"][
            "matchLabels"
        ]
        for p in rule["from"]
    }
    assert sorted(by_namespace.values(), key=str) == sorted(
        [fleet_system, fleet_system, {"serving.fleet.dev/models": "true"}], key=str
    )
    assert engines["podSelector"]["matchLabels"].items() <= engine_labels.items()
    (only,) = engines["ingress"]
    (peer,) = only["from"]
    gateway = deployment_of(objects, "fleet-gateway")["spec"]["template"]["metadata"]["labels"]
    assert peer["podSelector"]["matchLabels"].items() <= gateway.items()
    assert peer["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "fleet-system"
    }
